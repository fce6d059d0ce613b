"""The config schema: typed dataclasses of the core sections, the sections
algorithms declare (registered by :mod:`fedclust.algorithms.registry`),
YAML merging with dotted overrides, and the checks of the core keys.

Every error names the field, the bad value and the fix; an unknown key names
the closest valid one.  This module imports nothing of fedclust but errors:
algorithms add their sections to it (:func:`register_section`), and
:mod:`fedclust.config` loads and validates a whole config.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
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
    """Weights & Biases tracking (rank 0).  An empty value is not passed to
    W&B, so the WANDB_* environment (WANDB_MODE, WANDB_PROJECT, ...) decides."""

    enabled: bool = False
    project: str = ""               # "" -> WANDB_PROJECT, else "fedclust"
    entity: str = ""
    mode: str = ""                  # online | offline | disabled; "" -> WANDB_MODE, else online
    group: str = ""
    name: str = ""                  # "" -> WANDB_NAME, else the run directory's name
    tags: list = field(default_factory=list)


# Sections declared by algorithms: name -> dataclass (fedclust.algorithms.registry fills it).
SECTIONS: dict[str, type] = {}


def register_section(name: str, cls: type) -> None:
    """Add an algorithm's config section ``name`` (a dataclass with defaults
    and a ``validate(cfg)`` method).  The same class may be registered again
    (two algorithms sharing a section); another class under a taken name is
    refused, as is a name of a core key."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"config section '{name}' must be a dataclass, got {cls!r}")
    if name in CORE_KEYS:
        raise ValueError(f"config section '{name}' would hide the core key '{name}'; choose another name")
    if SECTIONS.get(name, cls) is not cls:
        raise ValueError(f"config section '{name}' is registered twice, by {SECTIONS[name].__qualname__} and "
                         f"{cls.__qualname__}")
    SECTIONS[name] = cls


def _default_sections() -> dict:
    return {name: cls() for name, cls in SECTIONS.items()}


RESUME_MODES = ("auto", "never", "require")


@dataclass
class Config:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
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
    plugins: list = field(default_factory=list)  # modules or .py files that register more algorithms
    checkpoint_every: int = 0       # rounds between checkpoints; 0: by the clock (5 min or 50x a checkpoint's cost); always at the end and on a signal
    resume: str = "auto"            # auto: continue from out's newest checkpoint if any | never | require
    overwrite: bool = False         # true: a run in out that this config cannot continue is replaced, not refused
    collective_timeout: float = 600.0  # seconds a collective may wait for the other ranks before the run stops
    # sections of the registered algorithms (pens, panm, fedprox, ...), reached as cfg.<name>
    sections: dict = field(default_factory=_default_sections, repr=False)

    def __getattr__(self, name: str):
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"config has no key or section '{name}'")


CORE_KEYS = {f.name for f in dataclasses.fields(Config)}


# ----------------------------------------------------------------------------
# Loading and overrides

def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name != "sections"}


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
    """Every dotted key a config file or override may set (the core keys,
    then each registered section's)."""
    keys = _valid_keys(Config)
    for name, cls in SECTIONS.items():
        keys += _valid_keys(cls, name + ".")
    return keys


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
    if tp is list:   # a list of strings; one string may stand for a list of one
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        if value is None:
            return []
        raise ConfigError(path, value, "expected a list of strings, e.g. [my_package.my_algorithm]")
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
    sections = obj.__dict__.get("sections") if isinstance(obj, Config) else None
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if sections is not None and key in sections:
            _merge(sections[key], value or {}, path + ".")
            continue
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


