"""What one rank of a run holds fixed for the whole run, as the loop state
(:mod:`fedclust.state`), the evaluation (:mod:`fedclust.evaluation`) and the
checkpoints (:mod:`fedclust.checkpoint`) read it.  :class:`fedclust.runner.Setup`
gives it; they depend on this protocol, not on the runner."""

from __future__ import annotations

from typing import Any, Callable, Protocol, TypeVar

import torch

from fedclust.algorithms.base import Algorithm, Context
from fedclust.data import FederatedData
from fedclust.engine.functional import Arch
from fedclust.engine.layout import ParamLayout
from fedclust.network import Network
from fedclust.schema import Config

T = TypeVar("T")


class Fabric(Protocol):
    """The launched processes as the round loop uses them (Lightning Fabric, or
    :class:`fedclust.dist.OneProcess` for one)."""

    world_size: int
    global_rank: int

    def barrier(self) -> None: ...


class RankSetup(Protocol):
    """One rank's fixed facts: its config and process, its clients and their
    data, the model, the algorithm and its context, and the collective
    wrapper that turns a failed or stuck collective into an error naming the
    rank and the round."""

    cfg: Config
    fabric: Any                  # a Fabric: launched processes (typed Any: Lightning's class is not a Protocol)
    rank: int
    world: int
    device: torch.device
    n: int                       # clients in all
    client_ids: torch.Tensor     # [C] global ids of this rank's clients (contiguous)
    data: FederatedData          # this rank's clients' data, on the device
    arch: Arch                   # what the engine trains
    spec: str                    # the model as the config names it
    inputs: dict                 # the files the run read besides its config, hashed (checkpoint.input_files)
    layout: ParamLayout
    ctx: Context
    algo: Algorithm
    stage1_end: int              # the last round of stage one
    columns: int                 # the exchange's column block (config exchange_mb); 0: whole models at once
    attackers: torch.Tensor | None   # [n] bool, the run's attackers (config attack); None: none
    network: Network             # each round's graph, who is online (config network)

    def collective(self, t: int, fn: Callable[..., T], *args: Any) -> T: ...
