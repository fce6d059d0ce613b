"""Random (PANM paper §4): each round every client averages with k peers
drawn uniformly from all others, anew each round.

Paper (the PANM paper's baseline): Z. Li, J. Lu, S. Luo, D. Zhu, Y. Shao, Y. Li, Z. Zhang, C. Wu,
"Mining Latent Relationships among Clients: Peer-to-peer Federated Learning with Adaptive Neighbor
Matching", https://arxiv.org/abs/2203.12285
"""

from __future__ import annotations

from fedclust.algorithms.base import Context, KPeers, RoundView
from fedclust.algorithms.registry import register
from fedclust.peers import PeerIndex


@register
class RandomPeers(KPeers):
    name = "random"
    report_position = 2
    paper_results = {("fmnist", "rotation", 2): (85.94, 0.27)}

    def select(self, state, ctx: Context, view: RoundView):
        ids = ctx.client_ids.to(ctx.device)   # among the round's graph neighbours (all others: complete)
        return state, PeerIndex.draw(ctx.seed, view.round, "neighbors", ids, ctx.n, self.k, ctx.reach(view.round))
