"""What a data set declares (docs/algorithms.md, "Data"), and the two ways
clients get their data.

A data set is a :class:`DataSet` subclass registered with
:func:`fedclust.data.registry.register`.  It declares its ``name``, its
default model (``default_model``), its input shape and class count (methods
of the data config: Synthetic's shape depends on ``data.synthetic_dim``, a
file's on the file), how it is checked (``check``: reading no image where it
can) and how it is loaded (``load``).  Two kinds:

- ``pool`` (:class:`PoolDataSet`): a labelled pool (train and test splits)
  split over the clients, class-balanced (:mod:`fedclust.data.partition`),
  and transformed per cluster by ``data.clusters`` (rotation, label_swap;
  ``data.rotations``: each cluster's angle).  A subclass declares only its
  splits (``raw``), its normalisation and, to check sizes without reading
  images, its class counts.
- ``client``: the data comes per client (Synthetic's generator, a naturally
  federated file); ``data.clusters`` and ``data.rotations`` do not apply.

Clients sit in contiguous cluster blocks, ``data.cluster_sizes`` clients
each when given (pools and Synthetic; :func:`check_cluster_sizes`), else
near-equal.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from fedclust.data.partition import (
    LABEL_SWAPS,
    ROTATION_QUARTERS,
    class_demand,
    cluster_of_clients,
    federated_indices,
    max_per_client,
    rotate,
    swap_labels,
)
from fedclust.errors import ConfigError
from fedclust.schema import DataConfig

CLUSTER_KINDS = ("rotation", "label_swap")
KINDS = ("pool", "client")


class StoredInputs:
    """Inputs kept as stored (uint8 images: a quarter of float32's memory)
    and normalized to float32 when read: ``x[i]`` is ``normalize(stored[i])``,
    element by element the same numbers as normalizing everything first.
    The engine reads it by index (a chunk of clients, a batch); it has the
    tensor's ``shape``, ``device`` and ``dtype`` (float32); any other use (a
    torch function, a tensor method) sees the whole normalized tensor."""

    def __init__(self, stored: torch.Tensor, normalize):
        self.stored = stored
        self._normalize = normalize

    shape = property(lambda self: self.stored.shape)
    device = property(lambda self: self.stored.device)
    ndim = property(lambda self: self.stored.ndim)
    dtype = torch.float32

    def dim(self) -> int:
        return self.stored.dim()

    def element_size(self) -> int:
        return 4

    def __len__(self) -> int:
        return len(self.stored)

    def __getitem__(self, index) -> torch.Tensor:
        return self._normalize(self.stored[index])

    def materialize(self) -> torch.Tensor:
        """The whole normalized float32 tensor."""
        return self._normalize(self.stored)

    def __getattr__(self, name: str):
        if name.startswith("_") or name == "stored":
            raise AttributeError(name)
        return getattr(self.materialize(), name)

    # Python's operators skip __getattr__: each of these reads the whole normalized tensor.
    def __add__(self, other): return self.materialize() + other            # noqa: E704
    def __radd__(self, other): return other + self.materialize()           # noqa: E704
    def __sub__(self, other): return self.materialize() - other            # noqa: E704
    def __rsub__(self, other): return other - self.materialize()           # noqa: E704
    def __mul__(self, other): return self.materialize() * other            # noqa: E704
    def __rmul__(self, other): return other * self.materialize()           # noqa: E704
    def __truediv__(self, other): return self.materialize() / other        # noqa: E704
    def __neg__(self): return -self.materialize()                          # noqa: E704

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        def plain(a):
            return a.materialize() if isinstance(a, StoredInputs) else a
        return func(*tree_map(plain, args), **tree_map(plain, kwargs or {}))


@dataclass
class FederatedData:
    """The held clients' data; row c of each tensor is client ``client_ids[c]``."""

    train_x: torch.Tensor | StoredInputs   # [C, Ntrain, *input_shape] float32, normalized (docs/algorithms.md);
    #                                        uint8 image pools are kept as StoredInputs, normalized when read
    train_y: torch.Tensor        # [C, Ntrain] int64
    test_x: torch.Tensor | StoredInputs    # [C, Ntest, *input_shape]
    test_y: torch.Tensor         # [C, Ntest]
    clusters: torch.Tensor | None  # [num_clients] int64 true cluster of every client; None: not known (a file
    #                                without a `cluster` array): neighbour precision, recall and ARI are then null
    client_ids: torch.Tensor     # [C] global ids of the held clients
    input_shape: tuple[int, ...]
    num_classes: int
    source: str | None = None    # the folder (or file) the data was read from (None: generated)
    # [C] int64 real examples of each held client, the rest of its row padding (x = 0, y = 0); None when every
    # client (of all, on every rank) has the full width Ntrain (Ntest).  Only naturally federated files set them.
    train_counts: torch.Tensor | None = None
    test_counts: torch.Tensor | None = None
    # A validation split carved from the training examples (fedclust.data.validation, for an algorithm that asks
    # for one: Algorithm.validation_share); None: none, every training example trains.
    val_x: torch.Tensor | StoredInputs | None = None
    val_y: torch.Tensor | None = None
    val_counts: torch.Tensor | None = None


