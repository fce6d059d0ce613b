"""Reading the built-in image data sets (docs/algorithms.md) as raw uint8
tensors ``[N, C, H, W]`` with int64 labels, once per process.  What each data
set declares (shape, classes, normalisation) is in its own module of
:mod:`fedclust.data.sets`; this module holds the readers they share.

- Through torchvision (:func:`load_torchvision`: MNIST, CIFAR-10 and any
  ``torchvision:NAME``): ``root=data.root``, ``download=data.download`` and,
  for ``torchvision:NAME``, the keyword arguments of ``data.options``.  A
  download happens under an exclusive lock on ``data.root/.fedclust-download.lock``,
  so that the ranks of one machine (each checks the config, and reads the data,
  before any process group exists) download once: the first takes the lock and
  downloads, the others wait for it and then find the files.
- Fashion-MNIST (:func:`load_fmnist`) is read from a folder holding the four IDX
  files (``.gz`` or plain), looked for in ``data.root``, then
  ``data.root/FashionMNIST/raw`` (torchvision's layout), then the folder of
  the Debian package ``dataset-fashion-mnist`` (found with ``dpkg -L``); only
  if none has them does torchvision download them.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import functools
import inspect
import re
import shutil
import subprocess
from pathlib import Path

import torch

from fedclust.data.base import RawData
from fedclust.data.idx import find_idx_file, read_idx
from fedclust.errors import ConfigError, DataError

__all__ = ["RawData", "load_fmnist", "load_torchvision", "fmnist_folders", "read_idx_folder", "debian_fmnist_folder"]

FMNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}

DEBIAN_PACKAGE = "dataset-fashion-mnist"


@functools.lru_cache(maxsize=1)
def debian_fmnist_folder() -> Path | None:
    """Folder of the Debian package's IDX files, from ``dpkg -L``; None when
    dpkg or the package is missing."""
    if shutil.which("dpkg") is None:
        return None
    try:
        out = subprocess.run(
            ["dpkg", "-L", DEBIAN_PACKAGE], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    for line in out.stdout.splitlines():
        p = Path(line.strip())
        if p.name.startswith(FMNIST_FILES["train_x"]):
            return p.parent
    return None


def fmnist_folders(root: str | Path) -> list[Path]:
    """Folders searched for the four Fashion-MNIST IDX files, in order."""
    root = Path(root)
    folders = [root, root / "FashionMNIST" / "raw"]
    deb = debian_fmnist_folder()
    if deb is not None:
        folders.append(deb)
    return folders


def read_idx_folder(folder: Path) -> RawData | None:
    """The four IDX files of ``folder`` as RawData; None if any is missing."""
    found = {k: find_idx_file(folder, stem) for k, stem in FMNIST_FILES.items()}
    paths = {k: p for k, p in found.items() if p is not None}
    if len(paths) < len(found):
        return None
    t = {k: read_idx(p) for k, p in paths.items()}
    return RawData(
        t["train_x"].to(torch.uint8).unsqueeze(1), t["train_y"].long(),
        t["test_x"].to(torch.uint8).unsqueeze(1), t["test_y"].long(), str(folder),
    )


def _missing(name: str, folders: list[Path], err: Exception | None, how: str) -> DataError:
    looked = ", ".join(str(f) for f in folders)
    why = f" ({type(err).__name__}: {err})" if err is not None else ""
    return DataError(f"data set '{name}' not found; looked in: {looked}{why}. To get it: {how}")


@contextlib.contextmanager
def download_lock(root: Path, download: bool):
    """Hold an exclusive lock on ``root/.fedclust-download.lock`` while downloading (see the module doc);
    nothing when ``download`` is false."""
    if not download:
        yield
        return
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".fedclust-download.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _load_fmnist(root: Path, download: bool) -> RawData:
    folders = fmnist_folders(root)
    for folder in folders:
        data = read_idx_folder(folder)
        if data is not None:
            return data
    how = (
        f"`apt-get install {DEBIAN_PACKAGE}`, or set data.root to a folder holding the four files "
        f"{', '.join(s + '.gz' for s in FMNIST_FILES.values())}, or run once with network and "
        "data.download=true"
    )
    if not download:
        raise _missing("fmnist", folders, None, how + " (data.download is false)")
    try:
        from torchvision import datasets

        with download_lock(root, download):
            datasets.FashionMNIST(str(root), train=True, download=True)
            datasets.FashionMNIST(str(root), train=False, download=True)
    except Exception as err:  # network errors come in many types
        raise _missing("fmnist", folders, err, how) from err
    data = read_idx_folder(root / "FashionMNIST" / "raw")
    if data is None:
        raise _missing("fmnist", folders, None, how)
    return data


@functools.lru_cache(maxsize=4)
def _fmnist_cached(root: str, download: bool) -> RawData:
    return _load_fmnist(Path(root), download)


def load_fmnist(root: str | Path, download: bool) -> RawData:
    """Fashion-MNIST's raw splits, cached per process (treat as read-only).  Raises DataError naming the
    folders looked in when the files are missing."""
    return _fmnist_cached(str(Path(root).expanduser().resolve()), bool(download))


def torchvision_folder(cls) -> str:
    """The folder, relative to data.root, where torchvision's ``cls`` keeps its files."""
    base = getattr(cls, "base_folder", None)
    return base if isinstance(base, str) else f"{cls.__name__}/raw"


