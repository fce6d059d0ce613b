"""Splitting a base data set over clients and the cluster transforms (docs/algorithms.md).

Split: every client gets ``per_client`` images of a split, class-balanced:
``per_client // K`` of each class, and the ``r = per_client % K`` extra
images dealt cyclically over classes (client i's extras are classes
``(i*r + j) mod K`` for ``j < r``).  Dealing the ``n*per_client`` images in one
cyclic stream makes class c's demand ``ceil((n*per_client - c) / K)``.

Images are drawn without replacement: each class's pool is shuffled once
(torch.Generator seeded from the run seed) and cut into consecutive
slices, client 0 first, so no image is on two clients.  When the pool is too
small and sharing is allowed, each class's pool is instead shuffled once per
"copy" and cut into equal slots; client i takes slot ``i mod slots`` of copy
``i div slots``: images stay distinct within a client and repeat across
clients as little as the slots allow.  The whole assignment is computed for
all clients, so it never depends on which clients a process holds.

Transforms (docs/algorithms.md): rotation of each cluster's images by its
angle (``data.rotations``; by default ``360°·c/C`` for cluster c of C: the
papers' 0°/180° or 0°/90°/180°/270°, none with one cluster), by exact
``torch.rot90`` on (H, W) for multiples of 90°, else by bilinear
interpolation about the image centre with zero fill; label swaps by a
per-cluster lookup table (the papers' swapped pairs for 2 or 4 clusters,
else the identity for cluster 0 and a fixed pseudo-random permutation for
each other cluster).  Clients sit in contiguous cluster blocks:
``data.cluster_sizes`` clients each when given, else near-equal.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from fedclust import rng
from fedclust.errors import DataError

# label pairs swapped by each cluster: the papers' label_swap settings (2 or 4 clusters)
LABEL_SWAPS = {2: ((0, 1), (6, 7)), 4: ((0, 1), (2, 3), (4, 5), (6, 7))}
# the key of the other counts' label permutations: fixed (not the run's seed), so that a cluster's labelling is
# part of the data setting, the same in every run, as a rotation's angle is
LABEL_PERMUTATION_SEED = 0


# images a bilinear rotation turns in one call at most (times their pixels: at most ROTATE_CHUNK_VALUES values),
# which bounds its float32 working copies; every image is turned alone, so the chunking changes no value
ROTATE_CHUNK_VALUES = 1 << 24


def block_sizes(num_clients: int, num_clusters: int, sizes: Sequence[int] = ()) -> list[int]:
    """Clients of each cluster: ``sizes`` when given (one whole number >= 1 a
    cluster, summing to ``num_clients``), else near-equal blocks, the first
    ``num_clients % num_clusters`` one larger (docs/algorithms.md)."""
    if len(sizes):
        sizes = [int(s) for s in sizes]
        if len(sizes) != num_clusters or min(sizes) < 1 or sum(sizes) != num_clients:
            raise ValueError(f"cluster sizes {sizes} must be {num_clusters} whole numbers >= 1 summing to "
                             f"{num_clients}")
        return sizes
    if num_clusters < 1 or num_clients < 0:
        raise ValueError(f"need num_clusters >= 1 and num_clients >= 0, got {num_clusters}, {num_clients}")
    base, extra = divmod(num_clients, num_clusters)
    return [base + (c < extra) for c in range(num_clusters)]


def cluster_of_clients(num_clients: int, num_clusters: int, sizes: Sequence[int] = ()) -> torch.Tensor:
    """[num_clients] int64 true cluster of each client: contiguous blocks in
    cluster order (clients ``0 .. b_0 − 1`` are cluster 0, the next ``b_1``
    cluster 1, ...), of :func:`block_sizes` ``b`` (docs/algorithms.md)."""
    b = torch.tensor(block_sizes(num_clients, num_clusters, sizes), dtype=torch.int64)
    return torch.repeat_interleave(torch.arange(num_clusters), b)


def class_counts(num_clients: int, per_client: int, num_classes: int) -> torch.Tensor:
    """[n, K] images of each class per client: ``per_client // K`` each plus one
    on classes ``(i*r + j) mod K``, ``j < r``, for ``r = per_client % K``."""
    base, r = divmod(per_client, num_classes)
    i = torch.arange(num_clients)[:, None]
    c = torch.arange(num_classes)[None, :]
    extra = (c - i * r) % num_classes < r
    return base + extra.long()


def class_demand(num_clients: int, per_client: int, num_classes: int) -> torch.Tensor:
    """[K] images of each class all clients need together: ``ceil((n*t - c) / K)``
    (the n*t images dealt cyclically over classes), equal to ``class_counts(...).sum(0)``."""
    total = num_clients * per_client
    c = torch.arange(num_classes)
    return torch.div(total - c + num_classes - 1, num_classes, rounding_mode="floor").clamp_min(0)


def max_per_client(num_clients: int, have: torch.Tensor | list[int]) -> int:
    """Largest ``per_client`` whose class demand fits the pools ``have[c]``:
    ``ceil((n*t - c)/K) <= have_c  <=>  t <= (K*have_c + c) / n``."""
    have = torch.as_tensor(have, dtype=torch.int64)
    c = torch.arange(len(have))
    return int(torch.div(len(have) * have + c, max(num_clients, 1), rounding_mode="floor").min())


def _too_small(what: str, n: int, t: int, demand: torch.Tensor, have: torch.Tensor) -> str:
    c = int(torch.argmax(demand - have))
    return (
        f"{n} clients x {t} images need {int(demand[c])} images of class {c} "
        f"(about {n * t} in all) but the split has {int(have[c])} of that class "
        f"({int(have.sum())} in all); set {what} <= {max_per_client(n, have)} or use fewer clients, "
        "or set data.share_images=true to let clients share images"
    )


def _column_class_rank(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For a client's row of ``t`` images laid out class by class: the class
    and the rank within that class of each column, both [n, t]."""
    t = int(counts[0].sum()) if len(counts) else 0
    ends = counts.cumsum(1)                                    # [n, K]
    j = torch.arange(t)
    cls = (ends[:, None, :] <= j[None, :, None]).sum(-1)       # [n, t]
    rank = j[None, :] - (ends - counts).gather(1, cls)
    return cls, rank