class RawData(NamedTuple):
    """A labelled pool: images [N, *shape] (uint8 for the built-in image sets), labels int64 [N], and the
    folder or file they were read from."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    source: str = ""


def positive_int(field: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(field, value, "use a positive integer")


def check_cluster_kind(cfg: DataConfig) -> None:
    if cfg.clusters not in CLUSTER_KINDS:
        raise ConfigError("data.clusters", cfg.clusters, f"use one of {', '.join(CLUSTER_KINDS)}")


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _angle(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _unset(v) -> bool:
    """A list key left at its default, ``[]``."""
    return isinstance(v, (list, tuple)) and len(v) == 0


def check_cluster_sizes(cfg: DataConfig, num_clients: int) -> None:
    """``data.cluster_sizes``, when given: a list of whole numbers ``>= 1``,
    one a cluster (as many as ``data.num_clusters``), summing to ``clients``."""
    sizes = cfg.cluster_sizes
    if not isinstance(sizes, (list, tuple)) or not all(_whole(s) for s in sizes):
        raise ConfigError("data.cluster_sizes", sizes, "give the clients of each cluster as a list of whole "
                          "numbers, e.g. data.cluster_sizes=[70,20,5,5] ([]: near-equal clusters)")
    if not sizes:
        return
    if min(sizes) < 1:
        c = next(i for i, s in enumerate(sizes) if s < 1)
        raise ConfigError("data.cluster_sizes", sizes, f"cluster {c} would have {sizes[c]} clients: every cluster "
                          "needs at least 1 (drop the cluster and lower data.num_clusters)")
    if len(sizes) != cfg.num_clusters:
        raise ConfigError("data.cluster_sizes", sizes, f"gives {len(sizes)} cluster sizes, one a cluster, but "
                          f"data.num_clusters={cfg.num_clusters}: set data.num_clusters={len(sizes)}, or give "
                          f"{cfg.num_clusters} sizes")
    if sum(sizes) != num_clients:
        raise ConfigError("data.cluster_sizes", sizes, f"sums to {sum(sizes)} clients but clients={num_clients}: "
                          f"make the sizes sum to {num_clients}, or set clients={sum(sizes)}")


def check_rotations(cfg: DataConfig) -> None:
    """``data.rotations``, when given: finite angles in degrees, with
    ``data.clusters=rotation``, one a cluster (as many as ``data.num_clusters``)."""
    angles = cfg.rotations
    if not isinstance(angles, (list, tuple)) or not all(_angle(a) for a in angles):
        raise ConfigError("data.rotations", angles, "give each cluster's angle in degrees as a list of finite "
                          "numbers, e.g. data.rotations=[0,180,10,350] ([]: the papers' evenly spaced rotations)")
    if not angles:
        return
    if cfg.clusters != "rotation":
        raise ConfigError("data.rotations", angles, f"angles turn the images of data.clusters=rotation, but "
                          f"data.clusters={cfg.clusters}: drop data.rotations, or set data.clusters=rotation")
    if len(angles) != cfg.num_clusters:
        raise ConfigError("data.rotations", angles, f"gives {len(angles)} angles, one a cluster, but "
                          f"data.num_clusters={cfg.num_clusters}: set data.num_clusters={len(angles)}, or give "
                          f"{cfg.num_clusters} angles")


def refuse_layout(cfg: DataConfig, fields: tuple[str, ...], why: str) -> None:
    """Refuse ``data.cluster_sizes`` / ``data.rotations`` (those of ``fields``) when given to a data set that
    does not take them, saying ``why``."""
    for field in fields:
        value = getattr(cfg, field)
        if not _unset(value):
            raise ConfigError(f"data.{field}", value, f"{why}: drop data.{field} (leave it [])")


class DataSet:
    """One data set (see the module docstring).  Instances are cheap: the
    registry makes one per lookup; whatever is read is cached per process by
    the data set's module."""

    name: ClassVar[str] = ""
    kind: ClassVar[str] = "pool"            # "pool" or "client" (see the module docstring)
    default_model: ClassVar[str] = "mlp"    # model=auto: a registered model (fedclust.models.registry)
    # report: column position among the papers' data sets (None: after them, by name), and the papers'
    # setting for this data set (keys clients, rounds, train_size, model; None: no paper setting)
    report_order: ClassVar[int | None] = None
    reference: ClassVar[dict | None] = None
    # a name written NAME:ARGUMENT (torchvision:KMNIST); the argument is passed to __init__
    takes_argument: ClassVar[bool] = False
    argument_help: ClassVar[str] = ""       # what the argument is, as shown in names(): torchvision:NAME
    argument_example: ClassVar[str] = ""    # one, for error messages: KMNIST
    # data.cluster_sizes / data.rotations it applies (check_data refuses the others, so a data set that applies
    # neither, a plug-in's own clients say, never ignores them)
    layout_keys: ClassVar[tuple[str, ...]] = ()
    # whether it reads data.options (torchvision:NAME: the class's keyword arguments); check_data refuses them
    # for a data set that does not, so that none is silently ignored
    takes_options: ClassVar[bool] = False

    def __init__(self, argument: str | None = None):
        self.argument = argument

    @property
    def full_name(self) -> str:
        return f"{self.name}:{self.argument}" if self.takes_argument else self.name

    def kind_of(self, cfg: DataConfig) -> str:
        """The kind for this config (a file's form decides for npz)."""
        return self.kind

    def input_shape(self, cfg: DataConfig) -> tuple[int, ...]:
        raise NotImplementedError

    def num_classes(self, cfg: DataConfig) -> int:
        raise NotImplementedError

    def has_true_clusters(self, cfg: DataConfig) -> bool:
        """Whether the clients' true clusters are known (Oracle and the cluster metrics need them)."""
        return True

    def check(self, cfg: DataConfig, num_clients: int) -> None:
        """Raise ConfigError (or DataError for bad data) naming the field, the value and the fix."""
        raise NotImplementedError

    def load(self, cfg: DataConfig, num_clients: int, seed: int, ids: torch.Tensor,
             device: torch.device) -> FederatedData:
        """The data of the clients ``ids`` (a pure function of (cfg, num_clients, seed) row by row)."""
        raise NotImplementedError

    def preload(self, cfg: DataConfig) -> None:
        """Read what ``load`` reads into the per-process cache (bench-scale); nothing by default."""


