"""Name -> built-in model (:class:`fedclust.registry.Registry`): one file per
model in :mod:`fedclust.models` registers its
:class:`~fedclust.models.base.BuiltinModel`; the config's choices, the data
sets' ``default_model`` and the engine read this registry, not a list."""

from __future__ import annotations

from functools import cache

from fedclust.errors import ConfigError
from fedclust.models.base import BuiltinModel
from fedclust.registry import Registry


def _check(cls: type[BuiltinModel]) -> None:
    for alias in cls.aliases:
        owner = next((c for c in MODELS._classes.values() if alias == c.name or alias in c.aliases), None)
        if owner is not None:
            raise ValueError(f"model alias '{alias}' of '{cls.name}' is already '{owner.name}''s")


MODELS: Registry[type[BuiltinModel]] = Registry("model", BuiltinModel, "model", "fedclust.models", check=_check)


def register(cls: type[BuiltinModel]) -> type[BuiltinModel]:
    """Class decorator: make ``cls`` selectable as ``model = cls.name``."""
    return MODELS.register(cls)


def names() -> list[str]:
    return MODELS.names()


@cache
def builtin(name: str) -> BuiltinModel:
    """The built-in model ``name`` (one object each, shared: models hold no state)."""
    return MODELS.get(name)()


def aliases() -> dict[str, str]:
    """{a word users write for a model: the model} (``logistic`` -> ``logreg``), as the models declare them."""
    return {alias: c.name for c in MODELS.classes() for alias in c.aliases}


def unknown_model(value: str) -> ConfigError:
    """The error for a ``model`` value that names no built-in and no user model."""
    meant = aliases().get(str(value).lower())
    hint = f"did you mean '{meant}'? " if meant else ""
    return ConfigError("model", value, f"{hint}choose one of {', '.join(names())} (or 'auto'), or your own "
                       "module as FILE.py:NAME or package.module:NAME")
