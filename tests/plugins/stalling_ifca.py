"""Test plug-in: IFCA with a rank that stalls before the all-reduce of a
restart's objective, for the test that every collective goes through the
run's wrapper ("rank X, round t" errors).

    plugins=[tests/plugins/stalling_ifca.py] algorithm.name=stalling_ifca \\
        stalling_ifca.rank=1 stalling_ifca.round=3

Its keys besides these are ifca's."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch

from fedclust.algorithms import registry
from fedclust.schema import option
from fedclust.stopping import REQUEST

Ifca = registry.get("ifca")


@dataclass
class StallConfig:
    rank: int = option(-1, "this rank stalls 120 s at the start of stalling_ifca.round (-1: none), or until "
                               "its launcher stops it")
    round: int = option(0, "the round in which stalling_ifca.rank stalls")

    def validate(self, cfg) -> None:
        pass


@registry.register
@dataclass
class StallingIfca(Ifca):
    stalling_ifca: StallConfig = field(default_factory=StallConfig)

    name = "stalling_ifca"
    sections = {**Ifca.sections, "stalling_ifca": StallConfig}

    @classmethod
    def from_config(cls, cfg, facts) -> "StallingIfca":
        return dataclasses.replace(super().from_config(cfg, facts), stalling_ifca=cfg.stalling_ifca)

    def plan(self, state, ctx, round_, models):
        f = self.stalling_ifca
        if round_ == f.round and torch.distributed.is_initialized() and torch.distributed.get_rank() == f.rank:
            until = time.monotonic() + 120   # stalls; ends early only when its launcher stops it (SIGTERM)
            while time.monotonic() < until and not REQUEST.requested:
                time.sleep(0.1)
            if REQUEST.requested:
                raise SystemExit(75)
        return super().plan(state, ctx, round_, models)
