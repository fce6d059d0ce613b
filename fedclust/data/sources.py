"""Base image data sets (docs/algorithms.md): MNIST, Fashion-MNIST, CIFAR-10 as raw
uint8 tensors ``[N, C, H, W]`` with int64 labels, loaded once per process.

- MNIST and CIFAR-10 come through torchvision (``root=data.root``,
  ``download=data.download``).
- Fashion-MNIST is read from a folder holding the four IDX files (``.gz`` or
  plain), looked for in ``data.root``, then ``data.root/FashionMNIST/raw``
  (torchvision's layout), then the folder of the Debian package
  ``dataset-fashion-mnist`` (found with ``dpkg -L``); only if none has them
  does torchvision download them.

Per-channel statistics (docs/algorithms.md) are the usual published constants; the
class counts let the config be checked without reading any image.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import NamedTuple

import torch

from fedclust.data.idx import find_idx_file, read_idx
from fedclust.errors import DataError

IMAGE_DATASETS = ("mnist", "fmnist", "cifar10")

INPUT_SHAPES = {"mnist": (1, 28, 28), "fmnist": (1, 28, 28), "cifar10": (3, 32, 32)}

# per-channel (mean, std) of the training split, as used with torchvision Normalize
NORMALIZATION = {
    "mnist": ((0.1307,), (0.3081,)),
    "fmnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
}

# images per class in the (train, test) splits; MNIST is not exactly balanced
CLASS_COUNTS = {
    "mnist": (
        (5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
        (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009),
    ),
    "fmnist": ((6000,) * 10, (1000,) * 10),
    "cifar10": ((5000,) * 10, (1000,) * 10),
}

FMNIST_FILES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}

DEBIAN_PACKAGE = "dataset-fashion-mnist"


class RawData(NamedTuple):
    """Raw splits: images uint8 [N, C, H, W], labels int64 [N], and the folder they were read from."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    source: str = ""


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
    paths = {k: find_idx_file(folder, stem) for k, stem in FMNIST_FILES.items()}
    if any(p is None for p in paths.values()):
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

        datasets.FashionMNIST(str(root), train=True, download=True)
        datasets.FashionMNIST(str(root), train=False, download=True)
    except Exception as err:  # network errors come in many types
        raise _missing("fmnist", folders, err, how) from err
    data = read_idx_folder(root / "FashionMNIST" / "raw")
    if data is None:
        raise _missing("fmnist", folders, None, how)
    return data


def _load_torchvision(name: str, root: Path, download: bool) -> RawData:
    from torchvision import datasets

    cls = {"mnist": datasets.MNIST, "cifar10": datasets.CIFAR10}[name]
    folder = root / ("MNIST/raw" if name == "mnist" else "cifar-10-batches-py")
    how = (
        "run once with network and data.download=true, or copy torchvision's folder "
        f"('{folder.relative_to(root)}') into data.root"
    )
    try:
        sets = [cls(str(root), train=train, download=download) for train in (True, False)]
    except Exception as err:  # RuntimeError when absent, URLError/OSError when offline
        raise _missing(name, [folder], err, how) from err
    out = []
    for ds in sets:
        x = torch.as_tensor(ds.data)
        x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)  # CIFAR is NHWC
        out += [x.to(torch.uint8).contiguous(), torch.as_tensor(ds.targets, dtype=torch.int64)]
    return RawData(*out, str(folder))


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, root: str, download: bool) -> RawData:
    if name == "fmnist":
        return _load_fmnist(Path(root), download)
    return _load_torchvision(name, Path(root), download)


def load_raw(name: str, root: str | Path, download: bool) -> RawData:
    """Raw uint8 images and labels of a base data set, cached per process.

    Treat the result as read-only: it is shared by every later call.
    Raises DataError naming the folders looked in when the set is missing.
    """
    if name not in IMAGE_DATASETS:
        raise ValueError(f"unknown image data set {name!r}; expected one of {IMAGE_DATASETS}")
    return _load_cached(name, str(Path(root).expanduser().resolve()), bool(download))
