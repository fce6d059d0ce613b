"""Federated data (docs/algorithms.md): every client's train and test tensors, its
true cluster, built identically on every process.

The data sets are plug-ins: each is a class in its own module
(:mod:`fedclust.data.sets`, or a plugin file) registered by name in
:mod:`fedclust.data.registry`; :mod:`fedclust.data.base` says what one
declares.  ``load_federated`` asks the data set for the held clients' rows,
each a pure function of (cfg, num_clients, seed), so a multi-process run
gives each process the same data for its clients as a one-process run.
``check_data`` validates the config before anything else is read (reading
no image where the data set can).  See ``partition`` (split, transforms),
``sources`` (the built-in image sets' readers), ``synthetic`` (FedProx's
Synthetic(alpha, beta), clustered by (W, b)), ``npz`` (your own arrays).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedclust.data import registry
from fedclust.data.base import LAYOUT_KEYS, DataSet, FederatedData, PoolDataSet, refuse_layout
from fedclust.data.partition import cluster_of_clients
from fedclust.errors import ConfigError
from fedclust.schema import DataConfig

__all__ = ["DataSet", "FederatedData", "check_data", "cluster_of_clients", "dataset", "load_federated", "registry"]


def dataset(cfg: DataConfig) -> DataSet:
    """The data set ``cfg.name`` names (ConfigError when none does)."""
    return registry.get(cfg.name)


def check_data(cfg: DataConfig, num_clients: int) -> None:
    """Validate the data config (raises ConfigError naming the field, the value
    and the fix, or DataError for a bad data file)."""
    ds = dataset(cfg)
    if cfg.options and not ds.takes_options:   # a config slip, named before the data is read
        takers = ", ".join(registry.taking_options())
        raise ConfigError("data.options", cfg.options,
                          f"data set {cfg.name!r} takes no options (only {takers} read them, e.g. the keyword "
                          "arguments of the torchvision class of data.name=torchvision:NAME: "
                          "data.options.split=balanced for torchvision:EMNIST): drop data.options (leave it {})")
    ds.check(cfg, num_clients)   # a data set's own words first; then what it would ignore
    if cfg.normalize != "standard" and not isinstance(ds, PoolDataSet):
        raise ConfigError("data.normalize", cfg.normalize,
                          f"data set {cfg.name!r} makes its own inputs, which are not scaled images: drop "
                          "data.normalize (leave it at its default, standard)")
    refuse_layout(cfg, tuple(f for f in LAYOUT_KEYS if f not in ds.layout_keys),
                  f"data set {cfg.name!r} does not apply it (its clients and clusters are its own)")


def _held_ids(client_ids: Sequence[int] | torch.Tensor | None, num_clients: int) -> torch.Tensor:
    if client_ids is None:
        return torch.arange(num_clients)
    ids = torch.as_tensor(client_ids, dtype=torch.int64).cpu().reshape(-1)
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= num_clients):
        raise ValueError(f"client_ids must lie in [0, {num_clients}), got {ids.tolist()[:20]}")
    return ids


def load_federated(
    cfg: DataConfig,
    num_clients: int,
    seed: int,
    client_ids: Sequence[int] | None = None,
    device: str | torch.device = "cpu",
    held: torch.Tensor | None = None,
) -> FederatedData:
    """The data of clients ``client_ids`` (all when None), a pure function of
    (cfg, num_clients, seed) row by row (docs/algorithms.md); ``held``: the
    cluster whose transform each client's rows take instead of its own (a pool's,
    :mod:`fedclust.data.drift`)."""
    check_data(cfg, num_clients)
    ds = dataset(cfg)
    ids = _held_ids(client_ids, num_clients)
    if held is None:
        return ds.load(cfg, num_clients, seed, ids, torch.device(device))
    if not isinstance(ds, PoolDataSet):
        raise ValueError(f"data set {cfg.name!r} has no cluster transform to give a client another cluster's")
    return ds.load(cfg, num_clients, seed, ids, torch.device(device), held=held)
