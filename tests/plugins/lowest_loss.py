"""Test plug-in: each round every client averages with the ``algorithm.k``
peers whose reported training loss this round (``view.all_loss``) is lowest,
a method written from docs/adding-an-algorithm.md alone.  It reads no model
of another client, so it declares ``column_exchange`` and runs with
``exchange_mb`` too.

    plugins=[tests/plugins/lowest_loss.py] algorithm.name=lowest_loss algorithm.k=2
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust.algorithms.base import Context, PeerAlgorithm, RoundView
from fedclust.algorithms.registry import register


@register
@dataclass
class LowestLoss(PeerAlgorithm):
    k: int   # algorithm.k: the peers a client averages with

    name = "lowest_loss"
    needs_k = True           # algorithm.k is checked for it (1 <= k < clients)
    column_exchange = True   # it reads losses, never a model: the gossip reads the models in column blocks

    @classmethod
    def from_config(cls, cfg) -> "LowestLoss":
        return cls(k=cfg.algorithm.k)

    def select(self, state, ctx: Context, view: RoundView):
        """The k other clients of lowest reported loss (one that did not train, NaN, is never chosen)."""
        loss = view.all_loss.to(ctx.device)                                  # [n], the same on every process
        keys = torch.where(torch.isnan(loss), torch.inf, loss).expand(len(ctx.client_ids), -1).clone()   # [C, n]
        keys[ctx.self_mask] = torch.inf                                      # never the client itself
        lowest = keys.topk(self.k, dim=1, largest=False)
        chosen = torch.zeros_like(keys, dtype=torch.bool)
        chosen.scatter_(1, lowest.indices, torch.isfinite(lowest.values))
        return state, chosen
