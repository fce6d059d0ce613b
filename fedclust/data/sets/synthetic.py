"""Clustered Synthetic(alpha, beta) of FedProx (docs/algorithms.md; the generator is
:mod:`fedclust.data.synthetic`): client kind, each cluster its own (W, b); clients in contiguous cluster
blocks, ``data.cluster_sizes`` each when given (``data.rotations`` does not apply)."""

from __future__ import annotations

import math

import torch

from fedclust.data.base import (
    DataSet,
    FederatedData,
    check_cluster_kind,
    check_cluster_sizes,
    positive_int,
    refuse_layout,
)
from fedclust.data.partition import cluster_of_clients
from fedclust.data.registry import register
from fedclust.data.synthetic import NUM_CLASSES, synthetic_clients
from fedclust.errors import ConfigError
from fedclust.schema import DataConfig

SYNTHETIC_INPUTS = ("client", "shared")


@register
class Synthetic(DataSet):
    name = "synthetic"
    kind = "client"
    layout_keys = ("cluster_sizes",)
    default_model = "logreg"
    report_order = 3
    # FPFC paper Table 1's setting (configs/synthetic_cluster4.yaml)
    reference = dict(clients=100, rounds=200, train_size=100, model="logreg")

    def input_shape(self, cfg: DataConfig) -> tuple[int, ...]:
        return (cfg.synthetic_dim,)

    def num_classes(self, cfg: DataConfig) -> int:
        return NUM_CLASSES

    def check(self, cfg: DataConfig, num_clients: int) -> None:
        check_cluster_kind(cfg)
        if not isinstance(cfg.num_clusters, int) or cfg.num_clusters < 1:
            raise ConfigError("data.num_clusters", cfg.num_clusters, "use a positive integer")
        refuse_layout(cfg, ("rotations",), "Synthetic's clusters differ by their own (W, b), not by a rotation")
        check_cluster_sizes(cfg, num_clients)
        if not isinstance(cfg.synthetic_dim, int) or cfg.synthetic_dim < 1:
            raise ConfigError("data.synthetic_dim", cfg.synthetic_dim, "use a positive integer (FedProx: 60)")
        for field in ("synthetic_alpha", "synthetic_beta"):
            v = getattr(cfg, field)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"data.{field}", v, "use a finite number >= 0 (a standard deviation)")
        if cfg.synthetic_inputs not in SYNTHETIC_INPUTS:
            raise ConfigError("data.synthetic_inputs", cfg.synthetic_inputs,
                              f"use one of {', '.join(SYNTHETIC_INPUTS)} (client: each client's inputs around its "
                              "own mean, as FedProx; shared: every client's around one mean)")
        for field in ("train_size", "test_size"):
            positive_int(f"data.{field}", getattr(cfg, field))
        if not isinstance(num_clients, int) or num_clients < cfg.num_clusters:
            raise ConfigError(
                "clients", num_clients, f"use at least data.num_clusters={cfg.num_clusters} clients"
            )

    def load(self, cfg: DataConfig, num_clients: int, seed: int, ids: torch.Tensor,
             device: torch.device) -> FederatedData:
        clusters = cluster_of_clients(num_clients, cfg.num_clusters, cfg.cluster_sizes)
        x, y = synthetic_clients(
            seed, ids, clusters[ids], cfg.train_size + cfg.test_size, cfg.synthetic_dim,
            cfg.synthetic_alpha, cfg.synthetic_beta, shared_inputs=cfg.synthetic_inputs == "shared",
        )
        x, y = x.to(device), y.to(device)
        t = cfg.train_size
        return FederatedData(
            train_x=x[:, :t].contiguous(), train_y=y[:, :t].contiguous(),
            test_x=x[:, t:].contiguous(), test_y=y[:, t:].contiguous(),
            clusters=clusters.to(device), client_ids=ids.to(device),
            input_shape=self.input_shape(cfg), num_classes=NUM_CLASSES, source=None,
        )
