"""Reading the built-in image data sets (docs/algorithms.md) as raw uint8
tensors ``[N, C, H, W]`` with int64 labels, once per process.  What each data
set declares (shape, classes, normalisation) is in its own module of
:mod:`fedclust.data.sets`; this module holds the readers they share.

- Through torchvision (:func:`load_torchvision`: MNIST, CIFAR-10 and any
  ``torchvision:NAME``): ``root=data.root``, ``download=data.download``.  A
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
import fcntl
import functools
import shutil
import subprocess
from pathlib import Path

import torch

from fedclust.data.base import RawData
from fedclust.data.idx import find_idx_file, read_idx
from fedclust.errors import DataError

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


def _load_torchvision(cls_name: str, root: Path, download: bool, label: str) -> RawData:
    from torchvision import datasets

    cls = getattr(datasets, cls_name)
    folder = root / torchvision_folder(cls)
    how = (
        f"run once with network and data.download=true, or copy torchvision's folder for datasets.{cls_name} "
        f"('{folder.relative_to(root)}') into data.root"
    )
    try:
        with download_lock(root, download):
            sets = [cls(str(root), train=train, download=download) for train in (True, False)]
    except TypeError as err:   # a class without train=True/False
        raise DataError(f"data set '{label}': torchvision.datasets.{cls_name} takes no train=True/False "
                        f"({err}); save its splits as an .npz and use data.name=npz") from err
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
def _torchvision_cached(cls_name: str, root: str, download: bool, label: str) -> RawData:
    return _load_torchvision(cls_name, Path(root), download, label)


def load_torchvision(cls_name: str, root: str | Path, download: bool, label: str | None = None) -> RawData:
    """The train and test splits of ``torchvision.datasets.<cls_name>`` as raw [N, C, H, W] images and int64
    labels, cached per process (treat as read-only); ``label`` names the data set in errors.  Raises
    DataError naming the folder to fill when the files are missing and cannot be downloaded."""
    return _torchvision_cached(cls_name, str(Path(root).expanduser().resolve()), bool(download),
                               label or cls_name)
