"""Name -> algorithm class.  Refuses unknown and duplicate names.

An algorithm registers itself where it is defined (``@register`` on its
class); the built-in ones are found by importing every module of
:mod:`fedclust.algorithms`, plugins by importing them (``plugins`` key,
:func:`fedclust.config.load_plugin`).  There is no list of names anywhere.
"""

from __future__ import annotations

import difflib
import inspect

from fedclust import schema
from fedclust.algorithms.base import Algorithm, RunFacts
from fedclust.errors import ConfigError
from fedclust.importing import import_submodules

_CLASSES: dict[str, type[Algorithm]] = {}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make ``cls`` selectable as ``algorithm.name = cls.name``
    and add its config sections to the schema."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise TypeError(f"only Algorithm subclasses can be registered, got {cls!r}")
    name = cls.name
    if not name or not name.isidentifier():
        raise ValueError(f"{cls.__qualname__}.name must be a non-empty identifier, got {name!r}")
    if name in _CLASSES:
        raise ValueError(f"algorithm '{name}' is registered twice: by {_CLASSES[name].__module__}."
                         f"{_CLASSES[name].__qualname__} and {cls.__module__}.{cls.__qualname__}")
    if cls.topology not in ("peer", "server"):
        raise ValueError(f"{cls.__qualname__}.topology must be 'peer' or 'server', got {cls.topology!r}")
    for section, section_cls in cls.sections.items():
        if not callable(getattr(section_cls, "validate", None)):
            raise TypeError(f"config section '{section}' of '{name}' needs a validate(self, cfg) method")
        schema.register_section(section, section_cls)
    _CLASSES[name] = cls
    return cls


def names() -> list[str]:
    load_builtin()
    return sorted(_CLASSES)


def classes() -> list[type[Algorithm]]:
    """Every registered class, in the order they were registered."""
    load_builtin()
    return list(_CLASSES.values())


def builtin_names() -> list[str]:
    """The algorithms that ship with fedclust (not plugins)."""
    load_builtin()
    return sorted(n for n, c in _CLASSES.items() if c.__module__.startswith("fedclust.algorithms."))


def get(name: str) -> type[Algorithm]:
    load_builtin()
    if name not in _CLASSES:
        close = difflib.get_close_matches(str(name), list(_CLASSES), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError("algorithm.name", name, f"{hint}known: {', '.join(sorted(_CLASSES))} (more with "
                          "plugins=[module])")
    return _CLASSES[name]


def build(cfg, facts: RunFacts | None = None) -> Algorithm:
    """The algorithm object for ``cfg.algorithm.name``: ``from_config(cfg, facts)`` for one whose from_config
    takes ``facts`` (:class:`fedclust.algorithms.base.RunFacts`), else ``from_config(cfg)``."""
    cls = get(cfg.algorithm.name)
    if "facts" in inspect.signature(cls.from_config).parameters:
        if facts is None:
            raise ValueError(f"{cls.name} needs the run's facts (fedclust.config.run_facts(cfg))")
        return cls.from_config(cfg, facts)
    return cls.from_config(cfg)


_loaded = False


def load_builtin() -> None:
    """Import every module of fedclust.algorithms once (each registers what it defines)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import_submodules("fedclust.algorithms")
