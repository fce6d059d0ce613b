"""What a data set declares (docs/algorithms.md, "Data"), and the two ways
clients get their data.

A data set is a :class:`DataSet` subclass registered with
:func:`fedclust.data.registry.register`.  It declares its ``name``, its
default model (``default_model``), its input shape and class count (methods
of the data config: Synthetic's shape depends on ``data.synthetic_dim``, a
file's on the file), how it is checked (``check``: reading no image where it
can) and how it is loaded (``load``).  Two kinds:

- ``pool`` (:class:`PoolDataSet`): a labelled pool (train and test splits)
  split over the clients, class-balanced (:mod:`fedclust.data.partition`) or
  with the label and quantity skew of ``data.partition`` and
  ``data.quantity_skew`` (:mod:`fedclust.data.skew`), and transformed per
  cluster by ``data.clusters`` (rotation, label_swap; ``data.rotations``:
  each cluster's angle).  A subclass declares only its
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
    class_demand,
    cluster_of_clients,
    federated_indices,
    max_per_client,
    repeated_label_tables,
    rotate,
    rotation_angles,
    swap_labels,
)
from fedclust.data.skew import PARTITIONS, ClientSplit, skewed, skewed_indices
from fedclust.errors import ConfigError
from fedclust.schema import DataConfig

CLUSTER_KINDS = ("rotation", "label_swap")
KINDS = ("pool", "client")
# the keys of how a pool is split over the clients and transformed: a data set that gives each client's data
# itself (Synthetic's generator, a file of your own clients) takes none but those it declares (layout_keys)
LAYOUT_KEYS = ("cluster_sizes", "rotations", "partition", "alpha", "shards_per_client", "quantity_skew")
# the keys each partition reads besides data.partition: one given to another partition is refused
PARTITION_KEYS = {"iid": (), "dirichlet": ("alpha",), "shards": ("shards_per_client",)}


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


def _default(field: str):
    """``data.<field>``'s default."""
    return getattr(DataConfig(), field)


def given(cfg: DataConfig, field: str) -> bool:
    """Whether ``data.<field>`` differs from its default (a list: holds anything).  A key set to its default
    cannot be told from one left out."""
    value = getattr(cfg, field)
    return not _unset(value) if isinstance(value, (list, tuple)) else value != _default(field)


def refuse_layout(cfg: DataConfig, fields: tuple[str, ...], why: str) -> None:
    """Refuse the keys of ``fields`` (of :data:`LAYOUT_KEYS`) given to a data set that does not take them,
    saying ``why``."""
    for field in fields:
        if given(cfg, field):
            default = _default(field)
            raise ConfigError(f"data.{field}", getattr(cfg, field),
                              f"{why}: drop data.{field} (leave it at its default, {default})")


