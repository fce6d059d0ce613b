"""What an algorithm sees and returns each round.

Peer-to-peer algorithms (fedjax style: ``init`` and ``select`` with the
hyperparameters closed over) choose, for each of this rank's clients, whom
to average with; the runner turns that choice into one mixing-matrix
product over the gathered weights (SPEC §4).

Neighbour sets are bool masks ``[C, n]``: row c is this rank's client
``ctx.client_ids[c]``, column j is global client j.  Never True on the
diagonal (a client is never its own neighbour).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch


@dataclass
class Context:
    """Static facts of one run on one rank."""

    n: int                       # clients in all
    client_ids: torch.Tensor     # [C] global ids held by this rank (contiguous)
    clusters: torch.Tensor       # [n] true cluster of every client (Oracle, metrics)
    seed: int
    stage1_rounds: int
    w0: torch.Tensor             # [P] common initial weights
    device: torch.device
    # loss of models on the training sets of this rank's clients:
    # (models [M, P], local client index [M]) -> mean cross-entropy [M]
    pair_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    @property
    def self_mask(self) -> torch.Tensor:
        """[C, n] True where column j is the row's own client."""
        m = torch.zeros(len(self.client_ids), self.n, dtype=torch.bool, device=self.device)
        m[torch.arange(len(self.client_ids), device=self.device), self.client_ids.to(self.device)] = True
        return m


@dataclass
class RoundView:
    """What the round's single all-gather makes visible."""

    round: int                          # 1-based
    before: torch.Tensor                # [C, P] this rank's models before local training
    after: torch.Tensor                 # [C, P] after local training
    all_after: torch.Tensor             # [n, P] every client's model after local training
    all_before: torch.Tensor | None = None  # [n, P], only if the algorithm sets gathers_before


class PeerAlgorithm(Protocol):
    name: str
    gathers_before: bool

    def init(self, ctx: Context) -> Any:
        """The algorithm's state before round 1."""

    def select(self, state: Any, ctx: Context, view: RoundView) -> tuple[Any, torch.Tensor]:
        """New state and the bool [C, n] mask of whom each client averages with this round."""

    def neighbor_list(self, state: Any, averaged: torch.Tensor) -> torch.Tensor:
        """The bool [C, n] neighbour list scored by precision and recall (SPEC §6).
        ``averaged`` is this round's mask from ``select``."""