def read_yaml(path) -> dict:
    """The mapping in a YAML config file (ConfigError naming the file if it is missing or not YAML)."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise ConfigError("CONFIG", str(path), "no such file; pass a YAML file such as configs/fmnist_rotation2.yaml")
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError("CONFIG", str(path), f"not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise ConfigError("CONFIG", str(path), "must hold a mapping of keys, e.g. 'clients: 100'")
    return raw


def parse(raw: dict | None, overrides=()) -> Config:
    """A Config from a YAML mapping and ``KEY=VALUE`` overrides, types
    checked, values not yet validated (:func:`fedclust.config.load_config`
    does both)."""
    cfg = Config()
    if raw:
        _merge(cfg, raw)
    for text in overrides:
        key, value = parse_override(text)
        set_key(cfg, key, value)
    return cfg


def to_dict(cfg: Config) -> dict:
    """Core keys, then every section, as plain nested dicts (config.yaml, W&B)."""
    out = {f.name: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else (list(v) if isinstance(v, list) else v)
           for f in dataclasses.fields(cfg) if f.name != "sections" for v in [getattr(cfg, f.name)]}
    for name, section in cfg.sections.items():
        out[name] = dataclasses.asdict(section)
    return out


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


# ----------------------------------------------------------------------------
# Validation: the one place every value is checked.

def one_of(path: str, value: Any, allowed, why: str = "") -> None:
    """Refuse a value outside ``allowed``, naming the closest allowed one and, if given, what the key means."""
    if value not in allowed:
        close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ConfigError(path, value, f"must be one of {sorted(allowed)}{hint}" + (f": {why}" if why else ""))


def _positive(path: str, value: float, strict: bool = True) -> None:
    if value < 0 or (strict and value == 0):
        raise ConfigError(path, value, "must be > 0" if strict else "must be >= 0")


def finite(path: str, value, fix: str, low: float = 0.0, strict: bool = True) -> None:
    """Refuse a value that is not a finite number above ``low`` (or at least ``low`` when not strict)."""
    v = float(value)
    if not math.isfinite(v) or v < low or (strict and v == low):
        raise ConfigError(path, value, fix)


def validate_core(cfg: Config) -> None:
    """The checks of the core keys (the algorithm's own, its sections' and
    the data's are made by :func:`fedclust.config.validate`)."""
    _positive("clients", cfg.clients)
    if cfg.clients < 2:
        raise ConfigError("clients", cfg.clients, "federated learning needs at least 2 clients")
    _positive("rounds", cfg.rounds)
    _positive("stage1_rounds", cfg.stage1_rounds, strict=False)
    _positive("eval_every", cfg.eval_every)
    _positive("algorithm.tau", cfg.algorithm.tau)
    if not 0.0 <= cfg.algorithm.alpha <= 1.0:
        raise ConfigError("algorithm.alpha", cfg.algorithm.alpha, "must lie in [0, 1]")
    if not 0.0 < cfg.participation <= 1.0:
        raise ConfigError("participation", cfg.participation, "must lie in (0, 1]: the share of clients per round")
    one_of("model", cfg.model, {"auto", "logreg", "mlp", "cnn"})
    if cfg.model == "cnn" and cfg.data.name != "cifar10":
        raise ConfigError("model", cfg.model, "the CNN takes 32x32x3 images: use it with data.name=cifar10, or model=mlp")
    one_of("device", cfg.device, {"auto", "cpu", "cuda"})
    t = cfg.train
    _positive("train.lr", t.lr)
    _positive("train.lr_decay", t.lr_decay)
    if not 0.0 <= t.momentum < 1.0:
        raise ConfigError("train.momentum", t.momentum, "must lie in [0, 1)")
    _positive("train.batch_size", t.batch_size)
    _positive("train.local_epochs", t.local_epochs)
    one_of("wandb.mode", cfg.wandb.mode, {"", "online", "offline", "disabled"})
    if not isinstance(cfg.wandb.tags, list) or not all(isinstance(t, str) and t for t in cfg.wandb.tags):
        raise ConfigError("wandb.tags", cfg.wandb.tags, "must be a list of non-empty strings, e.g. wandb.tags=[panm,cifar]")
    if cfg.checkpoint_every < 0:
        raise ConfigError("checkpoint_every", cfg.checkpoint_every,
                          "must be >= 0 rounds between checkpoints (0: by the clock, every 5 minutes or 50x the last "
                          "checkpoint's cost; always at the end and on SIGUSR1/SIGTERM)")
    one_of("resume", cfg.resume, set(RESUME_MODES))
    finite("collective_timeout", cfg.collective_timeout,
           "must be a finite number of seconds > 0 (how long a rank waits for the others in a collective)")