def _class_pools(labels: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of each class's images padded into a [K, max] table, and the counts [K]."""
    have = torch.bincount(labels, minlength=num_classes)[:num_classes]
    order = torch.argsort(labels, stable=True)
    pools = torch.zeros(num_classes, max(int(have.max()), 1), dtype=torch.int64)
    starts = have.cumsum(0) - have
    for c in range(num_classes):  # classes, not clients
        pools[c, : have[c]] = order[starts[c] : starts[c] + have[c]]
    return pools, have


def split_indices(
    labels: torch.Tensor,
    num_clients: int,
    per_client: int,
    gen: torch.Generator,
    share: bool = False,
    what: str = "data.train_size",
    num_classes: int | None = None,
) -> torch.Tensor:
    """[n, per_client] indices into ``labels`` for every client (see the module
    docstring).  Raises DataError with the numbers when the split is too
    small and ``share`` is false; ``what`` names the config field."""
    labels = labels.to("cpu", torch.int64)
    if num_classes is None:                                    # the labels' own count
        num_classes = int(labels.max()) + 1 if len(labels) else 1
    n, t = num_clients, per_client
    counts = class_counts(n, t, num_classes)                   # [n, K]
    pools, have = _class_pools(labels, num_classes)
    demand = counts.sum(0)
    cls, rank = _column_class_rank(counts)
    if bool((demand <= have).all()):
        perms = torch.stack([_padded_perm(int(h), pools.shape[1], gen) for h in have])  # [K, max]
        shuffled = pools.gather(1, perms)                      # [K, max]
        offsets = counts.cumsum(0) - counts                    # [n, K] exclusive over clients
        idx = shuffled[cls, offsets.gather(1, cls) + rank]
    elif share:
        need = counts.max(0).values                            # [K] most one client needs
        if bool((need > have).any()):
            c = int(torch.argmax(need - have))
            raise DataError(
                f"{what}={t}: one client needs {int(need[c])} distinct images of class {c} but the split "
                f"has only {int(have[c])}; set {what} <= {num_classes * int(have.min())}"
            )
        slots = torch.div(have, need.clamp_min(1), rounding_mode="floor").clamp_min(1)   # [K]
        copies = int(((n + slots - 1) // slots).max())
        keys = torch.rand(num_classes, copies, pools.shape[1], generator=gen)
        padding = torch.arange(pools.shape[1])[None, :] >= have[:, None]              # [K, max]
        keys.masked_fill_(padding[:, None, :], 2.0)                                    # sort last
        shuffled = pools[:, None, :].expand(-1, copies, -1).gather(2, torch.argsort(keys, dim=2))
        i = torch.arange(n)[:, None]
        copy = torch.div(i, slots[cls], rounding_mode="floor")
        pos = (i % slots[cls]) * need[cls] + rank
        idx = shuffled[cls, copy, pos]
    else:
        raise DataError(_too_small(what, n, t, demand, have))
    order = torch.argsort(torch.rand(n, t, generator=gen), dim=1)   # mix classes within a client
    return idx.gather(1, order)


def _padded_perm(h: int, width: int, gen: torch.Generator) -> torch.Tensor:
    """A random permutation of range(h), padded with h..width-1 to ``width``."""
    return torch.cat([torch.randperm(h, generator=gen), torch.arange(h, width)])


def federated_indices(
    train_labels: torch.Tensor,
    test_labels: torch.Tensor,
    num_clients: int,
    train_size: int,
    test_size: int,
    seed: int,
    share: bool = False,
    *,
    num_classes: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global (train [n, train_size], test [n, test_size]) image indices of all
    clients, a pure function of the arguments (one generator seeded by ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    train = split_indices(train_labels, num_clients, train_size, gen, share, "data.train_size", num_classes)
    test = split_indices(test_labels, num_clients, test_size, gen, share, "data.test_size", num_classes)
    return train, test


def rotation_angles(num_clusters: int, rotations: Sequence[float] = ()) -> tuple[float, ...]:
    """Each cluster's angle in degrees, counter-clockwise: ``rotations`` when
    given (one a cluster), else evenly spaced, ``360·c/C`` for cluster c of
    C (the papers' 0°, 180°; or 0°, 90°, 180°, 270°; 0° alone for one
    cluster: no rotation)."""
    if len(rotations):
        if len(rotations) != num_clusters:
            raise ValueError(f"{len(rotations)} rotations for {num_clusters} clusters")
        return tuple(float(a) for a in rotations)
    if num_clusters < 1:
        raise ValueError(f"need num_clusters >= 1, got {num_clusters}")
    return tuple(360.0 * c / num_clusters for c in range(num_clusters))


def quarter_turns(angle: float) -> int | None:
    """``angle / 90 mod 4`` when ``angle`` (degrees) is a whole multiple of 90°, else None."""
    q = float(angle) / 90.0
    return int(q) % 4 if q.is_integer() else None


def rotate_images(x: torch.Tensor, angle: float) -> torch.Tensor:
    """Images ``x`` [..., ch, H, W] (H = W) turned ``angle`` degrees
    counter-clockwise about the image centre: a multiple of 90° by exact
    ``torch.rot90`` on (H, W); any other angle (taken mod 360) by bilinear
    interpolation with zero fill outside the image (torchvision's ``rotate``,
    the same numbers image by image), batched, in x's dtype (integer images
    rounded back).  Zero is the stored value: black for images that are
    normalized after (docs/algorithms.md)."""
    if not math.isfinite(float(angle)):
        raise ValueError(f"rotation angle {angle} is not a finite number")
    k = quarter_turns(angle)
    if k is not None:
        return torch.rot90(x, k, dims=(-2, -1)) if k else x.clone()
    from torchvision.transforms.functional import InterpolationMode
    from torchvision.transforms.functional import rotate as tv_rotate

    images = x.reshape(-1, *x.shape[-3:])                      # [N, ch, H, W]: torchvision's batch
    step = max(1, ROTATE_CHUNK_VALUES // max(1, math.prod(images.shape[1:])))
    turned = [tv_rotate(images[i:i + step], float(angle) % 360.0, interpolation=InterpolationMode.BILINEAR)
              for i in range(0, len(images), step)]
    return (torch.cat(turned) if turned else images.clone()).reshape(x.shape)


def rotate(x: torch.Tensor, clusters: torch.Tensor, num_clusters: int,
           rotations: Sequence[float] = ()) -> torch.Tensor:
    """Rotate ``x`` [C, m, ch, H, W] of clients in cluster ``clusters[C]`` by
    the cluster's angle (:func:`rotation_angles`; :func:`rotate_images`), one
    call per distinct angle (docs/algorithms.md)."""
    angles = rotation_angles(num_clusters, rotations)
    out = x.clone()
    by_turn: dict[float, list[int]] = {}                      # clusters of each distinct turn (mod 360°)
    for c, a in enumerate(angles):
        by_turn.setdefault(a % 360.0, []).append(c)
    for a, members in by_turn.items():
        if a == 0.0:
            continue
        rows = torch.isin(clusters, torch.tensor(members, device=clusters.device)).nonzero().squeeze(1).to(x.device)
        if len(rows):
            out[rows] = rotate_images(x[rows], a)
    return out


def label_tables(num_clusters: int, num_classes: int) -> torch.Tensor:
    """[num_clusters, K] new label of each old label, per cluster (docs/algorithms.md): for 2 or 4
    clusters the papers' swapped pairs of :data:`LABEL_SWAPS` (cluster c swaps its pair, the others
    unchanged); for any other count cluster 0 keeps its labels and cluster c >= 1 relabels by
    :func:`label_permutation` (one cluster: no relabelling)."""
    table = torch.arange(num_classes).repeat(num_clusters, 1)
    if num_clusters in LABEL_SWAPS:
        for cluster, (a, b) in enumerate(LABEL_SWAPS[num_clusters]):
            table[cluster, a], table[cluster, b] = b, a
        return table
    for cluster in range(1, num_clusters):   # clusters, not clients
        table[cluster] = label_permutation(cluster, num_classes)
    return table


def label_permutation(cluster: int, num_classes: int) -> torch.Tensor:
    """[K] the new label of each label in cluster ``cluster`` (label_swap with a cluster count other than 2 or
    4): the permutation that sorts K uniform keys of :mod:`fedclust.rng` keyed on (the fixed
    :data:`LABEL_PERMUTATION_SEED`, stream ``label_swap``, the cluster), so the same in every run and for every
    cluster count.  Two clusters may draw the same permutation (likely only with few classes):
    :func:`repeated_label_tables` finds them, and the data check refuses such a count."""
    keys = rng.uniform(LABEL_PERMUTATION_SEED, 0, "label_swap", cluster, torch.arange(num_classes))
    return torch.argsort(keys, stable=True)


def repeated_label_tables(num_clusters: int, num_classes: int) -> tuple[int, int] | None:
    """The first two clusters ``(a, b)`` whose labellings of :func:`label_tables` are the same, None when
    all differ."""
    table = label_tables(num_clusters, num_classes)
    first: dict[tuple[int, ...], int] = {}
    for cluster, row in enumerate(table.tolist()):   # clusters, not clients
        if tuple(row) in first:
            return first[tuple(row)], cluster
        first[tuple(row)] = cluster
    return None


def swap_labels(y: torch.Tensor, clusters: torch.Tensor, num_clusters: int, num_classes: int) -> torch.Tensor:
    """Relabel ``y`` [C, m] of clients in cluster ``clusters[C]`` by the cluster's swap (labels < num_classes)."""
    table = label_tables(num_clusters, num_classes).to(y.device)
    return table[clusters.to(y.device)[:, None], y]


def normalize(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """uint8 images [..., ch, H, W] -> float32 scaled to [0, 1] then normalized per
    channel, the same operations as torchvision ``ToTensor`` + ``Normalize`` (docs/algorithms.md)."""
    m = torch.as_tensor(mean, dtype=torch.float32, device=x.device)[:, None, None]
    s = torch.as_tensor(std, dtype=torch.float32, device=x.device)[:, None, None]
    return x.to(torch.float32).div(255).sub(m).div(s)
