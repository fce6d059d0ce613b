"""Name -> class, for each kind of plug-in (algorithms, data sets, models).

A plug-in registers itself where it is defined (``@register`` on its
class); the built-in ones are found by importing every module of their
package once, plugins by importing them (``plugins`` key).  There is no
list of names anywhere.  Unknown names are refused naming the closest one
and the known ones; a name registered twice is refused naming both places.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, TypeVar

from fedclust.errors import ConfigError
from fedclust.importing import import_submodules

T = TypeVar("T", bound=type)


def _registered_name(cls: type) -> str:
    """A registered class's ``name`` (:meth:`Registry.register` checks that it is an identifier)."""
    return getattr(cls, "name")


class Registry(Generic[T]):
    """The registered classes of one kind.

    ``kind``: what they are ("algorithm"), in messages; ``base``: the class
    each must derive from; ``field``: the config key that names one
    (``algorithm.name``); ``package``: where the built-in ones live;
    ``check``: more checks of a class at registration (raising ValueError or
    TypeError); ``shown``: a class's name as the config writes it."""

    def __init__(self, kind: str, base: type, field: str, package: str,
                 check: Callable[[T], None] | None = None, shown: Callable[[T], str] | None = None):
        self.kind, self.base, self.field, self.package = kind, base, field, package
        self._check = check
        self._shown: Callable[[T], str] = shown or _registered_name
        self._classes: dict[str, T] = {}
        self._loaded = False

    def register(self, cls: T) -> T:
        """Class decorator: make ``cls`` selectable as ``<field> = cls.name``."""
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"only {self.base.__name__} subclasses can be registered as a {self.kind}, got {cls!r}")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{cls.__qualname__}.name must be a non-empty identifier, got {name!r}")
        if name in self._classes:
            old = self._classes[name]
            raise ValueError(f"{self.kind} '{name}' is registered twice: by {old.__module__}.{old.__qualname__} and "
                             f"{cls.__module__}.{cls.__qualname__}")
        if self._check is not None:
            self._check(cls)
        self._classes[name] = cls
        return cls

    def load_builtin(self) -> None:
        """Import every module of the built-in package once (each registers what it defines)."""
        if not self._loaded:
            self._loaded = True
            import_submodules(self.package)

    def classes(self) -> list[T]:
        """Every registered class, in the order they were registered."""
        self.load_builtin()
        return list(self._classes.values())

    def names(self) -> list[str]:
        """Every registered name as the config writes it, sorted."""
        return sorted(self._shown(c) for c in self.classes())

    def builtin_names(self) -> list[str]:
        """The names that ship with fedclust (not plugins)."""
        return sorted(self._shown(c) for c in self.classes() if c.__module__.startswith(self.package + "."))

    def find(self, name: str) -> T | None:
        """The class registered as ``name``, or None (no error)."""
        self.load_builtin()
        return self._classes.get(str(name))

    def get(self, name: str) -> T:
        """The class registered as ``name``; ConfigError naming the value, the closest name and the known ones."""
        found = self.find(name)
        if found is None:
            raise ConfigError(self.field, name, self.unknown(name))
        return found

    def unknown(self, name: str) -> str:
        """The fix for a name nothing is registered as: the closest one and every known one."""
        close = difflib.get_close_matches(str(name), list(self._classes), n=1)
        hint = f"did you mean '{self._shown(self._classes[close[0]])}'? " if close else ""
        return f"{hint}known: {', '.join(self.names())} (more with plugins=[module])"
