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

from fedclust.config_methods import (CflConfig, FedGroupConfig, FedProxConfig, FpfcConfig, IfcaConfig, PanmConfig,
                                     PensConfig)
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
    synthetic_inputs: str = "client"  # client: x around each client's own mean v_i (FedProx) | shared: all around v_0


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
    pens: PensConfig = field(default_factory=PensConfig)
    panm: PanmConfig = field(default_factory=PanmConfig)
    fedprox: FedProxConfig = field(default_factory=FedProxConfig)
    ifca: IfcaConfig = field(default_factory=IfcaConfig)
    cfl: CflConfig = field(default_factory=CflConfig)
    fedgroup: FedGroupConfig = field(default_factory=FedGroupConfig)
    fpfc: FpfcConfig = field(default_factory=FpfcConfig)
    participation: float = 1.0      # share of clients taking part each round (centralized methods)
    model: str = "auto"             # auto (logreg for synthetic, cnn for cifar10, mlp otherwise) | logreg | mlp | cnn
    clients: int = 100
    rounds: int = 300               # total rounds (stage one + stage two)
    stage1_rounds: int = 100
    seed: int = 0
    out: str = ""                   # run directory; empty: runs/<algorithm>-<data>-s<seed>-<time>
    label: str = ""                 # the run's name in reports and W&B; empty: algorithm.name
    device: str = "auto"            # auto | cpu | cuda
    eval_every: int = 1             # evaluate every this many rounds (and the last)
    progress: bool = True           # progress bar on rank 0
    figures: bool = True            # write PNG figures into the run directory at the end


# ----------------------------------------------------------------------------
# Loading and overrides

ALGORITHMS_NEEDING_K = {"random", "fixtopology", "oracle", "pens", "panm_loss", "panm_grad"}
ALGORITHMS_NEEDING_L = {"pens", "panm_loss", "panm_grad"}


def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _valid_keys(cls, prefix: str = "") -> list[str]:
    keys = []
    for name, tp in _field_types(cls).items():
        path = f"{prefix}{name}"
        if dataclasses.is_dataclass(tp):
            keys += _valid_keys(tp, path + ".")
        else:
            keys.append(path)
    return keys


def valid_keys() -> list[str]:
    """Every dotted key a config file or override may set."""
    return _valid_keys(Config)


def _unknown_key(path: str) -> ConfigError:
    close = difflib.get_close_matches(path, valid_keys(), n=1, cutoff=0.5)
    if not close:  # try matching the last component alone
        last = path.rsplit(".", 1)[-1]
        close = [k for k in valid_keys() if k.rsplit(".", 1)[-1] == last][:1]
    fix = f"did you mean '{close[0]}'?" if close else "no such key"
    return ConfigError(path, "(unknown key)", f"{fix} Valid keys: fedclust check --keys")


