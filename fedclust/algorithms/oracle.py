"""Oracle (PANM paper §4): k peers drawn uniformly from the client's true
same-cluster peers, anew each round.

Paper (the PANM paper's baseline): Z. Li, J. Lu, S. Luo, D. Zhu, Y. Shao, Y. Li, Z. Zhang, C. Wu,
"Mining Latent Relationships among Clients: Peer-to-peer Federated Learning with Adaptive Neighbor
Matching", https://arxiv.org/abs/2203.12285
"""

from __future__ import annotations

from fedclust.algorithms.base import Context, KPeers, RoundView
from fedclust.algorithms.registry import register
from fedclust.data import registry as data_registry
from fedclust.errors import ConfigError
from fedclust.network import both
from fedclust.peers import PeerIndex


def same_cluster_rows(ctx: Context):
    """``allowed(lo, hi)`` of :func:`fedclust.rng.choose_indices`: bool ``[hi - lo, n]``, True for
    rows lo..hi's true same-cluster peers (the client itself is left out by the draw)."""
    if ctx.clusters is None:
        raise ValueError("oracle draws its peers from the true clusters, which this data does not give "
                         "(Oracle.check refuses such data)")
    clusters = ctx.clusters.to(ctx.device)
    own = clusters[ctx.client_ids.to(ctx.device)]
    return lambda lo, hi: own[lo:hi, None] == clusters[None, :]


@register
class Oracle(KPeers):
    name = "oracle"
    report_position = 3
    paper_results = {("fmnist", "rotation", 2): (87.01, 0.26)}

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        ds = data_registry.find(cfg.data.name)   # an unknown name is the data check's to refuse
        if ds is not None and not ds.has_true_clusters(cfg.data):
            raise ConfigError("data.path", cfg.data.path,
                              "oracle draws its peers from the true clusters, which this data does not give: "
                              f"{ds.true_clusters_fix}, or choose another algorithm")

    def select(self, state: None, ctx: Context, view: RoundView):
        """Stateless: the true same-cluster peers are read from ``ctx.clusters`` each round (no [C, n] state)."""
        ids = ctx.client_ids.to(ctx.device)   # same-cluster peers among the round's graph neighbours
        allowed = both(same_cluster_rows(ctx), ctx.reach(view.round))
        return state, PeerIndex.draw(ctx.seed, view.round, "neighbors", ids, ctx.n, self.k, allowed)
