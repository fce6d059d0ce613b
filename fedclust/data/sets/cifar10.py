"""CIFAR-10 (docs/algorithms.md), read through torchvision."""

from __future__ import annotations

from fedclust.data.base import PoolDataSet, RawData
from fedclust.data.registry import register
from fedclust.data.sources import load_torchvision
from fedclust.schema import DataConfig


@register
class CIFAR10(PoolDataSet):
    name = "cifar10"
    default_model = "cnn"
    report_order = 2
    reference = dict(clients=100, rounds=300, train_size=200, model="cnn")   # PANM paper Table 2's setting
    shape = (3, 32, 32)
    classes = 10
    mean, std = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    counts = ((5000,) * 10, (1000,) * 10)

    def raw(self, cfg: DataConfig) -> RawData:
        return load_torchvision("CIFAR10", cfg.root, cfg.download, label="cifar10")