def check_partition(cfg: DataConfig) -> None:
    """``data.partition`` one of :data:`~fedclust.data.skew.PARTITIONS`, its own keys in range, and no key of
    another partition given (``data.alpha`` without dirichlet, ``data.shards_per_client`` without shards);
    ``data.quantity_skew`` 0 or a finite number > 0.  The sizes are checked by :meth:`PoolDataSet.check`."""
    if cfg.partition not in PARTITIONS:
        raise ConfigError("data.partition", cfg.partition, f"use one of {', '.join(PARTITIONS)} (docs/algorithms.md, "
                          "\"Partitions\")")
    for part, keys in PARTITION_KEYS.items():
        for field in keys:
            if part != cfg.partition and given(cfg, field):
                raise ConfigError(f"data.{field}", getattr(cfg, field),
                                  f"data.{field} applies to data.partition={part} only, but data.partition="
                                  f"{cfg.partition}: drop data.{field}, or set data.partition={part}")
    alpha = cfg.alpha
    if not _angle(alpha) or alpha <= 0:
        raise ConfigError("data.alpha", alpha, "the Dirichlet concentration must be a finite number > 0 (0.1: a "
                          "client holds mostly one or two classes; 100: nearly class-balanced; the default: 0.5)")
    s = cfg.shards_per_client
    if not _whole(s) or s < 1:
        raise ConfigError("data.shards_per_client", s, "use a whole number >= 1 (McMahan et al.: 2)")
    if cfg.partition == "shards" and _whole(cfg.train_size) and s > cfg.train_size:
        raise ConfigError("data.shards_per_client", s, f"each of a client's shards holds at least one of its "
                          f"data.train_size={cfg.train_size} examples: use at most {cfg.train_size} shards, or raise "
                          "data.train_size")
    if cfg.partition == "shards" and cfg.share_images:
        raise ConfigError("data.share_images", True, "data.partition=shards cuts the training split itself into "
                          "shards, each on one client: set data.share_images=false (and data.train_size so that "
                          "clients x data.train_size fit the split)")
    a = cfg.quantity_skew
    if not _angle(a) or a < 0:
        raise ConfigError("data.quantity_skew", a, "use 0 (every client data.train_size examples) or the power "
                          "law's exponent, a finite number > 0 (smaller: more skew; e.g. 1.5)")


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
    # the keys of LAYOUT_KEYS it applies (data.cluster_sizes, data.rotations, data.partition, ...; check_data refuses
    # the others, so a data set that applies none, a plug-in's own clients say, never ignores them)
    layout_keys: ClassVar[tuple[str, ...]] = ()
    # whether it reads data.options (torchvision:NAME: the class's keyword arguments); check_data refuses them
    # for a data set that does not, so that none is silently ignored
    takes_options: ClassVar[bool] = False
    # oracle's fix when the data gives no true cluster (has_true_clusters is false), in its error
    true_clusters_fix: ClassVar[str] = "give the true cluster of every client"

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
    layout_keys = LAYOUT_KEYS
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

    def input_normalization(self, cfg: DataConfig) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The per-channel (mean, std) that :meth:`normalize` applies after ``scale``: the data set's own
        statistics (``data.normalize=standard``), or 0 and 1 (``unit``: [0, 1] kept), or 0.5 and 0.5
        (``symmetric``: [0, 1] to [-1, 1]), one per channel of the statistics."""
        mean, std = self.normalization(cfg)
        fixed = {"unit": (0.0, 1.0), "symmetric": (0.5, 0.5)}.get(cfg.normalize)
        if fixed is None:
            return tuple(mean), tuple(std)
        return (fixed[0],) * len(mean), (fixed[1],) * len(std)

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
        mean, std = self.input_normalization(cfg)
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
        check_partition(cfg)
        have = self.class_counts(cfg)
        if not skewed(cfg.partition, cfg.quantity_skew):
            self._check_size(cfg, num_clients, "data.train_size", cfg.train_size, torch.tensor(have[0]), "train")
            self._check_size(cfg, num_clients, "data.test_size", cfg.test_size, torch.tensor(have[1]), "test")
            return
        self._check_total(cfg, num_clients, sum(have[0]))
        if cfg.partition == "iid":     # balanced test sets, as the iid split's
            self._check_size(cfg, num_clients, "data.test_size", cfg.test_size, torch.tensor(have[1]), "test")
        elif cfg.test_size > sum(have[1]):
            raise ConfigError("data.test_size", cfg.test_size, f"a client's test set takes distinct examples of "
                              f"{self.full_name}'s test split, which has {sum(have[1])}: use at most {sum(have[1])}")

    def _check_total(self, cfg: DataConfig, num_clients: int, total: int) -> None:
        """The training sizes of a skewed split (fedclust.data.skew): distinct examples across clients need
        ``clients · data.train_size`` of the split; shared ones (data.share_images) ``data.train_size`` a
        client (a power-law size is capped at the split's size)."""
        if cfg.share_images:
            if cfg.train_size > total:
                raise ConfigError("data.train_size", cfg.train_size, f"a client's examples are distinct within it, "
                                  f"and {self.full_name}'s training split has {total}: use at most {total}")
            return
        if num_clients * cfg.train_size > total:
            shared = "" if cfg.partition == "shards" else ", or set data.share_images=true to let clients share images"
            raise ConfigError("data.train_size", cfg.train_size,
                              f"{num_clients} clients x {cfg.train_size} examples need {num_clients * cfg.train_size}"
                              f" distinct examples but {self.full_name}'s training split has {total}: use at most "
                              f"{total // num_clients} per client, fewer clients{shared}")

    def check_cluster_count(self, cfg: DataConfig) -> None:
        """``data.num_clusters``: any whole number >= 1 (one: no transform; rotation: evenly spaced angles
        unless ``data.rotations`` gives them; label_swap: the papers' pairs for 2 or 4, else permutations)."""
        positive_int("data.num_clusters", cfg.num_clusters)

    def check_transform(self, cfg: DataConfig) -> None:
        """Refuse a cluster transform the inputs or labels cannot take."""
        if cfg.clusters == "rotation":
            if all(a % 360.0 == 0.0 for a in rotation_angles(cfg.num_clusters, cfg.rotations)):
                return               # nothing turns (one cluster, or every angle 0): any input shape
            shape = self.input_shape(cfg)
            if len(shape) != 3 or shape[1] != shape[2]:
                raise ConfigError(
                    "data.clusters", "rotation",
                    f"rotation needs square image inputs [channels, H, W] but {self.full_name}'s inputs have shape "
                    f"{list(shape)}; use data.clusters=label_swap, or give the images as [N, channels, H, W] "
                    "with H = W")
            return
        k = self.num_classes(cfg)
        if cfg.num_clusters in LABEL_SWAPS:
            pairs = LABEL_SWAPS[cfg.num_clusters]
            need = 1 + max(max(p) for p in pairs)
            if k < need:
                raise ConfigError(
                    "data.clusters", "label_swap",
                    f"label_swap with {cfg.num_clusters} clusters swaps the label pairs {list(pairs)} and needs at "
                    f"least {need} classes, but {self.full_name} has {k}; use data.clusters=rotation")
            return
        same = repeated_label_tables(cfg.num_clusters, k)
        if same is not None:
            raise ConfigError(
                "data.num_clusters", cfg.num_clusters,
                f"label_swap with {cfg.num_clusters} clusters relabels each cluster by its own permutation of "
                f"{self.full_name}'s {k} classes (docs/algorithms.md), but clusters {same[0]} and {same[1]} draw the "
                "same one, so they would be one task; use fewer clusters, or data.clusters=rotation")

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
             device: torch.device, held: torch.Tensor | None = None) -> FederatedData:
        """``held`` ([C] int64): the cluster whose transform each client's rows take instead of its own (drift:
        the same examples under another cluster's transform, :mod:`fedclust.data.drift`); None: its own."""
        raw = self.raw(cfg)
        k = self.num_classes(cfg)
        clusters = cluster_of_clients(num_clients, cfg.num_clusters, cfg.cluster_sizes)
        held = clusters[ids] if held is None else torch.as_tensor(held, dtype=torch.int64).cpu()
        rows, counts = self.client_rows(cfg, raw, num_clients, seed, ids)
        xs: list[torch.Tensor | StoredInputs] = []
        ys: list[torch.Tensor] = []
        for images, labels, (idx, real) in zip((raw.train_x, raw.test_x), (raw.train_y, raw.test_y), rows):
            x = images[idx].to(device)                               # [C, m, *shape] as stored
            y = labels[idx].to(device)
            if cfg.clusters == "rotation":
                x = rotate(x, held.to(device), cfg.num_clusters, cfg.rotations)   # as stored: uint8 stays uint8
            else:
                y = swap_labels(y, held.to(device), cfg.num_clusters, k)
            if real is not None:                                     # padding: x = 0, y = 0 as stored
                keep = real.to(device)
                x = x * keep.reshape(keep.shape + (1,) * (x.dim() - 2)).to(x.dtype)
                y = y * keep.to(y.dtype)
            x = x.contiguous()
            xs.append(StoredInputs(x, functools.partial(self.normalize, cfg)) if x.dtype == torch.uint8
                      else self.normalize(cfg, x).contiguous())
            ys.append(y.contiguous())
        (train_x, test_x), (train_y, test_y) = xs, ys
        return FederatedData(
            train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
            clusters=clusters.to(device), client_ids=ids.to(device),
            input_shape=self.input_shape(cfg), num_classes=k, source=raw.source,
            train_counts=None if counts[0] is None else counts[0].to(device),
            test_counts=None if counts[1] is None else counts[1].to(device),
        )

    def client_rows(self, cfg: DataConfig, raw: RawData, num_clients: int, seed: int, ids: torch.Tensor):
        """``([(index, real) of train, of test], [train counts, test counts])`` of the clients ``ids``: indices
        ``[C, W]`` into each split, ``real`` the positions holding an example (None: all), ``counts`` [C] the
        examples each holds (None where every client of all holds W).  iid without quantity skew: today's
        class-balanced split (:func:`fedclust.data.partition.federated_indices`, bit for bit); else
        :func:`fedclust.data.skew.skewed_indices`."""
        k = self.num_classes(cfg)
        if not skewed(cfg.partition, cfg.quantity_skew):
            train_idx, test_idx = federated_indices(
                raw.train_y, raw.test_y, num_clients, cfg.train_size, cfg.test_size, seed, cfg.share_images,
                num_classes=k,
            )
            return [(train_idx[ids], None), (test_idx[ids], None)], [None, None]
        splits: tuple[ClientSplit, ClientSplit] = skewed_indices(
            raw.train_y, raw.test_y, num_clients, seed, num_classes=k, partition=cfg.partition,
            train_size=cfg.train_size, test_size=cfg.test_size, alpha=cfg.alpha,
            shards_per_client=cfg.shards_per_client, quantity_skew=cfg.quantity_skew, share=cfg.share_images)
        rows, counts = [], []
        for split in splits:
            index, real = split.rows(ids)
            same = bool((split.sizes == index.shape[1]).all())      # over all clients: the same on every process
            rows.append((index, None if same else real))
            counts.append(None if same else split.sizes[ids])
        return rows, counts
