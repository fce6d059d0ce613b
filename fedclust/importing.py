"""Importing what a config names (a ``.py`` file or a module name: plugins,
user models) and every module of a package (the built-in registries)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
import zlib
from pathlib import Path
from types import ModuleType

from fedclust.errors import ConfigError


def import_target(target: str, field: str, fix: str) -> ModuleType:
    """The module ``target`` names: a ``.py`` file, imported once under a
    name derived from its path, or an importable module.  A missing file or
    module is a ConfigError on ``field`` ending with ``fix``."""
    if not target.endswith(".py"):
        try:
            return importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise ConfigError(field, target, f"cannot import it ({exc}); {fix}") from None
    path = Path(target).expanduser().resolve()
    name = f"fedclust_file_{path.stem}_{zlib.crc32(str(path).encode()):08x}"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise ConfigError(field, target, f"no such file; {fix}")
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(field, target, f"Python cannot load it as a module file; {fix}")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        # compiled from the file's text at each import, never from a .pyc cached beside it (an edit within the
        # same second that keeps the size would be missed), and writing none into the user's folder
        exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), module.__dict__)
    except Exception:
        del sys.modules[name]
        raise
    return module


def import_submodules(package: str) -> None:
    """Import every module of ``package`` (each registers what it defines), in name order."""
    found = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(found.__path__), key=lambda m: m.name):
        importlib.import_module(f"{package}.{info.name}")
