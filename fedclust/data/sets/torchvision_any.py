"""``data.name=torchvision:NAME``: any torchvision classification data set
whose class takes ``train=True/False`` and exposes ``.data`` and ``.targets``
(KMNIST, MNIST, FashionMNIST, QMNIST, CIFAR10, CIFAR100, ...), as a pool
split over clients like fmnist.

``data.options`` are more keyword arguments of the class (``{split: balanced}``
for EMNIST), checked against its constructor's signature before it is called
(:func:`fedclust.data.sources.check_options`); they are part of the run's
config, so a resume with others is refused and a report keeps them apart.

Read from ``data.root`` in torchvision's layout; with ``data.download=true``
torchvision downloads what is missing.  The download happens in the config
check, which every rank runs before any process group exists; the ranks of
one machine take an exclusive file lock on ``data.root/.fedclust-download.lock``
around it (:func:`fedclust.data.sources.download_lock`), so one downloads and
the others then find the files.  Without network the error names the folder
to fill.  Checking reads the images (their shape, class counts and
statistics are not known before), once per process.

Inputs: images as [channels, H, W]; uint8 scaled to [0, 1]; normalised by the
training split's per-channel mean and standard deviation.  Classes: the
class's ``classes`` list when it has one, else the largest label + 1.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from fedclust.data.base import PoolDataSet, RawData
from fedclust.data.registry import register
from fedclust.data.sources import frozen_options, load_torchvision
from fedclust.errors import ConfigError
from fedclust.schema import DataConfig


def _scaled(x: torch.Tensor) -> torch.Tensor:
    """uint8 images to [0, 1] float32; other inputs as float32."""
    return x.to(torch.float32).div(255) if x.dtype == torch.uint8 else x.to(torch.float32)


@functools.lru_cache(maxsize=8)
def _summary(argument: str, root: str, download: bool, label: str, frozen: tuple) -> tuple:
    """(classes, per-channel mean, per-channel std) of a data set's splits (under its options, ``frozen``),
    computed once per process."""
    from torchvision import datasets

    raw = load_torchvision(argument, root, download, label, dict(frozen))
    named = getattr(getattr(datasets, argument), "classes", None)
    top = max(int(raw.train_y.max()), int(raw.test_y.max())) + 1
    k = max(top, len(named) if isinstance(named, (list, tuple)) else 0)
    x = _scaled(raw.train_x).to(torch.float64)
    dims = [0, 2, 3] if x.ndim == 4 else list(range(x.ndim))
    mean, std = x.mean(dim=dims).reshape(-1), x.std(dim=dims, unbiased=False).reshape(-1)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return k, tuple(float(v) for v in mean), tuple(float(v) for v in std)


@register
class TorchvisionAny(PoolDataSet):
    name = "torchvision"
    takes_argument = True
    takes_options = True    # data.options: keyword arguments of the class (EMNIST's split)
    argument_help = "NAME"
    argument_example = "KMNIST"
    default_model = "mlp"
    scale = None            # uint8 images are scaled to [0, 1] by normalize below

    def _class(self):
        from torchvision import datasets

        cls = getattr(datasets, str(self.argument), None)
        if not isinstance(cls, type):
            import difflib

            known = [k for k, v in vars(datasets).items() if isinstance(v, type) and not k.startswith("_")]
            close = difflib.get_close_matches(str(self.argument), known, n=1)
            hint = f"did you mean 'torchvision:{close[0]}'? " if close else ""
            raise ConfigError("data.name", self.full_name, f"{hint}torchvision.datasets has no class "
                              f"'{self.argument}' (the name is case-sensitive, e.g. torchvision:KMNIST)")
        return cls

    def raw(self, cfg: DataConfig) -> RawData:
        self._class()
        return load_torchvision(str(self.argument), cfg.root, cfg.download, label=self.full_name,
                                options=cfg.options)

    def _summary(self, cfg: DataConfig) -> tuple:
        raw = self.raw(cfg)   # refuses an unknown class, names the folder when missing
        del raw
        return _summary(str(self.argument), str(Path(cfg.root).expanduser().resolve()), bool(cfg.download),
                        self.full_name, frozen_options(cfg.options))

    def input_shape(self, cfg: DataConfig) -> tuple[int, ...]:
        return tuple(self.raw(cfg).train_x.shape[1:])

    def num_classes(self, cfg: DataConfig) -> int:
        return self._summary(cfg)[0]

    def normalization(self, cfg: DataConfig):
        return self._summary(cfg)[1:]

    def normalize(self, cfg: DataConfig, x: torch.Tensor) -> torch.Tensor:
        return super().normalize(cfg, _scaled(x))