def as_nchw(x: torch.Tensor) -> torch.Tensor:
    """Images [N, H, W] or [N, H, W, C] (torchvision's .data) -> [N, C, H, W]; [N, C, H, W] is kept."""
    if x.ndim == 3:
        return x.unsqueeze(1)
    if x.ndim == 4 and x.shape[-1] in (1, 3, 4) and x.shape[1] not in (1, 3, 4):
        return x.permute(0, 3, 1, 2)
    return x


# Keyword arguments fedclust gives a torchvision class itself, or that would change nothing: refused in
# data.options, each with why.
NOT_OPTIONS = {
    "root": "it is data.root: set data.root=FOLDER",
    "train": "fedclust reads both splits (train=True and train=False)",
    "download": "it is data.download: set data.download=true or false",
    "transform": "fedclust reads the images as stored (.data) and normalises them itself, so no transform applies",
    "target_transform": "fedclust reads the labels as stored (.targets), so no transform applies",
    "transforms": "fedclust reads .data and .targets as stored, so no transform applies",
}


def frozen_options(options: dict | None) -> tuple:
    """``data.options`` as a hashable, ordered key of the per-process caches (lists as tuples)."""
    return tuple(sorted((str(k), tuple(v) if isinstance(v, list) else v) for k, v in (options or {}).items()))


def _thawed(frozen: tuple) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in frozen}


def keyword_arguments(cls) -> tuple[set[str], set[str], bool]:
    """``(takes, needs, more)`` of a class's constructor: the keyword arguments it names (its ``__init__``'s and,
    while each passes ``**kwargs`` on, its bases'), those its own ``__init__`` requires, and whether it may take
    others too (a ``**kwargs`` that reaches no named base, or a signature that cannot be read)."""
    takes: set[str] = set()
    needs: set[str] = set()
    first = True
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is None:
            continue
        if klass is object:
            return takes, needs, True
        try:
            params = list(inspect.signature(init).parameters.values())[1:]   # without self
        except (TypeError, ValueError):
            return takes, needs, True
        more = False
        for prm in params:
            if prm.kind is prm.VAR_KEYWORD:
                more = True
            elif prm.kind is not prm.VAR_POSITIONAL:
                takes.add(prm.name)
                if first and prm.default is prm.empty:
                    needs.add(prm.name)
        first = False
        if not more:
            return takes, needs, False
    return takes, needs, True


