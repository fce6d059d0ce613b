"""Name -> algorithm factory.  Refuses unknown and duplicate names."""

from __future__ import annotations

import difflib
from typing import Callable

from fedclust.errors import ConfigError

_FACTORIES: dict[str, Callable] = {}


def register(name: str, factory: Callable) -> Callable:
    if name in _FACTORIES:
        raise ValueError(f"algorithm '{name}' is registered twice")
    _FACTORIES[name] = factory
    return factory


def names() -> list[str]:
    _load_builtin()
    return sorted(_FACTORIES)


def build(cfg):
    """The algorithm object for ``cfg.algorithm.name``."""
    _load_builtin()
    name = cfg.algorithm.name
    if name not in _FACTORIES:
        close = difflib.get_close_matches(name, list(_FACTORIES), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError("algorithm.name", name, f"{hint}known: {', '.join(sorted(_FACTORIES))}")
    return _FACTORIES[name](cfg)


_loaded = False


def _load_builtin() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from fedclust.algorithms import builtin  # noqa: F401  (registers on import)
