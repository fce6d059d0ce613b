"""What an algorithm sees and returns each round.

Peer-to-peer algorithms (fedjax style: ``init`` and ``select`` with the
hyperparameters closed over) choose, for each of this rank's clients, whom
to average with; the runner turns that choice into one mixing-matrix
product over the gathered weights (docs/algorithms.md).

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
    # the same losses grouped by client (faster): (models [M, P], peers [C, m] indices
    # into models) -> [C, m], row c on this rank's client c's training set
    pool_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    @property
    def own_rows(self) -> slice:
        """This rank's clients as a slice of the gathered ``[n, ...]`` rows
        (shards are contiguous, :func:`fedclust.dist.shard_bounds`)."""
        ids = self.client_ids
        start = int(ids[0]) if len(ids) else 0
        if len(ids) and int(ids[-1]) - start + 1 != len(ids):
            raise ValueError(f"client_ids must be contiguous, got {ids.tolist()[:10]}...")
        return slice(start, start + len(ids))

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
    before: torch.Tensor | None         # [C, P] this rank's models before local training (gathers_before only)
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
        """The bool [C, n] neighbour list scored by precision and recall (docs/algorithms.md).
        ``averaged`` is this round's mask from ``select``."""


@dataclass
class RoundPlan:
    """What each of this rank's clients trains from in a round."""

    start: torch.Tensor                  # [C, P] models local training starts from
    anchor: torch.Tensor | None = None   # [C, P] proximal centre (FedProx, FPFC); None: plain SGD
    mu: float = 0.0                      # proximal weight: grad += mu * (w - anchor)


@dataclass
class RoundResult:
    """What a round leaves: the models clients hold (and are evaluated
    with), and what the metrics need."""

    models: torch.Tensor                        # [C, P] each own client's model after the round
    lists: torch.Tensor | None = None           # [C, n] bool neighbour lists (peer-to-peer) for precision/recall
    averaged: torch.Tensor | None = None        # [C, n] bool whom each own client averaged with this round
    assignment: torch.Tensor | None = None      # [n] long cluster of every client (centralized), replicated
    received: torch.Tensor | None = None        # [C] models each own client received this round
    server_received: int = 0                    # models the server received this round (0: no server)
    server_sent: int = 0                        # models the server sent this round


class RoundAlgorithm(Protocol):
    """The runner's view of any algorithm (peer-to-peer ones through
    ``PeerRound``): plan the round's local training, then aggregate."""

    name: str
    gathers_before: bool

    def init(self, ctx: Context) -> Any: ...

    def plan(self, state: Any, ctx: Context, round_: int, models: torch.Tensor) -> tuple[Any, RoundPlan]: ...

    def aggregate(self, state: Any, ctx: Context, view: RoundView) -> tuple[Any, RoundResult]: ...


@dataclass
class PeerRound:
    """Adapts a PeerAlgorithm: train from the held models, then the gossip
    average (docs/algorithms.md) as one mixing-matrix product.

    A client receives the models of every peer it averages with and of every
    peer whose similarity it computes (``contacted``, if the algorithm has it)."""

    peer: Any

    @property
    def name(self) -> str:
        return self.peer.name

    @property
    def gathers_before(self) -> bool:
        return self.peer.gathers_before

    def init(self, ctx: Context) -> Any:
        return self.peer.init(ctx)

    def plan(self, state, ctx: Context, round_: int, models: torch.Tensor):
        return state, RoundPlan(start=models)

    def aggregate(self, state, ctx: Context, view: RoundView):
        from fedclust.mixing import gossip

        state, averaged = self.peer.select(state, ctx, view)
        contacted = averaged
        if hasattr(self.peer, "contacted"):
            contacted = contacted | self.peer.contacted(state, view.round)
        contacted = contacted & ~ctx.self_mask
        return state, RoundResult(
            models=gossip(averaged, ctx.self_mask, view.all_after),
            lists=self.peer.neighbor_list(state, averaged),
            averaged=averaged,
            received=contacted.sum(1),
        )


def as_round_algorithm(algo) -> RoundAlgorithm:
    """Peer algorithms (with ``select``) are wrapped; others pass through."""
    return PeerRound(algo) if hasattr(algo, "select") else algo
