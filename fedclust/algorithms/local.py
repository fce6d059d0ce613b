"""Local (PANM paper §4): every client trains alone and never averages.

Paper (the PANM paper's baseline): Z. Li, J. Lu, S. Luo, D. Zhu, Y. Shao, Y. Li, Z. Zhang, C. Wu,
"Mining Latent Relationships among Clients: Peer-to-peer Federated Learning with Adaptive Neighbor
Matching", https://arxiv.org/abs/2203.12285
"""

from __future__ import annotations

from fedclust.algorithms.base import Context, PeerAlgorithm, RoundView
from fedclust.algorithms.registry import register
from fedclust.peers import PeerIndex


@register
class Local(PeerAlgorithm):
    name = "local"
    report_position = 0
    choice_masks = False
    column_exchange = True   # it averages with no one: the gossip reads nothing of the others
    paper_results = {("fmnist", "rotation", 2): (76.24, 0.22), ("synthetic", None, 4): (84.97, 0.06)}

    @classmethod
    def from_config(cls, cfg) -> "Local":
        return cls()

    def select(self, state, ctx: Context, view: RoundView):
        return state, PeerIndex.empty(len(ctx.client_ids), ctx.n, ctx.device)
