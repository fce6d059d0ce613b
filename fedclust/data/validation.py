"""A validation split carved from each client's training examples, for an
algorithm that picks among models on data it did not train on (CFL's
best-of-lineage choice, docs/algorithms.md "CFL").

As the CFL reference code's ``Client`` (``train_frac=0.8``,
``torch.utils.data.random_split``): a uniform random ``floor(m·(1 − share))``
of a client's ``m`` examples train, the other ``m − floor(m·(1 − share))``
validate.  The draw is keyed on (seed, client) only (:mod:`fedclust.rng`),
so every process carves the same split of a client; each part keeps the
examples in their original order.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from fedclust import rng
from fedclust.data.base import FederatedData, StoredInputs
from fedclust.errors import ConfigError

STREAM = "validation"   # rng stream of the carve (round 0: drawn once, before training)


def train_part(m: torch.Tensor | int, share: float) -> torch.Tensor:
    """Examples each client keeps for training out of ``m``: ``floor(m·(1 −
    share))`` as the reference code's ``int(len(data)·train_frac)`` (a
    1e-9 guard so that 200·0.8 stays 160 whatever the float rounding)."""
    m = torch.as_tensor(m, dtype=torch.int64)
    return torch.floor(m.to(torch.float64) * (1.0 - float(share)) + 1e-9).to(torch.int64)


def check_share(share: float, sizes: torch.Tensor | int, field: str) -> None:
    """``share`` in [0, 1), and with ``share > 0`` every client keeps at
    least one training and one validation example (``sizes``: examples per
    client); ConfigError naming ``field`` otherwise."""
    if not (0.0 <= float(share) < 1.0) or math.isnan(float(share)):
        raise ConfigError(field, share, "the share of each client's training examples held out for validation "
                          "must lie in [0, 1) (0: no validation split)")
    if float(share) == 0.0:
        return
    sizes = torch.as_tensor(sizes, dtype=torch.int64).reshape(-1)
    keep = train_part(sizes, share)
    bad = ((keep < 1) | (sizes - keep < 1)).nonzero().flatten()
    if bad.numel():
        m = int(sizes[bad[0]])
        raise ConfigError(field, share, f"a client with {m} training examples would keep {int(keep[bad[0]])} for "
                          f"training and {m - int(keep[bad[0]])} for validation; each part needs at least one: "
                          "give clients more examples or choose another share")


def carve_masks(seed: int, clients: torch.Tensor, width: int, counts: torch.Tensor | None,
                share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool ``(train [C, width], validation [C, width])`` over each client's
    example positions (its first ``counts[c]`` real, the rest padding; None:
    all ``width``): a random permutation of its real examples keyed on
    (seed, client), the first :func:`train_part` of it training, the rest
    validation (``random_split``'s way)."""
    clients = torch.as_tensor(clients, dtype=torch.int64)
    pos = torch.arange(width, device=clients.device)[None, :]
    real = counts if counts is not None else torch.full((len(clients),), width, dtype=torch.int64)
    real = real.to(clients.device)
    keys = rng.client_keys(seed, 0, STREAM, clients, width).masked_fill(pos >= real[:, None], 2.0)  # padding last
    rank = torch.empty_like(keys, dtype=torch.int64)
    rank.scatter_(1, torch.argsort(keys, dim=1, stable=True), pos.expand(len(clients), -1).contiguous())
    keep = train_part(real, share).to(clients.device)[:, None]
    return rank < keep, (rank >= keep) & (rank < real[:, None])


def _compact(mask: torch.Tensor, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(index [C, W], valid [C, W], counts [C])``: each row's True positions
    first, in their order, then padding; W = ``width``, or the most any row
    has."""
    counts = mask.sum(1)
    if width is None:
        width = max(1, int(counts.max())) if mask.shape[0] else 1
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :width]
    valid = torch.arange(width, device=mask.device)[None, :] < counts[:, None]
    return order, valid, counts


def _take(x, index: torch.Tensor, valid: torch.Tensor):
    """Rows ``x[c, index[c]]`` with padding (``~valid``) zeroed; uint8
    images stay stored (:class:`StoredInputs`)."""
    stored = x.stored if isinstance(x, StoredInputs) else x
    rows = torch.arange(index.shape[0], device=index.device)[:, None]
    out = stored[rows, index.to(stored.device)]
    out = out * valid.to(out.device).reshape(valid.shape + (1,) * (out.dim() - 2)).to(out.dtype)
    out = out.contiguous()
    return StoredInputs(out, x._normalize) if isinstance(x, StoredInputs) else out


def carve_validation(data: FederatedData, share: float, seed: int, field: str = "") -> FederatedData:
    """``data`` with each held client's training examples split into training
    and validation (:func:`carve_masks`): ``train_*`` hold the training part,
    ``val_*`` the validation part (``*_counts`` None where every client has
    the same number).  ``share`` 0 returns ``data`` itself; ``field``: the
    config key of ``share``, named by the errors."""
    field = field or "validation"
    if float(share) == 0.0:
        check_share(share, 1, field)
        return data
    width = data.train_y.shape[1]
    sizes = data.train_counts if data.train_counts is not None else torch.full((len(data.client_ids),), width)
    check_share(share, sizes.cpu(), field)
    train, val = carve_masks(seed, data.client_ids.cpu(), width, None if data.train_counts is None
                             else data.train_counts.cpu(), share)
    parts = {}
    # Clients of different sizes (a file's): the training rows keep the file's width, the same on every rank, since
    # the batch orders' keys depend on it (fedclust.rng.batch_orders).
    for name, mask, keep in (("train", train, None if data.train_counts is None else width), ("val", val, None)):
        index, valid, counts = _compact(mask, keep)
        device = data.train_y.device
        index, valid = index.to(device), valid.to(device)
        parts[f"{name}_x"] = _take(data.train_x, index, valid)
        parts[f"{name}_y"] = _take(data.train_y, index, valid)
        same = bool((counts == index.shape[1]).all()) and data.train_counts is None
        parts[f"{name}_counts"] = None if same else counts.to(device)
    return dataclasses.replace(data, **parts)