class PoolDataSet(DataSet):
    """A labelled pool split over clients and transformed per cluster (fmnist's way)."""

    kind = "pool"
    layout_keys = ("cluster_sizes", "rotations")
    shape: ClassVar[tuple[int, ...]] = ()
    classes: ClassVar[int] = 10
    mean: ClassVar[tuple[float, ...]] = ()
    std: ClassVar[tuple[float, ...]] = ()
    scale: ClassVar[float | None] = 255.0    # inputs are divided by it before the normalisation (uint8 -> [0, 1])
    # images per class of the (train, test) splits, so that sizes are checked without reading; None: read
    counts: ClassVar[tuple[tuple[int, ...], tuple[int, ...]] | None] = None

    def raw(self, cfg: DataConfig) -> RawData:
        raise NotImplementedError

    def input_shape(self, cfg: DataConfig) -> tuple[int, ...]:
        return tuple(self.shape)

    def num_classes(self, cfg: DataConfig) -> int:
        return self.classes

    def normalization(self, cfg: DataConfig) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel (mean, std) of the training split (after ``scale``)."""
        return tuple(self.mean), tuple(self.std)

    def class_counts(self, cfg: DataConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if self.counts is not None:
            return self.counts
        raw, k = self.raw(cfg), self.num_classes(cfg)
        train, test = (tuple(torch.bincount(y, minlength=k)[:k].tolist()) for y in (raw.train_y, raw.test_y))
        return train, test

    def normalize(self, cfg: DataConfig, x: torch.Tensor) -> torch.Tensor:
        """Inputs [..., *shape] -> float32 divided by ``scale`` then normalized per channel (the channel is
        the first input dimension of [ch, H, W] inputs; other shapes take one mean and std); for uint8
        images and scale 255 the same operations as torchvision ``ToTensor`` + ``Normalize``."""
        mean, std = self.normalization(cfg)
        dims = len(self.input_shape(cfg))
        view = (-1, 1, 1) if dims == 3 else ()            # per channel of [ch, H, W]; else one number
        m = torch.as_tensor(mean, dtype=torch.float32, device=x.device).reshape(view)
        s = torch.as_tensor(std, dtype=torch.float32, device=x.device).reshape(view)
        x = x.to(torch.float32)
        if self.scale is not None:
            x = x.div(self.scale)
        return x.sub(m).div(s)

    def preload(self, cfg: DataConfig) -> None:
        self.raw(cfg)

    # ---------------------------------------------------------------- check

    def check(self, cfg: DataConfig, num_clients: int) -> None:
        check_cluster_kind(cfg)
        check_rotations(cfg)
        self.check_cluster_count(cfg)
        check_cluster_sizes(cfg, num_clients)
        for field in ("train_size", "test_size"):
            positive_int(f"data.{field}", getattr(cfg, field))
        if not isinstance(num_clients, int) or num_clients < cfg.num_clusters:
            raise ConfigError(
                "clients", num_clients, f"use at least data.num_clusters={cfg.num_clusters} clients"
            )
        self.check_transform(cfg)
        have = self.class_counts(cfg)
        self._check_size(cfg, num_clients, "data.train_size", cfg.train_size, torch.tensor(have[0]), "train")
        self._check_size(cfg, num_clients, "data.test_size", cfg.test_size, torch.tensor(have[1]), "test")

    def check_cluster_count(self, cfg: DataConfig) -> None:
        """``data.num_clusters``: any whole number >= 1 when ``data.rotations`` gives each cluster's angle,
        else one the transform defines (2 or 4)."""
        if cfg.clusters == "rotation" and not _unset(cfg.rotations):
            positive_int("data.num_clusters", cfg.num_clusters)
            return
        allowed = sorted(ROTATION_QUARTERS if cfg.clusters == "rotation" else LABEL_SWAPS)
        if cfg.num_clusters not in allowed:
            other = ("; for another number give each cluster's angle in data.rotations"
                     if cfg.clusters == "rotation" else "")
            raise ConfigError(
                "data.num_clusters", cfg.num_clusters,
                f"{cfg.clusters} defines {' or '.join(map(str, allowed))} clusters (docs/algorithms.md){other}",
            )

    def check_transform(self, cfg: DataConfig) -> None:
        """Refuse a cluster transform the inputs or labels cannot take."""
        if cfg.clusters == "rotation":
            shape = self.input_shape(cfg)
            if len(shape) != 3 or shape[1] != shape[2]:
                raise ConfigError(
                    "data.clusters", "rotation",
                    f"rotation needs square image inputs [channels, H, W] but {self.full_name}'s inputs have shape "
                    f"{list(shape)}; use data.clusters=label_swap, or give the images as [N, channels, H, W] "
                    "with H = W")
        else:
            k = self.num_classes(cfg)
            pairs = LABEL_SWAPS[cfg.num_clusters]
            need = 1 + max(max(p) for p in pairs)
            if k < need:
                raise ConfigError(
                    "data.clusters", "label_swap",
                    f"label_swap with {cfg.num_clusters} clusters swaps the label pairs {list(pairs)} and needs at "
                    f"least {need} classes, but {self.full_name} has {k}; use data.clusters=rotation")

    def _check_size(self, cfg: DataConfig, num_clients: int, field: str, size: int, have: torch.Tensor,
                    split: str) -> None:
        """Raise when num_clients x size images of the split do not fit without sharing."""
        k = len(have)
        demand = class_demand(num_clients, size, k)
        if bool((demand <= have).all()):
            return
        if cfg.share_images:
            if math.ceil(size / k) > int(have.min()):
                raise ConfigError(
                    field, size,
                    f"one client would need {math.ceil(size / k)} distinct images of a class but "
                    f"{self.full_name} has {int(have.min())} of its smallest class; use at most "
                    f"{k * int(have.min())}",
                )
            return
        c = int(torch.argmax(demand - have))
        raise ConfigError(
            field, size,
            f"{num_clients} clients x {size} images need {int(demand[c])} images of class {c} but "
            f"{self.full_name}'s {split} split has {int(have[c])} "
            f"({int(have.sum())} in all); use at most {max_per_client(num_clients, have)} per client, "
            "fewer clients, or set data.share_images=true to let clients share images",
        )

    # ---------------------------------------------------------------- load

    def load(self, cfg: DataConfig, num_clients: int, seed: int, ids: torch.Tensor,
             device: torch.device) -> FederatedData:
        raw = self.raw(cfg)
        k = self.num_classes(cfg)
        clusters = cluster_of_clients(num_clients, cfg.num_clusters, cfg.cluster_sizes)
        held = clusters[ids]
        train_idx, test_idx = federated_indices(
            raw.train_y, raw.test_y, num_clients, cfg.train_size, cfg.test_size, seed, cfg.share_images,
            num_classes=k,
        )
        xs: list[torch.Tensor | StoredInputs] = []
        ys: list[torch.Tensor] = []
        for images, labels, idx in ((raw.train_x, raw.train_y, train_idx), (raw.test_x, raw.test_y, test_idx)):
            x = images[idx[ids]].to(device)                          # [C, m, *shape] as stored
            y = labels[idx[ids]].to(device)
            if cfg.clusters == "rotation":
                x = rotate(x, held.to(device), cfg.num_clusters, cfg.rotations)   # as stored: uint8 stays uint8
            else:
                y = swap_labels(y, held.to(device), cfg.num_clusters, k)
            x = x.contiguous()
            xs.append(StoredInputs(x, functools.partial(self.normalize, cfg)) if x.dtype == torch.uint8
                      else self.normalize(cfg, x).contiguous())
            ys.append(y.contiguous())
        (train_x, test_x), (train_y, test_y) = xs, ys
        return FederatedData(
            train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
            clusters=clusters.to(device), client_ids=ids.to(device),
            input_shape=self.input_shape(cfg), num_classes=k, source=raw.source,
        )
