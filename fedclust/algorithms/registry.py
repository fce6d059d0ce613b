"""Name -> algorithm class (:class:`fedclust.registry.Registry`).

An algorithm registers itself where it is defined (``@register`` on its
class), which also makes its config sections valid keys; the built-in ones
are found by importing every module of :mod:`fedclust.algorithms`, plugins
by importing them (``plugins`` key, :func:`fedclust.config.load_plugin`).
There is no list of names anywhere.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from fedclust import schema
from fedclust.algorithms.base import Algorithm, RunFacts
from fedclust.registry import Registry


def _check(cls: type[Algorithm]) -> None:
    """An algorithm's declarations are sound; its config sections become valid keys."""
    if cls.topology not in ("peer", "server"):
        raise ValueError(f"{cls.__qualname__}.topology must be 'peer' or 'server', got {cls.topology!r}")
    for section, section_cls in cls.sections.items():
        if not callable(getattr(section_cls, "validate", None)):
            raise TypeError(f"config section '{section}' of '{cls.name}' needs a validate(self, cfg) method")
    for section, section_cls in cls.sections.items():
        schema.register_section(section, section_cls)


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", Algorithm, "algorithm.name", "fedclust.algorithms",
                                                 check=_check)


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make ``cls`` selectable as ``algorithm.name = cls.name``
    and add its config sections to the schema."""
    return ALGORITHMS.register(cls)


def names() -> list[str]:
    return ALGORITHMS.names()


def classes() -> list[type[Algorithm]]:
    """Every registered class, in the order they were registered."""
    return ALGORITHMS.classes()


def builtin_names() -> list[str]:
    """The algorithms that ship with fedclust (not plugins)."""
    return ALGORITHMS.builtin_names()


def get(name: str) -> type[Algorithm]:
    return ALGORITHMS.get(name)


def load_builtin() -> None:
    """Import every module of fedclust.algorithms once (each registers what it defines)."""
    ALGORITHMS.load_builtin()


def build(cfg, facts: RunFacts | None = None) -> Algorithm:
    """The algorithm object for ``cfg.algorithm.name``: ``from_config(cfg, facts)`` for one whose from_config
    takes ``facts`` (:class:`fedclust.algorithms.base.RunFacts`), else ``from_config(cfg)``."""
    cls = get(cfg.algorithm.name)
    if "facts" in inspect.signature(cls.from_config).parameters:
        if facts is None:
            raise ValueError(f"{cls.name} needs the run's facts (fedclust.config.run_facts(cfg))")
        # the base's from_config takes cfg alone; this class's names facts too (checked above)
        from_config: Callable[[Any, RunFacts], Algorithm] = getattr(cls, "from_config")
        return from_config(cfg, facts)
    return cls.from_config(cfg)
