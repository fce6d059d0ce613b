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

from fedclust.data.base import KINDS, DataSet
from fedclust.errors import ConfigError
from fedclust.models.registry import MODELS
from fedclust.registry import Registry

BUILTIN_PACKAGE = "fedclust.data.sets"


def _check(cls: type[DataSet]) -> None:
    if cls.kind not in KINDS:
        raise ValueError(f"{cls.__qualname__}.kind must be one of {', '.join(KINDS)}, got {cls.kind!r}")
    if MODELS.find(cls.default_model) is None:
        raise ValueError(f"{cls.__qualname__}.default_model must be a registered model ({', '.join(MODELS.names())}), "
                         f"got {cls.default_model!r}")


def _shown(cls: type[DataSet]) -> str:
    return f"{cls.name}:{cls.argument_help or 'NAME'}" if cls.takes_argument else cls.name


DATASETS: Registry[type[DataSet]] = Registry("data set", DataSet, "data.name", BUILTIN_PACKAGE, check=_check,
                                             shown=_shown)


def register(cls: type[DataSet]) -> type[DataSet]:
    """Class decorator: make ``cls`` selectable as ``data.name = cls.name``."""
    return DATASETS.register(cls)


def names() -> list[str]:
    """Every registered name as written in data.name (``torchvision:NAME`` for a class taking an argument)."""
    return DATASETS.names()


def taking_options() -> list[str]:
    """The registered names (as written in data.name) of the data sets that read ``data.options``."""
    return sorted(_shown(c) for c in DATASETS.classes() if c.takes_options)


def builtin_names() -> list[str]:
    return DATASETS.builtin_names()


def find(name) -> DataSet | None:
    """The data set of ``name``, or None when no registered data set has it (no error)."""
    base, sep, argument = str(name).partition(":")
    cls = DATASETS.find(base)
    if cls is None or bool(sep) != cls.takes_argument or (sep and not argument):
        return None
    return cls(argument) if cls.takes_argument else cls()


def get(name, field: str = "data.name") -> DataSet:
    """The data set of ``name``; ConfigError naming the value, the closest name and the known ones."""
    found = find(name)
    if found is not None:
        return found
    base, sep, argument = str(name).partition(":")
    cls = DATASETS.find(base)
    if cls is not None and cls.takes_argument:
        example = f" (e.g. {base}:{cls.argument_example})" if cls.argument_example else ""
        raise ConfigError(field, name, f"write {_shown(cls)}{example}")
    if cls is not None:
        raise ConfigError(field, name, f"'{base}' takes no ':{argument}'; write data.name={base}")
    raise ConfigError(field, name, DATASETS.unknown(base))


def load_builtin() -> None:
    """Import every module of fedclust.data.sets once (each registers what it defines)."""
    DATASETS.load_builtin()
