"""FixTopology (PANM paper §4): k peers drawn uniformly once (the round-0
key of the "fixed" stream), kept for the whole run.

Paper (the PANM paper's baseline): Z. Li, J. Lu, S. Luo, D. Zhu, Y. Shao, Y. Li, Z. Zhang, C. Wu,
"Mining Latent Relationships among Clients: Peer-to-peer Federated Learning with Adaptive Neighbor
Matching", https://arxiv.org/abs/2203.12285
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust.algorithms.base import Context, KPeers, RoundView, client_rows
from fedclust.algorithms.registry import register
from fedclust.peers import PeerIndex, mask_indices, unpack_bits


@dataclass
class FixTopologyState:
    peers: torch.Tensor = client_rows()   # [C, k] int64: the k peers drawn once, each row ascending


@register
class FixTopology(KPeers):
    name = "fixtopology"
    report_position = 1
    paper_results = {("fmnist", "rotation", 2): (85.86, 0.17)}

    def init(self, ctx: Context) -> FixTopologyState:
        # among the first round's graph neighbours; a later graph's round receives from those still linked
        drawn = PeerIndex.draw(ctx.seed, 0, "fixed", ctx.client_ids.to(ctx.device), ctx.n, self.k, ctx.reach(1))
        return FixTopologyState(drawn.idx)   # k < n (checked), so every row has k peers

    def select(self, state: FixTopologyState, ctx: Context, view: RoundView):
        return state, PeerIndex(state.peers, torch.ones_like(state.peers, dtype=torch.bool), ctx.n)

    def upgrade_state(self, clients: dict, server: dict, n: int) -> None:
        """Checkpoints that kept the fixed peers as a bool ``[n, n]`` mask: now ``[n, k]`` indices (the same
        peers)."""
        peers = clients["peers"]
        if isinstance(peers, dict):   # a bool mask, packed as checkpoints hold masks
            peers = unpack_bits(peers["bits"], int(peers["width"]))
        if peers.dtype == torch.bool:
            clients["peers"] = mask_indices(peers)[0]
