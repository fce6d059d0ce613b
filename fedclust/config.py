"""Typed experiment config: dataclasses, YAML loading, dotted overrides and
the one place where every value is validated.

Every error names the field, the bad value and the fix; an unknown key names
the closest valid one.  Validation runs before any process group starts or
any data is read.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedclust.errors import ConfigError


@dataclass
class AlgorithmConfig:
    name: str = "local"
    k: int = 5             # neighbours averaged with per round
    l: int = 10            # candidates drawn per round
    tau: int = 1           # HNM runs every tau rounds
    alpha: float = 0.5     # PANMGrad weight of the update cosine


@dataclass
class DataConfig:
    name: str = "fmnist"            # mnist | fmnist | cifar10 | synthetic
    root: str = "data"              # folder of the data sets
    clusters: str = "rotation"      # rotation | label_swap
    num_clusters: int = 2           # 2 or 4
    train_size: int = 200           # training images per client
    test_size: int = 100            # test images per client
    share_images: bool = False      # allow one image on several clients
    download: bool = True           # torchvision download when missing
    synthetic_alpha: float = 1.0    # Synthetic(alpha, beta) of FedProx
    synthetic_beta: float = 1.0
    synthetic_dim: int = 60


@dataclass
class TrainConfig:
    lr: float = 0.08
    lr_decay: float = 0.99          # lr of round t is lr * lr_decay**(t-1)
    momentum: float = 0.9
    batch_size: int = 128
    local_epochs: int = 3


@dataclass
class WandbConfig:
    enabled: bool = False
    project: str = "fedclust"
    entity: str = ""
    mode: str = "online"            # online | offline
    group: str = ""


@dataclass
class Config:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    model: str = "auto"             # auto | mlp | cnn
    clients: int = 100
    rounds: int = 300               # total rounds (stage one + stage two)
    stage1_rounds: int = 100
    seed: int = 0
    out: str = ""                   # run directory; empty: runs/<algorithm>-<data>-s<seed>-<time>
    device: str = "auto"            # auto | cpu | cuda
    eval_every: int = 1             # evaluate every this many rounds (and the last)
    progress: bool = True           # progress bar on rank 0
