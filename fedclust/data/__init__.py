"""Federated data (docs/algorithms.md): every client's train and test tensors, its
true cluster, built identically on every process.

``load_federated`` computes the assignment of images to *all* clients from
(cfg, num_clients, seed), then materializes only the asked clients, so a
multi-process run gives each process the same data for its clients as a
one-process run.  ``check_data`` validates the config without reading
images.  See ``partition`` (split, transforms), ``sources`` (base data
sets), ``synthetic`` (FedProx's Synthetic(alpha, beta), clustered by (W, b)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedclust.schema import DataConfig
from fedclust.data.partition import (
    LABEL_SWAPS,
    NUM_CLASSES,
    ROTATION_QUARTERS,
    class_demand,
    cluster_of_clients,
    federated_indices,
    max_per_client,
    normalize,
    rotate,
    swap_labels,
)
from fedclust.data.sources import CLASS_COUNTS, IMAGE_DATASETS, INPUT_SHAPES, NORMALIZATION, load_raw
from fedclust.data.synthetic import synthetic_clients
from fedclust.errors import ConfigError

__all__ = ["FederatedData", "check_data", "load_federated", "cluster_of_clients"]

DATASETS = IMAGE_DATASETS + ("synthetic",)
CLUSTER_KINDS = ("rotation", "label_swap")
SYNTHETIC_INPUTS = ("client", "shared")


@dataclass
class FederatedData:
    """The held clients' data; row c of each tensor is client ``client_ids[c]``."""

    train_x: torch.Tensor        # [C, train_size, *input_shape] float32, normalized (docs/algorithms.md)
    train_y: torch.Tensor        # [C, train_size] int64
    test_x: torch.Tensor         # [C, test_size, *input_shape]
    test_y: torch.Tensor         # [C, test_size]
    clusters: torch.Tensor       # [num_clients] int64 true cluster of every client
    client_ids: torch.Tensor     # [C] global ids of the held clients
    input_shape: tuple[int, ...]
    num_classes: int
    source: str | None = None    # the folder the images were read from (None: generated)


def _check_size(cfg: DataConfig, num_clients: int, field: str, size: int, split: int) -> None:
    """Raise when num_clients x size images of the split do not fit without sharing."""
    have = torch.tensor(CLASS_COUNTS[cfg.name][split])
    demand = class_demand(num_clients, size)
    if bool((demand <= have).all()):
        return
    if cfg.share_images:
        if math.ceil(size / NUM_CLASSES) > int(have.min()):
            raise ConfigError(
                field, size,
                f"one client would need {math.ceil(size / NUM_CLASSES)} distinct images of a class but "
                f"{cfg.name} has {int(have.min())} of its smallest class; use at most "
                f"{NUM_CLASSES * int(have.min())}",
            )
        return
    c = int(torch.argmax(demand - have))
    raise ConfigError(
        field, size,
        f"{num_clients} clients x {size} images need {int(demand[c])} images of class {c} but "
        f"{cfg.name}'s {'train' if split == 0 else 'test'} split has {int(have[c])} "
        f"({int(have.sum())} in all); use at most {max_per_client(num_clients, have)} per client, "
        "fewer clients, or set data.share_images=true to let clients share images",
    )


def check_data(cfg: DataConfig, num_clients: int) -> None:
    """Validate the data config without reading images (raises ConfigError
    naming the field, the value and the fix)."""
    if cfg.name not in DATASETS:
        raise ConfigError("data.name", cfg.name, f"use one of {', '.join(DATASETS)}")
    if cfg.clusters not in CLUSTER_KINDS:
        raise ConfigError("data.clusters", cfg.clusters, f"use one of {', '.join(CLUSTER_KINDS)}")
    if cfg.name == "synthetic":
        if not isinstance(cfg.num_clusters, int) or cfg.num_clusters < 1:
            raise ConfigError("data.num_clusters", cfg.num_clusters, "use a positive integer")
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
    else:
        allowed = sorted(ROTATION_QUARTERS if cfg.clusters == "rotation" else LABEL_SWAPS)
        if cfg.num_clusters not in allowed:
            raise ConfigError(
                "data.num_clusters", cfg.num_clusters,
                f"{cfg.clusters} defines {' or '.join(map(str, allowed))} clusters (docs/algorithms.md)",
            )
    for field in ("train_size", "test_size"):
        v = getattr(cfg, field)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"data.{field}", v, "use a positive integer")
    if not isinstance(num_clients, int) or num_clients < cfg.num_clusters:
        raise ConfigError(
            "clients", num_clients, f"use at least data.num_clusters={cfg.num_clusters} clients"
        )
    if cfg.name != "synthetic":
        _check_size(cfg, num_clients, "data.train_size", cfg.train_size, 0)
        _check_size(cfg, num_clients, "data.test_size", cfg.test_size, 1)


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
) -> FederatedData:
    """The data of clients ``client_ids`` (all when None), a pure function of
    (cfg, num_clients, seed) row by row (docs/algorithms.md)."""
    check_data(cfg, num_clients)
    device = torch.device(device)
    ids = _held_ids(client_ids, num_clients)
    clusters = cluster_of_clients(num_clients, cfg.num_clusters)
    held = clusters[ids]
    if cfg.name == "synthetic":
        x, y = synthetic_clients(
            seed, ids, held, cfg.train_size + cfg.test_size, cfg.synthetic_dim,
            cfg.synthetic_alpha, cfg.synthetic_beta, shared_inputs=cfg.synthetic_inputs == "shared",
        )
        x, y = x.to(device), y.to(device)
        t = cfg.train_size
        train_x, train_y, test_x, test_y = x[:, :t], y[:, :t], x[:, t:], y[:, t:]
        shape: tuple[int, ...] = (cfg.synthetic_dim,)
        source = None
    else:
        raw = load_raw(cfg.name, cfg.root, cfg.download)
        source = raw.source
        train_idx, test_idx = federated_indices(
            raw.train_y, raw.test_y, num_clients, cfg.train_size, cfg.test_size, seed, cfg.share_images
        )
        mean, std = NORMALIZATION[cfg.name]
        out = []
        for images, labels, idx in ((raw.train_x, raw.train_y, train_idx), (raw.test_x, raw.test_y, test_idx)):
            x = images[idx[ids]].to(device)                          # uint8 [C, m, ch, H, W]
            y = labels[idx[ids]].to(device)
            if cfg.clusters == "rotation":
                x = rotate(x, held.to(device), cfg.num_clusters)
            else:
                y = swap_labels(y, held.to(device), cfg.num_clusters)
            out += [normalize(x, mean, std), y]
        train_x, train_y, test_x, test_y = out
        shape = INPUT_SHAPES[cfg.name]
    return FederatedData(
        train_x=train_x.contiguous(), train_y=train_y.contiguous(),
        test_x=test_x.contiguous(), test_y=test_y.contiguous(),
        clusters=clusters.to(device), client_ids=ids.to(device),
        input_shape=tuple(shape), num_classes=NUM_CLASSES, source=source,
    )
