"""Peer-to-peer baselines of PANM paper §4 (docs/algorithms.md).

- Local: no averaging.
- Random: k peers drawn uniformly from all others, anew each round.
- FixTopology: k peers drawn uniformly once (round 0 key), kept.
- Oracle: k peers drawn uniformly from the true same-cluster clients each round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView


def others_mask(ctx: Context) -> torch.Tensor:
    """[C, n] True for every client except the row's own."""
    return ~ctx.self_mask


def same_cluster_mask(ctx: Context) -> torch.Tensor:
    """[C, n] True for the row's true same-cluster peers (itself excluded)."""
    clusters = ctx.clusters.to(ctx.device)
    own = clusters[ctx.client_ids.to(ctx.device)]
    return (own[:, None] == clusters[None, :]) & ~ctx.self_mask


@dataclass
class Local:
    name: str = "local"
    gathers_before: bool = False

    def init(self, ctx: Context):
        return None

    def select(self, state, ctx: Context, view: RoundView):
        return state, torch.zeros(len(ctx.client_ids), ctx.n, dtype=torch.bool, device=ctx.device)

    def neighbor_list(self, state, averaged):
        return averaged


@dataclass
class RandomPeers:
    """Random (fresh draw each round) or FixTopology (one draw, kept)."""

    k: int
    fixed: bool = False
    name: str = "random"
    gathers_before: bool = False

    def init(self, ctx: Context):
        if self.fixed:
            return rng.choose_from_mask(ctx.seed, 0, "fixed", ctx.client_ids, others_mask(ctx), self.k)
        return None

    def select(self, state, ctx: Context, view: RoundView):
        if self.fixed:
            return state, state
        return state, rng.choose_from_mask(ctx.seed, view.round, "neighbors", ctx.client_ids, others_mask(ctx), self.k)

    def neighbor_list(self, state, averaged):
        return averaged


@dataclass
class Oracle:
    k: int
    name: str = "oracle"
    gathers_before: bool = False

    def init(self, ctx: Context):
        return same_cluster_mask(ctx)

    def select(self, state, ctx: Context, view: RoundView):
        return state, rng.choose_from_mask(ctx.seed, view.round, "neighbors", ctx.client_ids, state, self.k)

    def neighbor_list(self, state, averaged):
        return averaged


def make_local(cfg):
    return Local()


def make_random(cfg):
    return RandomPeers(k=cfg.algorithm.k)


def make_fixtopology(cfg):
    return RandomPeers(k=cfg.algorithm.k, fixed=True, name="fixtopology")


def make_oracle(cfg):
    return Oracle(k=cfg.algorithm.k)
