"""FixTopology (PANM paper §4): k peers drawn uniformly once (the round-0
key of the "fixed" stream), kept for the whole run."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust import rng
from fedclust.algorithms.base import Context, PeerAlgorithm, RoundView, client_rows
from fedclust.algorithms.registry import register


@dataclass
class FixTopologyState:
    peers: torch.Tensor = client_rows()   # [C, n] bool: the k peers drawn once


@register
@dataclass
class FixTopology(PeerAlgorithm):
    k: int
    name = "fixtopology"
    report_position = 1
    needs_k = True
    paper_results = {("fmnist", "rotation", 2): (85.86, 0.17)}

    @classmethod
    def from_config(cls, cfg) -> "FixTopology":
        return cls(k=cfg.algorithm.k)

    def init(self, ctx: Context) -> FixTopologyState:
        return FixTopologyState(rng.choose_from_mask(ctx.seed, 0, "fixed", ctx.client_ids, ~ctx.self_mask, self.k))

    def select(self, state: FixTopologyState, ctx: Context, view: RoundView):
        return state, state.peers
