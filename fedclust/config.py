"""Loading a whole experiment config: plugins first (they add algorithms and
their sections), then the YAML file and the overrides, then every check —
the core keys (:mod:`fedclust.schema`), the chosen algorithm's own and its
sections' (:class:`fedclust.algorithms.base.Algorithm.check`), the data —
before any process group starts or any data is read.

The schema names are re-exported here, so ``from fedclust.config import
Config, load_config`` is all a script needs.
"""

from __future__ import annotations

from pathlib import Path

import torch

from fedclust.algorithms import registry
from fedclust.data import check_data
from fedclust.errors import ConfigError
from fedclust.importing import import_target
from fedclust.dist import resolve_device
from fedclust.models import cnn_side, is_user_model, make_net, model_spec
from fedclust.schema import (SECTIONS, AlgorithmConfig, Config, DataConfig, TrainConfig, WandbConfig,  # noqa: F401
                             dump, parse, parse_override, read_yaml, set_key, to_dict, valid_keys, validate_core)


def load_plugin(spec: str) -> None:
    """Import a plugin: a module name (``my_lab.algorithms``) or a ``.py``
    file; importing it registers its algorithms and data sets.  Importing twice is a no-op."""
    import_target(spec, "plugins", "give an importable module name or the path of a .py file")


def _plugins_named(raw: dict, overrides) -> list[str]:
    found = raw.get("plugins") or []
    found = [found] if isinstance(found, str) else list(found)
    for text in overrides:
        key, value = parse_override(text)
        if key == "plugins":
            found += [value] if isinstance(value, str) else list(value or [])
    return [str(p) for p in found]


def load_algorithms(raw: dict, overrides=()) -> None:
    """Register the built-in algorithms and the plugins a config names (their sections become valid keys,
    their data sets valid data.name values): before the config is parsed and checked."""
    registry.load_builtin()
    for spec in _plugins_named(raw, overrides):
        load_plugin(spec)


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML file (or start from defaults), apply overrides, validate."""
    raw = read_yaml(path) if path is not None else {}
    load_algorithms(raw, overrides)
    cfg = parse(raw, overrides)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Every check of a parsed config: core keys, the algorithm and its
    sections, the device, the data."""
    validate_core(cfg)
    algorithm = registry.get(cfg.algorithm.name)
    algorithm.check(cfg)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "cuda", "no CUDA device is visible here; use device=cpu or device=auto")
    check_data(cfg.data, cfg.clients)   # data-set plugins were imported with the algorithms' (load_algorithms)
    arch, shape, _ = model_spec(cfg)
    if arch == "cnn" and (len(shape) != 3 or min(cnn_side(s) for s in shape[1:]) < 1):
        raise ConfigError("model", cfg.model, f"the cnn needs image inputs (channels, height, width) of at least "
                          f"18x18, but {cfg.data.name}'s inputs have shape {list(shape)}; use model=mlp")
    if is_user_model(arch) or cfg.engine == "loop":   # built, checked and its engine chosen before anything starts
        make_net(arch, shape, model_spec(cfg)[2], cfg.engine, resolve_device(cfg.device), cfg.seed)
