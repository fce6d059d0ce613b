"""Test plug-in: a data set added by one file.  ``blobs`` is a client-kind
data set of 2-D Gaussian blobs whose cluster decides which way the label
boundary runs; loaded with ``plugins=[tests/plugins/tiny_blobs.py]`` and
``data.name=blobs``."""

import torch

from fedclust.data.base import DataSet, FederatedData, positive_int
from fedclust.data.partition import cluster_of_clients
from fedclust.data.registry import register
from fedclust.errors import ConfigError


@register
class Blobs(DataSet):
    name = "blobs"
    kind = "client"
    default_model = "logreg"

    def input_shape(self, cfg):
        return (2,)

    def num_classes(self, cfg):
        return 2

    def check(self, cfg, num_clients):
        for field in ("train_size", "test_size"):
            positive_int(f"data.{field}", getattr(cfg, field))
        if num_clients < cfg.num_clusters or cfg.num_clusters not in (1, 2):
            raise ConfigError("data.num_clusters", cfg.num_clusters, "blobs has 1 or 2 clusters")

    def load(self, cfg, num_clients, seed, ids, device):
        clusters = cluster_of_clients(num_clients, cfg.num_clusters)
        m = cfg.train_size + cfg.test_size
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(num_clients, m, 2, generator=gen)[ids]
        axis = clusters[ids]                                   # cluster 0: sign of x0, cluster 1: of x1
        y = (x.gather(2, axis[:, None, None].expand(-1, m, 1)).squeeze(2) > 0).long()
        t = cfg.train_size
        return FederatedData(x[:, :t].contiguous().to(device), y[:, :t].contiguous().to(device),
                             x[:, t:].contiguous().to(device), y[:, t:].contiguous().to(device),
                             clusters.to(device), ids.to(device), (2,), 2)
