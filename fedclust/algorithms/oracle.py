"""Oracle (PANM paper §4): k peers drawn uniformly from the client's true
same-cluster peers, anew each round."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust import rng
from fedclust.algorithms.base import Context, PeerAlgorithm, RoundView
from fedclust.algorithms.registry import register
from fedclust.data import registry as data_registry
from fedclust.errors import ConfigError


def same_cluster_mask(ctx: Context) -> torch.Tensor:
    """[C, n] True for the row's true same-cluster peers (itself excluded)."""
    clusters = ctx.clusters.to(ctx.device)
    own = clusters[ctx.client_ids.to(ctx.device)]
    return (own[:, None] == clusters[None, :]) & ~ctx.self_mask


@register
@dataclass
class Oracle(PeerAlgorithm):
    k: int
    name = "oracle"
    report_position = 3
    needs_k = True
    paper_results = {("fmnist", "rotation", 2): (87.01, 0.26)}

    @classmethod
    def from_config(cls, cfg) -> "Oracle":
        return cls(k=cfg.algorithm.k)

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        ds = data_registry.find(cfg.data.name)   # an unknown name is the data check's to refuse
        if ds is not None and not ds.has_true_clusters(cfg.data):
            raise ConfigError("data.path", cfg.data.path,
                              "oracle draws its peers from the true clusters, which this data does not give: add a "
                              "`cluster` array (the true cluster of every client, [clients] integers) to the file, "
                              "or choose another algorithm")

    def select(self, state: None, ctx: Context, view: RoundView):
        """Stateless: the true same-cluster peers are read from ``ctx.clusters`` each round (no [C, n] state)."""
        return state, rng.choose_from_mask(ctx.seed, view.round, "neighbors", ctx.client_ids,
                                           same_cluster_mask(ctx), self.k)
