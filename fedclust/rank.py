"""What one rank of a run holds fixed for the whole run: :class:`Setup`, filled in once by the runner
(:func:`fedclust.runner.build`) and read by every round, the evaluation, the checkpoints and rank 0's outputs;
and :class:`Shard`, the part of it that the state (:mod:`fedclust.state`) and the round's exchange
(:mod:`fedclust.exchange`) use: this rank's clients and the run's collectives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch

from fedclust.algorithms.base import Algorithm, Context
from fedclust.data import FederatedData
from fedclust.data.drift import Drift
from fedclust.dist import Collectives, gather_parts, gather_rows
from fedclust.engine.functional import Arch
from fedclust.engine.layout import ParamLayout
from fedclust.engine.train import TrainSettings
from fedclust.network import Join, Network
from fedclust.schema import Config

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """This rank among the run's processes: its clients (a contiguous block of ids) and the collectives over
    every rank, each through ``comm`` (a failed or stuck collective becomes an error naming the rank and the
    round)."""

    fabric: Any                  # lightning_fabric.Fabric, or fedclust.dist.OneProcess
    rank: int
    world: int
    device: torch.device
    n: int                       # clients in all
    client_ids: torch.Tensor     # [C] global ids of this rank's clients
    comm: Collectives

    def collective(self, t: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, a collective of round ``t`` (:meth:`fedclust.dist.Collectives.run`)."""
        return self.comm.run(t, fn, *args)

    def gather(self, t: int, rows: torch.Tensor) -> torch.Tensor:
        """Every rank's ``[C, ...]`` rows as ``[n, ...]`` (one collective of round ``t``)."""
        return self.collective(t, gather_rows, self.fabric, rows, self.n)

    def gather_parts(self, t: int, parts: list[torch.Tensor]) -> list[torch.Tensor]:
        """Every rank's rows of each ``[C, k_i]`` part as ``[n, k_i]``, in one collective of round ``t``."""
        return self.collective(t, gather_parts, self.fabric, parts, self.n)


@dataclass(frozen=True)
class Setup:
    """What one rank holds fixed for the whole run, built once (:func:`fedclust.runner.build`)."""

    cfg: Config
    shard: Shard
    data: FederatedData          # this rank's clients' data, on the device
    arch: Arch                   # what the engine trains: a built model (fedclust.engine.net.Net)
    spec: str                    # the model as the config names it (mlp, FILE.py:NAME, ...)
    inputs: dict                 # the files it read besides the config, hashed once (checkpoint.input_files)
    layout: ParamLayout
    ctx: Context
    algo: Algorithm
    settings: TrainSettings      # the lr of round 1; round t's is derived from it
    stage1_end: int              # the last round of stage one
    network: Network             # each round's graph, who is online, who straggles (config network)
    attackers: torch.Tensor | None = None   # [n] bool, the run's attackers (config attack); None: none
    columns: int = 0             # the exchange's column block (config exchange_mb); 0: whole models at once
    drift: Drift | None = None   # the clients that change cluster and their rows (config data.drift_round); None
    join: Join | None = None     # this rank's late joiners and their start (config network.join_round); None

    # the shard's facts, read often
    @property
    def rank(self) -> int:
        return self.shard.rank

    @property
    def n(self) -> int:
        return self.shard.n

    @property
    def client_ids(self) -> torch.Tensor:
        return self.shard.client_ids

    @property
    def device(self) -> torch.device:
        return self.shard.device

    def collective(self, t: int, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, a collective of round ``t``."""
        return self.shard.collective(t, fn, *args)

