"""Name -> data set class.  Refuses unknown and duplicate names.

A data set registers itself where it is defined (``@register`` on its
:class:`fedclust.data.base.DataSet` subclass); the built-in ones are found by
importing every module of :mod:`fedclust.data.sets`, plugins by importing
them (``plugins`` key, :func:`fedclust.config.load_plugin`, before the
config is checked).  There is no list of names anywhere.

``get("fmnist")`` gives a data set object; a class with ``takes_argument``
is named ``NAME:ARGUMENT`` (``get("torchvision:KMNIST")``).
"""

from __future__ import annotations

import difflib

from fedclust.data.base import KINDS, DataSet
from fedclust.errors import ConfigError
from fedclust.importing import import_submodules

_CLASSES: dict[str, type[DataSet]] = {}
BUILTIN_PACKAGE = "fedclust.data.sets"


def register(cls: type[DataSet]) -> type[DataSet]:
    """Class decorator: make ``cls`` selectable as ``data.name = cls.name``."""
    if not (isinstance(cls, type) and issubclass(cls, DataSet)):
        raise TypeError(f"only DataSet subclasses can be registered, got {cls!r}")
    name = cls.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{cls.__qualname__}.name must be a non-empty identifier, got {name!r}")
    if name in _CLASSES:
        raise ValueError(f"data set '{name}' is registered twice: by {_CLASSES[name].__module__}."
                         f"{_CLASSES[name].__qualname__} and {cls.__module__}.{cls.__qualname__}")
    if cls.kind not in KINDS:
        raise ValueError(f"{cls.__qualname__}.kind must be one of {', '.join(KINDS)}, got {cls.kind!r}")
    if cls.default_model not in ("logreg", "mlp", "cnn"):
        raise ValueError(f"{cls.__qualname__}.default_model must be logreg, mlp or cnn, got {cls.default_model!r}")
    _CLASSES[name] = cls
    return cls


def _shown(cls: type[DataSet]) -> str:
    return f"{cls.name}:{cls.argument_help or 'NAME'}" if cls.takes_argument else cls.name


def names() -> list[str]:
    """Every registered name as written in data.name (``torchvision:NAME`` for a class taking an argument)."""
    load_builtin()
    return sorted(_shown(c) for c in _CLASSES.values())


def builtin_names() -> list[str]:
    load_builtin()
    return sorted(_shown(c) for c in _CLASSES.values() if c.__module__.startswith(BUILTIN_PACKAGE + "."))


def find(name) -> DataSet | None:
    """The data set of ``name``, or None when no registered data set has it (no error)."""
    load_builtin()
    base, sep, argument = str(name).partition(":")
    cls = _CLASSES.get(base)
    if cls is None or bool(sep) != cls.takes_argument or (sep and not argument):
        return None
    return cls(argument) if cls.takes_argument else cls()


def get(name, field: str = "data.name") -> DataSet:
    """The data set of ``name``; ConfigError naming the value, the closest name and the known ones."""
    found = find(name)
    if found is not None:
        return found
    base, sep, argument = str(name).partition(":")
    cls = _CLASSES.get(base)
    if cls is not None and cls.takes_argument:
        example = f" (e.g. {base}:{cls.argument_example})" if cls.argument_example else ""
        raise ConfigError(field, name, f"write {_shown(cls)}{example}")
    if cls is not None:
        raise ConfigError(field, name, f"'{base}' takes no ':{argument}'; write data.name={base}")
    close = difflib.get_close_matches(base, list(_CLASSES), n=1)
    hint = f"did you mean '{_shown(_CLASSES[close[0]])}'? " if close else ""
    raise ConfigError(field, name, f"{hint}known: {', '.join(names())} (more with plugins=[module])")


_loaded = False


def load_builtin() -> None:
    """Import every module of fedclust.data.sets once (each registers what it defines)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    import_submodules(BUILTIN_PACKAGE)
