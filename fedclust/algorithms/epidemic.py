"""Epidemic Learning, as the peer algorithm ``epidemic``: decentralized SGD
on a random topology that changes every round.  After local training,

- ``epidemic.variant=local`` (EL-Local): every client pushes its model to
  ``s`` distinct peers drawn uniformly from the others; a client averages its
  own model with every model pushed to it, equally weighted,
  ``w ← (w + Σ received) / (m + 1)`` (m random, mean s; m = 0 keeps its own);
- ``oracle`` (EL-Oracle): a fresh random s-regular undirected graph every
  round, the same on every process; a client averages with its s
  neighbours, each weighted 1/(s + 1).

``epidemic.s = 0`` takes the paper's ``⌈log2 n⌉``.  Not personalized and
not clustered: its neighbour list is the models averaged in the round.  What
fedclust runs and where it departs from the reference code:
docs/algorithms.md, "Epidemic Learning".

Paper: M. de Vos, S. Farhadkhani, R. Guerraoui, A.-M. Kermarrec, R. Pires, R. Sharma, "Epidemic
Learning: Boosting Decentralized Learning with Randomized Communication", NeurIPS 2023,
https://arxiv.org/abs/2310.01972
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

from fedclust.algorithms.base import Choice, Context, PeerAlgorithm, RoundView
from fedclust.algorithms.registry import register
from fedclust.errors import ConfigError
from fedclust.network import regular_graph
from fedclust.peers import PeerIndex, incoming
from fedclust.schema import at_least, option

Variant = Literal["local", "oracle"]


@dataclass
class EpidemicConfig:
    """The ``epidemic`` section (docs/algorithms.md, "Epidemic Learning")."""

    variant: Variant = option("local", "local: each client pushes its model to s random peers and averages what it "
                                       "received (EL-Local); oracle: a fresh random s-regular graph every round "
                                       "(EL-Oracle)")
    s: int = option(0, "peers a client pushes to (local) or its degree (oracle); 0: ceil(log2 clients), the paper's")

    def validate(self, cfg) -> None:
        at_least("epidemic.s", self.s, 0, "peers a client pushes to (0: ceil(log2 clients))")
        s = fanout(self.s, cfg.clients)
        if s > cfg.clients - 1:
            raise ConfigError("epidemic.s", self.s, f"must be at most clients - 1 = {cfg.clients - 1}")
        if self.variant == "oracle":
            if (cfg.clients * s) % 2:
                raise ConfigError("epidemic.s", self.s, f"an {s}-regular graph of {cfg.clients} clients does not "
                                  "exist (clients x s must be even); choose an even s")
            if cfg.network.graph != "complete":
                raise ConfigError("network.graph", cfg.network.graph, "epidemic.variant=oracle draws a fresh "
                                  "s-regular graph every round itself; use network.graph=complete, or "
                                  "epidemic.variant=local (it pushes among the graph's neighbours)")


def fanout(s: int, n: int) -> int:
    """The s a run uses: ``s``, or ``⌈log2 n⌉`` for 0."""
    return s if s > 0 else max(1, math.ceil(math.log2(n)))


@register
@dataclass
class Epidemic(PeerAlgorithm):
    """Epidemic Learning's round (see the module docstring)."""

    epidemic: EpidemicConfig = field(default_factory=EpidemicConfig)

    name = "epidemic"
    report_position = 15
    choice_masks = False   # index lists: the models pushed to a client, or its s graph neighbours
    column_exchange = True   # it reads no model to choose: the gossip reads them through view.blocks
    sections = {"epidemic": EpidemicConfig}

    @classmethod
    def from_config(cls, cfg) -> "Epidemic":
        return cls(cfg.epidemic)

    def select(self, state: None, ctx: Context, view: RoundView) -> tuple[None, Choice]:
        t, n = view.round, ctx.n
        s = fanout(self.epidemic.s, n)
        ids = ctx.client_ids.to(ctx.device)
        lo, hi = ctx.own_rows.start, ctx.own_rows.stop
        if self.epidemic.variant == "oracle":   # this round's s-regular graph, the same on every process
            graph = regular_graph(n, s, ctx.seed, t, "epidemic")
            return state, PeerIndex(graph.idx[lo:hi].to(ctx.device), graph.valid[lo:hi].to(ctx.device), n)
        # every sender's s pushes (the same on every process), among its graph neighbours where there is a graph
        g = ctx.graph(t)
        everyone = torch.arange(n, device=ids.device)
        allowed = None if g is None else (lambda a, b: g.rows(everyone[a:b], ids.device))
        pushes = PeerIndex.draw(ctx.seed, t, "epidemic_push", everyone, n, s, allowed)
        return state, incoming(pushes, lo, hi)
