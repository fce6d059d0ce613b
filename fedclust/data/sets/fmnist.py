"""Fashion-MNIST (docs/algorithms.md): its four IDX files in data.root, torchvision's layout or the Debian
package ``dataset-fashion-mnist``; downloaded through torchvision only when none has them."""

from __future__ import annotations

from fedclust.data.base import PoolDataSet, RawData
from fedclust.data.registry import register
from fedclust.data.sources import load_fmnist
from fedclust.schema import DataConfig


@register
class FashionMNIST(PoolDataSet):
    name = "fmnist"
    default_model = "mlp"
    report_order = 1
    reference = dict(clients=100, rounds=300, train_size=200, model="mlp")   # PANM paper Table 2's setting
    shape = (1, 28, 28)
    classes = 10
    mean, std = (0.2860,), (0.3530,)
    counts = ((6000,) * 10, (1000,) * 10)

    def raw(self, cfg: DataConfig) -> RawData:
        return load_fmnist(cfg.root, cfg.download)
