"""Test plug-in: the example threshold gossip (examples/threshold_gossip.py)
with a rank that raises, for the tests of a failing rank.

    plugins=[tests/plugins/failing_gossip.py] algorithm.name=failing_gossip \\
        failing_gossip.rank=1 failing_gossip.round=3

Its threshold is the example's key, threshold_gossip.threshold."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fedclust.algorithms import registry
from fedclust.config import load_plugin
from fedclust.schema import option

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "threshold_gossip.py"
load_plugin(str(EXAMPLE))   # registers threshold_gossip once, however often it is named
ThresholdGossip = registry.get("threshold_gossip")


@dataclass
class FailingConfig:
    rank: int = option(-1, "this rank raises in failing_gossip.round (-1: none)")
    round: int = option(0, "the round in which failing_gossip.rank raises")

    def validate(self, cfg) -> None:
        pass


@registry.register
@dataclass
class FailingGossip(ThresholdGossip):
    failing_gossip: FailingConfig = field(default_factory=FailingConfig)

    name = "failing_gossip"
    sections = {**ThresholdGossip.sections, "failing_gossip": FailingConfig}

    @classmethod
    def from_config(cls, cfg) -> "FailingGossip":
        return dataclasses.replace(super().from_config(cfg), failing_gossip=cfg.failing_gossip)

    def select(self, state, ctx, view):
        f = self.failing_gossip
        if view.round == f.round and torch.distributed.is_initialized() and torch.distributed.get_rank() == f.rank:
            raise RuntimeError(f"failing_gossip: rank {f.rank} fails in round {view.round} (as asked)")
        return super().select(state, ctx, view)
