"""FixTopology (PANM paper §4): k peers drawn uniformly once (the round-0
key of the "fixed" stream), kept for the whole run.

Paper (the PANM paper's baseline): Z. Li, J. Lu, S. Luo, D. Zhu, Y. Shao, Y. Li, Z. Zhang, C. Wu,
"Mining Latent Relationships among Clients: Peer-to-peer Federated Learning with Adaptive Neighbor
Matching", https://arxiv.org/abs/2203.12285
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust.algorithms.base import Context, PeerAlgorithm, RoundView, client_rows
from fedclust.algorithms.registry import register
from fedclust.peers import PeerIndex


@dataclass
class FixTopologyState:
    peers: torch.Tensor = client_rows()   # [C, k] int64: the k peers drawn once, each row ascending


@register
@dataclass
class FixTopology(PeerAlgorithm):
    k: int
    name = "fixtopology"
    report_position = 1
    needs_k = True
    choice_masks = False   # its choice is k index lists a client (fedclust.peers.PeerIndex)
    paper_results = {("fmnist", "rotation", 2): (85.86, 0.17)}

    @classmethod
    def from_config(cls, cfg) -> "FixTopology":
        return cls(k=cfg.algorithm.k)

    def init(self, ctx: Context) -> FixTopologyState:
        # among the first round's graph neighbours; a later graph's round receives from those still linked
        drawn = PeerIndex.draw(ctx.seed, 0, "fixed", ctx.client_ids.to(ctx.device), ctx.n, self.k, ctx.reach(1))
        return FixTopologyState(drawn.idx)   # k < n (checked), so every row has k peers

    def select(self, state: FixTopologyState, ctx: Context, view: RoundView):
        return state, PeerIndex(state.peers, torch.ones_like(state.peers, dtype=torch.bool), ctx.n)
