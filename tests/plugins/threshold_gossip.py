"""To be deleted: kept only while tests/test_resume.py's failing-rank test
names it; that test's plug-in is now tests/plugins/failing_gossip.py (the
example examples/threshold_gossip.py with a rank that raises).

An algorithm that is not part of fedclust, registered from outside
(``plugins=[tests/plugins/threshold_gossip.py]``): each round every client
averages with all peers whose PANMGrad similarity (the cosine mix of PANM
paper Eq. 6, alpha = ``algorithm.alpha``) exceeds ``threshold_gossip.threshold``.

``threshold_gossip.fail_rank`` / ``fail_round`` make that rank raise in
that round (tests of a failing rank)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust.algorithms.base import Context, PeerAlgorithm, RoundView, client_rows
from fedclust.algorithms.registry import register
from fedclust.algorithms.similarity import grad_similarity
from fedclust.errors import ConfigError


@dataclass
class ThresholdConfig:
    threshold: float = 0.5   # average with the peers whose similarity is above this
    fail_rank: int = -1      # tests: this rank raises in fail_round (-1: never)
    fail_round: int = 0

    def validate(self, cfg) -> None:
        if not -1.0 <= self.threshold <= 1.0:
            raise ConfigError("threshold_gossip.threshold", self.threshold, "must lie in [-1, 1]: it is compared "
                              "with a cosine similarity")


@dataclass
class ThresholdState:
    peers: torch.Tensor = client_rows()   # [C, n] bool: last round's peers above the threshold
    rounds: int = 0                       # rounds run (server state, replicated)


@register
@dataclass
class ThresholdGossip(PeerAlgorithm):
    threshold: float
    alpha: float
    fail_rank: int = -1
    fail_round: int = 0

    name = "threshold_gossip"
    gathers_before = True
    sections = {"threshold_gossip": ThresholdConfig}

    @classmethod
    def from_config(cls, cfg) -> "ThresholdGossip":
        c = cfg.threshold_gossip
        return cls(threshold=c.threshold, alpha=cfg.algorithm.alpha, fail_rank=c.fail_rank, fail_round=c.fail_round)

    def init(self, ctx: Context) -> ThresholdState:
        return ThresholdState(peers=torch.zeros(len(ctx.client_ids), ctx.n, dtype=torch.bool, device=ctx.device))

    def select(self, state: ThresholdState, ctx: Context, view: RoundView):
        if view.round == self.fail_round and torch.distributed.is_initialized() \
                and torch.distributed.get_rank() == self.fail_rank:
            raise RuntimeError(f"threshold_gossip: rank {self.fail_rank} fails in round {view.round} (as asked)")
        sim = grad_similarity(view.all_after, view.all_before, ctx.w0, self.alpha, own=ctx.own_rows)
        peers = (sim > self.threshold) & ~ctx.self_mask
        return ThresholdState(peers=peers, rounds=state.rounds + 1), peers