def check_options(cls, cls_name: str, options: dict) -> None:
    """Refuse, before the class is called, ``data.options`` it cannot take: a key fedclust gives itself
    (:data:`NOT_OPTIONS`), a keyword its constructor does not name, a required argument left out; each a
    ConfigError naming data.options, the class and the fix."""
    where = f"torchvision.datasets.{cls_name}"
    for key in options:
        if key in NOT_OPTIONS:
            raise ConfigError("data.options", options, f"'{key}' is not an option of {where}: "
                              f"{NOT_OPTIONS[key]}; drop data.options.{key}")
    takes, needs, more = keyword_arguments(cls)
    offered = sorted(takes - set(NOT_OPTIONS))
    unknown = [k for k in options if k not in takes]
    if unknown and not more:
        close = difflib.get_close_matches(unknown[0], offered, n=1)
        raise ConfigError("data.options", options,
                          f"{where} takes no argument '{unknown[0]}'"
                          + (f" (did you mean '{close[0]}'?)" if close else "")
                          + f"; it takes {', '.join(offered) or 'none but root, train and download'}")
    missing = sorted(needs - set(options) - set(NOT_OPTIONS))
    if missing:
        name = missing[0]
        values = getattr(cls, f"{name}s", None)
        one_of = (f" (one of {', '.join(map(str, values))})" if isinstance(values, (tuple, list)) and values
                  and all(isinstance(v, (str, int)) for v in values) else "")
        raise ConfigError("data.options", options, f"{where} needs the argument '{name}'{one_of}: give it as "
                          f"data.options.{name}=VALUE (in YAML: data: {{options: {{{name}: VALUE}}}})")


def _load_torchvision(cls_name: str, root: Path, download: bool, label: str, frozen: tuple = ()) -> RawData:
    from torchvision import datasets

    cls = getattr(datasets, cls_name)
    options = _thawed(frozen)
    check_options(cls, cls_name, options)
    folder = root / torchvision_folder(cls)
    how = (
        f"run once with network and data.download=true, or copy torchvision's folder for datasets.{cls_name} "
        f"('{folder.relative_to(root)}') into data.root"
    )
    try:
        with download_lock(root, download):
            sets = [cls(str(root), train=train, download=download, **options) for train in (True, False)]
    except (TypeError, ValueError) as err:
        # a keyword or value the class refused (EMNIST's split=nope: ValueError), or a class without train=True/False
        bad = re.search(r"unexpected keyword argument '(\w+)'", str(err))
        if options and (bad is None or bad.group(1) in options):
            raise ConfigError("data.options", options, f"torchvision.datasets.{cls_name} refused them "
                              f"({type(err).__name__}: {err}); give the keyword arguments and values its "
                              "documentation lists") from err
        if isinstance(err, TypeError):
            raise DataError(f"data set '{label}': torchvision.datasets.{cls_name} takes no train=True/False "
                            f"({err}); save its splits as an .npz and use data.name=npz") from err
        raise _missing(label, [folder], err, how) from err
    except Exception as err:  # RuntimeError when absent, URLError/OSError when offline
        raise _missing(label, [folder], err, how) from err
    out: list[torch.Tensor] = []
    for ds in sets:
        if not (hasattr(ds, "data") and hasattr(ds, "targets")):
            raise DataError(f"data set '{label}': torchvision.datasets.{cls_name} has no .data and .targets; "
                            "save its splits as an .npz and use data.name=npz")
        x = as_nchw(torch.as_tensor(ds.data)).contiguous()    # uint8 for the image sets
        out += [x, torch.as_tensor(ds.targets, dtype=torch.int64)]
    train_x, train_y, test_x, test_y = out
    return RawData(train_x, train_y, test_x, test_y, str(folder))


@functools.lru_cache(maxsize=8)
def _torchvision_cached(cls_name: str, root: str, download: bool, label: str, frozen: tuple) -> RawData:
    return _load_torchvision(cls_name, Path(root), download, label, frozen)


def load_torchvision(cls_name: str, root: str | Path, download: bool, label: str | None = None,
                     options: dict | None = None) -> RawData:
    """The train and test splits of ``torchvision.datasets.<cls_name>`` as raw [N, C, H, W] images and int64
    labels, cached per process (treat as read-only); ``label`` names the data set in errors; ``options``
    (``data.options``): more keyword arguments of the class (EMNIST's ``split``), checked against its
    signature first (:func:`check_options`).  Raises DataError naming the folder to fill when the files are
    missing and cannot be downloaded, ConfigError naming data.options for options the class refuses."""
    return _torchvision_cached(cls_name, str(Path(root).expanduser().resolve()), bool(download),
                               label or cls_name, frozen_options(options))
