"""Adversarial clients (config section ``attack``, docs/algorithms.md
"Networks"): a fixed share of clients send poisoned models instead of
their trained ones, every round, to peers and servers alike.

- The attackers: the ``ceil(fraction · n)`` clients of lowest key
  ``rng.uniform(seed, 0, "attackers", client)``, fixed for the run and the
  same on every process.
- ``sign_flip``: an attacker sends its update reversed,
  ``start − scale · (trained − start)``.
- ``gaussian``: it sends its trained model plus Gaussian noise of standard
  deviation ``scale``, drawn from a generator seeded by (seed, round,
  client).
- ``label_flip``: it trains on flipped labels (``K − 1 − y``) and sends what
  it trained.

A ``sign_flip`` or ``gaussian`` attacker keeps the model it trained and
takes in nothing (the runner puts that model back after the aggregation):
what it holds stays an honest local model, so what it sends stays finite.
One that kept its poison ascended its own loss until its models were
non-finite within 7 to 17 rounds on Fashion-MNIST.  A ``label_flip``
attacker takes part as any client, on its flipped labels.  An attacker's
accuracy is not the honest clients', which the metrics report apart
(``honest_accuracy``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from fedclust import rng


def attackers(seed: int, n: int, fraction: float) -> torch.Tensor | None:
    """Bool ``[n]`` (CPU): the run's attackers; None when there are none."""
    if fraction <= 0:
        return None
    count = math.ceil(fraction * n - 1e-9)
    keys = rng.uniform(seed, 0, "attackers", torch.arange(n), 0)
    out = torch.zeros(n, dtype=torch.bool)
    out[torch.argsort(keys, stable=True)[:count]] = True
    return out


def flip_labels(y: torch.Tensor, rows: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``y`` [C, N] with the rows where ``rows`` (bool [C]) holds flipped to ``K − 1 − y`` (a copy)."""
    return torch.where(rows.to(y.device)[:, None], num_classes - 1 - y, y)


def poison_(flat: torch.Tensor, start: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, spec: Any, seed: int,
            round_: int) -> None:
    """Replace the trained models ``flat[rows]`` by what the attackers send (in place): ``start`` holds those
    rows' models before training (``[len(rows), P]``), ``ids`` their global ids.  ``label_flip`` sends the trained
    model (its poison is in the labels)."""
    if spec.kind == "label_flip" or not len(rows):
        return
    trained = flat[rows]
    if spec.kind == "sign_flip":
        flat[rows] = start - spec.scale * (trained - start)
        return
    noise = torch.empty_like(trained)
    for r, client in enumerate(ids.tolist()):   # the attackers only: a generator keyed on (seed, round, client)
        g = torch.Generator().manual_seed(int(rng.hash_ints(seed, round_, "gaussian_attack", torch.tensor(client), 0)))
        noise[r] = torch.randn(trained.shape[1], generator=g, dtype=trained.dtype).to(trained.device)
    flat[rows] = trained + spec.scale * noise
