"""MNIST (docs/algorithms.md), read through torchvision."""

from __future__ import annotations

from fedclust.data.base import PoolDataSet, RawData
from fedclust.data.registry import register
from fedclust.data.sources import load_torchvision
from fedclust.schema import DataConfig


@register
class MNIST(PoolDataSet):
    name = "mnist"
    default_model = "mlp"
    report_order = 0
    reference = dict(clients=100, rounds=300, train_size=200, model="mlp")   # PANM paper Table 2's setting
    shape = (1, 28, 28)
    classes = 10
    mean, std = (0.1307,), (0.3081,)     # the usual published constants of the training split
    # images per class of the (train, test) splits: MNIST is not exactly balanced
    counts = ((5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949),
              (980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009))

    def raw(self, cfg: DataConfig) -> RawData:
        return load_torchvision("MNIST", cfg.root, cfg.download, label="mnist")