def _coerce(path: str, value: Any, tp: Any) -> Any:
    """Check a YAML value against the field's type (ints may fill floats)."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, value, "expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(path, value, "expected a whole number")
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(path, value, "expected a number")
    if tp is str:
        if value is None:
            return ""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(path, value, "expected a string")
    return value


def _merge(obj: Any, mapping: dict, prefix: str = "") -> None:
    types = _field_types(type(obj))
    if not isinstance(mapping, dict):
        raise ConfigError(prefix.rstrip(".") or "(top level)", mapping, "expected a mapping of keys")
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if key not in types:
            while isinstance(value, dict) and value:  # name the full dotted key of a misspelt section
                key, value = next(iter(value.items()))
                path = f"{path}.{key}"
            raise _unknown_key(path)
        tp = types[key]
        if dataclasses.is_dataclass(tp):
            _merge(getattr(obj, key), value or {}, path + ".")
        else:
            setattr(obj, key, _coerce(path, value, tp))


def set_key(cfg: Config, path: str, value: Any) -> None:
    """Set one dotted key, with the same checks as a file."""
    parts = path.split(".")
    nested: dict = {}
    cur = nested
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    _merge(cfg, nested)


def parse_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, value parsed as YAML scalar)."""
    if "=" not in text:
        raise ConfigError(text, "(override)", "write overrides as KEY=VALUE, e.g. algorithm.k=5")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML file (or start from defaults), apply overrides, validate."""
    cfg = Config()
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("CONFIG", str(path), "no such file; pass a YAML file such as configs/fmnist_rotation2.yaml")
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError("CONFIG", str(path), f"not valid YAML ({exc})") from None
        _merge(cfg, raw)
    for text in overrides:
        key, value = parse_override(text)
        set_key(cfg, key, value)
    validate(cfg)
    return cfg


def to_dict(cfg: Config) -> dict:
    return dataclasses.asdict(cfg)


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


# ----------------------------------------------------------------------------
# Validation: the one place every value is checked.

def _one_of(path: str, value: Any, allowed) -> None:
    if value not in allowed:
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(path, value, f"must be one of {sorted(allowed)}{hint}")


def _positive(path: str, value: float, strict: bool = True) -> None:
    if value < 0 or (strict and value == 0):
        raise ConfigError(path, value, "must be > 0" if strict else "must be >= 0")


def validate(cfg: Config) -> None:
    from fedclust.algorithms import registry  # late import: registry imports algorithm modules

    _one_of("algorithm.name", cfg.algorithm.name, registry.names())
    _positive("clients", cfg.clients)
    if cfg.clients < 2:
        raise ConfigError("clients", cfg.clients, "federated learning needs at least 2 clients")
    _positive("rounds", cfg.rounds)
    _positive("stage1_rounds", cfg.stage1_rounds, strict=False)
    _positive("eval_every", cfg.eval_every)
    _positive("algorithm.tau", cfg.algorithm.tau)
    if not 0.0 <= cfg.algorithm.alpha <= 1.0:
        raise ConfigError("algorithm.alpha", cfg.algorithm.alpha, "must lie in [0, 1]")
    name = cfg.algorithm.name
    if name in ALGORITHMS_NEEDING_K:
        if cfg.algorithm.k < 1:
            raise ConfigError("algorithm.k", cfg.algorithm.k, "must be >= 1")
        if cfg.algorithm.k >= cfg.clients:
            raise ConfigError("algorithm.k", cfg.algorithm.k,
                              f"must be smaller than clients ({cfg.clients}): at most {cfg.clients - 1}")
    if name in ALGORITHMS_NEEDING_L:
        if cfg.algorithm.l < 1:
            raise ConfigError("algorithm.l", cfg.algorithm.l, "must be >= 1")
        if cfg.algorithm.l > cfg.clients - 1:
            raise ConfigError("algorithm.l", cfg.algorithm.l,
                              f"must be at most clients - 1 = {cfg.clients - 1} (candidates are other clients)")
    if name in ALGORITHMS_NEEDING_L and not 1 <= cfg.stage1_rounds <= cfg.rounds:
        raise ConfigError("stage1_rounds", cfg.stage1_rounds,
                          f"{name} needs 1 <= stage1_rounds <= rounds ({cfg.rounds}): stage two starts from "
                          "stage one's neighbour list")
    _one_of("model", cfg.model, {"auto", "logreg", "mlp", "cnn"})
    if cfg.model == "cnn" and cfg.data.name != "cifar10":
        raise ConfigError("model", cfg.model, "the CNN takes 32x32x3 images: use it with data.name=cifar10, or model=mlp")
    _one_of("device", cfg.device, {"auto", "cpu", "cuda"})
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("device", "cuda", "no CUDA device is visible here; use device=cpu or device=auto")
    t = cfg.train
    _positive("train.lr", t.lr)
    _positive("train.lr_decay", t.lr_decay)
    if not 0.0 <= t.momentum < 1.0:
        raise ConfigError("train.momentum", t.momentum, "must lie in [0, 1)")
    _positive("train.batch_size", t.batch_size)
    _positive("train.local_epochs", t.local_epochs)
    _one_of("wandb.mode", cfg.wandb.mode, {"online", "offline"})
    from fedclust.config_methods import validate_methods

    validate_methods(cfg)
    from fedclust.data import check_data

    check_data(cfg.data, cfg.clients)
