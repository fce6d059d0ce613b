"""Label and quantity skew of a pool's split (``data.partition``, ``data.quantity_skew``; docs/algorithms.md,
"Partitions").

``iid`` without quantity skew is not computed here: it is today's class-balanced split
(:func:`fedclust.data.partition.split_indices`), bit for bit.  Everything else is computed here, in four
steps, each a pure function of the run's seed and the config, for all clients at once (so no client's data
depends on which clients a process holds):

1. **Sizes** (:func:`client_sizes`): every client ``data.train_size`` training examples, or, with
   ``data.quantity_skew = a > 0``, sizes from a power law: client i draws ``x_i`` from a Pareto law of tail
   exponent a (``P(x > s) = s^-a``, ``s >= 1``), keeps :func:`size_floor` examples and gets a share of the
   remaining ``n·(train_size − floor)`` in proportion to ``x_i`` (rounded by largest remainder), so the sizes
   sum to exactly ``n·train_size``, the pool the iid split would use.  Test sets keep ``data.test_size``.
2. **Label counts** ``[n, K]`` (how many examples of each class each client holds):
   ``iid`` class-balanced (:func:`balanced_counts`); ``dirichlet`` each client's label proportions ``p_i ~
   Dir(alpha·1_K)`` (:func:`dirichlet_proportions`) times its size, rounded by largest remainder (Hsu et al.
   2019's per-client draw; see :func:`dirichlet_proportions` for why not the per-class one); ``shards``
   McMahan et al.'s: the examples the clients use, sorted by label, cut into ``n·shards_per_client`` shards,
   each client taking ``shards_per_client`` of them at random (:func:`shard_counts`).
3. **Fit to the pool**: clients take distinct training examples, so a class cannot give more than it has; a
   class some clients over-ask keeps its examples for the clients first in a seeded order and the others take
   the examples they lost from the classes with examples left (:func:`fit_to_pool`); with
   ``data.share_images`` a client only needs distinct examples within itself (:func:`fit_within_client`).
   A client's test set has ``data.test_size`` examples in the label proportions of its training set after
   this step (largest remainder; iid: class-balanced, as today's).  A label-skewed client's test set is drawn
   for it alone (:func:`fit_within_client`): distinct within the client, possibly shared with other clients,
   so that it follows the client's proportions exactly, where test sets distinct across clients would have to
   fit the test split's class totals (fmnist's default 100 clients × 100 test images use all 10,000).
4. **Indices** (:func:`indices_from_counts`): each class's examples shuffled once; distinct clients take
   consecutive slices of it (client 0 first), shared ones a window starting at a place keyed on
   (seed, client, class); a client's examples are then put in a random order.

Every draw is a counter-based one of :mod:`fedclust.rng` keyed on (seed, stream, client or class, index): no
loop draws until a condition holds, so every split is computed in one pass, at any number of clients and any
alpha (tested at 2,000 clients, alpha 0.05).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fedclust import rng

PARTITIONS = ("iid", "dirichlet", "shards")
SIZE_FLOOR = 10   # examples every client keeps under quantity skew (at most data.train_size; NIID-Bench's minimum)


class ClientSplit(NamedTuple):
    """One split (train or test) of every client: the examples' indices into the split, client 0's first, each
    client's in its order (``examples`` [sum of sizes]), and how many each client holds (``sizes`` [n])."""

    examples: torch.Tensor
    sizes: torch.Tensor

    def rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(index [C, W], real [C, W])`` of the clients ``ids``: their examples padded to W, the largest size
        of all clients (the same on every process), the padding pointing at example 0 and ``real`` false."""
        width = int(self.sizes.max()) if len(self.sizes) else 0
        starts = self.sizes.cumsum(0) - self.sizes
        pos = torch.arange(width)[None, :]
        real = pos < self.sizes[ids][:, None]
        flat = (starts[ids][:, None] + pos).masked_fill(~real, 0)
        index = self.examples[flat.clamp_max(max(len(self.examples) - 1, 0))] if len(self.examples) else flat
        return index.masked_fill(~real, 0), real


# ---------------------------------------------------------------- draws

def _open_uniform(seed: int, stream: str, client, index) -> torch.Tensor:
    """float64 uniforms in the open interval (0, 1) (the hash's midpoints), keyed as :func:`fedclust.rng.uniform`
    in round 0: a logarithm of them is always finite."""
    return (rng.hash_ints(seed, 0, stream, client, index).to(torch.float64) + 0.5) / 2.0**32


def _keyed_order(seed: int, stream: str, key: int, n: int) -> torch.Tensor:
    """A random permutation of range(n) keyed on (seed, stream, key)."""
    return torch.argsort(rng.uniform(seed, 0, stream, key, torch.arange(n)), stable=True)


def log_pareto(seed: int, clients: torch.Tensor, exponent: float) -> torch.Tensor:
    """float64 ``log x_i`` of Pareto draws ``x_i`` of tail exponent ``exponent`` (``P(x > s) = s^-a`` for ``s >=
    1``; scipy's ``pareto(b=a)``), one per client, keyed on (seed, client): by inversion, ``x = u^(-1/a)``, in
    logarithms so that no exponent overflows."""
    u = _open_uniform(seed, "partition_sizes", torch.as_tensor(clients, dtype=torch.int64), 0)
    return -torch.log(u) / float(exponent)


def dirichlet_proportions(seed: int, clients: torch.Tensor, num_classes: int, alpha: float) -> torch.Tensor:
    """``[len(clients), K]`` float64 label proportions ``p_i ~ Dir(alpha·1_K)``, row i keyed on (seed, client i).

    Per client over classes (Hsu et al. 2019, "Measuring the effects of non-identical data distribution"), not
    per class over clients (NIID-Bench's and FedLab's "hetero dir"): a client's size is then set by the config
    (``data.train_size``, or the power law), and its labels follow its own draw, where the per-class draw makes
    the sizes random and, to keep every client at a minimum size, redraws until they are (the loop that never
    ends at 500 clients, alpha 0.3, 100 classes).

    Drawn as normalized Gamma(alpha) variates ``g = h·u^(1/alpha)`` (``h ~ Gamma(alpha + 1)`` by inverting its
    distribution function, scipy's ``gammaincinv``; ``u`` uniform: Marsaglia and Tsang's boost), in logarithms,
    normalized by a softmax: no variate underflows at any alpha (at alpha 0.01, ``u^100`` is below float64's
    smallest number for u < 0.0008, and a row of zeros would normalize as 0/0)."""
    import scipy.special  # here: 0.27 s of every process's start otherwise, for Dirichlet splits only

    clients = torch.as_tensor(clients, dtype=torch.int64)
    k = torch.arange(num_classes)
    u_h = _open_uniform(seed, "partition_dirichlet", clients[:, None], k[None, :])
    u_b = _open_uniform(seed, "partition_dirichlet", clients[:, None], num_classes + k[None, :])
    h = torch.from_numpy(scipy.special.gammaincinv(float(alpha) + 1.0, u_h.numpy()))
    log_g = torch.log(h) + torch.log(u_b) / float(alpha)
    return torch.softmax(log_g, dim=1)


# ---------------------------------------------------------------- counts

def largest_remainder(weights: torch.Tensor, totals: torch.Tensor) -> torch.Tensor:
    """``[n, K]`` int64 whole numbers, row i summing to ``totals[i]``, closest to ``weights[i] / weights[i].sum()
    · totals[i]``: each rounded down, the rest one each to the largest remainders (ties: the lower column)."""
    w = weights.to(torch.float64)
    w = w / w.sum(1, keepdim=True)
    totals = torch.as_tensor(totals, dtype=torch.int64)
    raw = w * totals[:, None].to(torch.float64)
    base = torch.floor(raw).to(torch.int64)
    left = (totals - base.sum(1)).clamp(0, w.shape[1])                  # [n] units still to give
    order = torch.argsort(-(raw - base), dim=1, stable=True)            # largest remainder first
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(w.shape[1]).expand_as(order).contiguous())
    return base + (rank < left[:, None]).to(torch.int64)


def size_floor(per_client: int, shards_per_client: int = 1) -> int:
    """Examples every client keeps under quantity skew: ``min(SIZE_FLOOR, per_client)``, and at least
    ``shards_per_client`` (one example a shard)."""
    return max(min(SIZE_FLOOR, per_client), shards_per_client)


def client_sizes(seed: int, num_clients: int, per_client: int, exponent: float, floor: int) -> torch.Tensor:
    """``[n]`` int64 training examples of each client: ``per_client`` each when ``exponent`` is 0; else ``floor``
    each plus the ``n·(per_client − floor)`` others shared in proportion to :func:`log_pareto`'s draws (largest
    remainder), so that they sum to ``n·per_client``."""
    if float(exponent) == 0.0:
        return torch.full((num_clients,), int(per_client), dtype=torch.int64)
    share = torch.softmax(log_pareto(seed, torch.arange(num_clients), exponent), dim=0)
    rest = num_clients * (int(per_client) - int(floor))
    return int(floor) + largest_remainder(share[None, :], torch.tensor([rest]))[0]


def balanced_counts(sizes: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``[n, K]`` class-balanced counts for clients of ``sizes``: ``t_i // K`` of each class plus one of classes
    ``(i·r_i + j) mod K``, ``j < r_i = t_i mod K`` (:func:`fedclust.data.partition.class_counts` row by row)."""
    sizes = torch.as_tensor(sizes, dtype=torch.int64)
    base, r = sizes // num_classes, sizes % num_classes
    i = torch.arange(len(sizes))[:, None]
    c = torch.arange(num_classes)[None, :]
    return base[:, None] + ((c - i * r[:, None]) % num_classes < r[:, None]).to(torch.int64)


def shard_counts(seed: int, have: torch.Tensor, sizes: torch.Tensor, shards_per_client: int) -> torch.Tensor:
    """``[n, K]`` label counts of McMahan et al.'s pathological split: of the split's ``have[k]`` examples of
    each class, the ``sum(sizes)`` the clients use (a uniform draw without replacement, keyed on the seed; all of
    them when they use the whole split) sorted by label and cut into ``n·s`` shards, each client taking ``s`` of
    them in a seeded random order.  Client i's j-th shard holds ``t_i // s`` examples, one more for ``j < t_i mod
    s``, so the client holds exactly ``t_i``.  (McMahan et al.: 60,000 images, 200 shards of 300, 2 a client.)"""
    have = torch.as_tensor(have, dtype=torch.int64)
    sizes = torch.as_tensor(sizes, dtype=torch.int64)
    n, s, num_classes = len(sizes), int(shards_per_client), len(have)
    labels = torch.repeat_interleave(torch.arange(num_classes), have)           # the split's labels, by class
    used = _keyed_order(seed, "partition_shards_used", 0, len(labels))[: int(sizes.sum())]
    stream = torch.sort(labels[used]).values                                    # the used examples by label
    j = torch.arange(s)[None, :]
    shard = (sizes[:, None] // s + (j < sizes[:, None] % s)).reshape(-1)        # [n·s] size of shard (i, j)
    along = _keyed_order(seed, "partition_shards_deal", 0, n * s)               # the shards' order on the stream
    owner = torch.repeat_interleave(along // s, shard[along])                   # each stream position's client
    return torch.bincount(owner * num_classes + stream, minlength=n * num_classes).reshape(n, num_classes)


def fit_to_pool(counts: torch.Tensor, have: torch.Tensor, seed: int, stream: str) -> torch.Tensor:
    """``counts`` [n, K] changed as little as this rule allows so that no class gives more than it ``have``s
    (distinct examples across clients; needs ``counts.sum() <= have.sum()``): clients in a seeded random order
    (keyed on (seed, ``stream``)) keep what they asked of a class until it runs out; the examples the others
    lost are then dealt from the classes with examples left, in one stream each, the northwest-corner rule:
    the clients in the same order, the classes by label.  Unchanged when every class has enough.  Row sums
    are kept."""
    have = torch.as_tensor(have, dtype=torch.int64)
    if bool((counts.sum(0) <= have).all()):
        return counts
    order = _keyed_order(seed, stream, 0, len(counts))
    asked = counts[order]
    before = asked.cumsum(0) - asked                                    # asked by the clients earlier in order
    kept = (have[None, :] - before).clamp_min(0).minimum(asked)
    lost = asked.sum(1) - kept.sum(1)                                   # [n]
    spare = have - kept.sum(0)                                          # [K]
    dealt = _northwest(lost, spare)
    out = torch.empty_like(counts)
    out[order] = kept + dealt
    return out


def _northwest(need: torch.Tensor, spare: torch.Tensor) -> torch.Tensor:
    """``[n, K]``: the stream of ``need[i]`` units of each row laid against the stream of ``spare[k]`` units of
    each column, each entry their overlap (the northwest-corner rule; needs ``need.sum() <= spare.sum()``)."""
    hi_r, hi_c = need.cumsum(0), spare.cumsum(0)
    lo_r, lo_c = hi_r - need, hi_c - spare
    hi = torch.minimum(hi_r[:, None], hi_c[None, :])
    lo = torch.maximum(lo_r[:, None], lo_c[None, :])
    return (hi - lo).clamp_min(0)


def fit_within_client(counts: torch.Tensor, have: torch.Tensor) -> torch.Tensor:
    """``counts`` [n, K] with no class asked for more than it ``have``s by any one client (distinct examples
    within a client; needs each row sum ``<= have.sum()``): a client's excess goes to its classes with examples
    left, in label order.  Unchanged when every class has enough.  Row sums are kept."""
    have = torch.as_tensor(have, dtype=torch.int64)
    kept = counts.minimum(have[None, :])
    lost = counts.sum(1) - kept.sum(1)
    room = have[None, :] - kept
    before = room.cumsum(1) - room
    return kept + (lost[:, None] - before).clamp_min(0).minimum(room)


# ---------------------------------------------------------------- indices

def indices_from_counts(counts: torch.Tensor, labels: torch.Tensor, seed: int, split: str,
                        distinct: bool) -> ClientSplit:
    """The examples of ``labels`` (the split's) each client holds, ``counts[i, k]`` of class k for client i
    (column sums ``<= have`` when ``distinct``, every entry ``<= have`` otherwise).  Each class's examples are
    shuffled once (keyed on (seed, ``split``, class)); ``distinct``: client i takes the consecutive slice after
    the clients before it (no example on two clients); else a window of the shuffled class starting at a place
    keyed on (seed, client, class), wrapping around (distinct within the client).  A client's examples are then
    put in a random order keyed on (seed, client).  Memory: the examples of all clients, once (no [n, width])."""
    labels = torch.as_tensor(labels, dtype=torch.int64).cpu()
    n, num_classes = counts.shape
    have = torch.bincount(labels, minlength=num_classes)[:num_classes]
    width = max(int(have.max()), 1)
    by_class = torch.argsort(labels, stable=True)                      # the split's examples, class by class
    first = have.cumsum(0) - have
    k = torch.arange(num_classes)
    keys = rng.uniform(seed, 0, f"partition_{split}_pool", k[:, None], torch.arange(width)[None, :])
    keys = keys.masked_fill(torch.arange(width)[None, :] >= have[:, None], 2.0)   # padding last
    shuffled = torch.argsort(keys, dim=1, stable=True)                 # [K, width] position within the class
    flat = counts.reshape(-1)
    group = torch.repeat_interleave(torch.arange(n * num_classes), flat)   # (client, class) of each example
    rank = torch.arange(len(group)) - (flat.cumsum(0) - flat)[group]       # its place within the group
    client, cls = group // num_classes, group % num_classes
    if distinct:
        offset = (counts.cumsum(0) - counts)[client, cls]
        place = offset + rank
    else:
        start = rng.uniform(seed, 0, f"partition_{split}_window", torch.arange(n)[:, None], k[None, :])
        start = torch.floor(start * have[None, :].to(torch.float64)).to(torch.int64)
        place = (start[client, cls] + rank) % have[cls].clamp_min(1)
    index = by_class[first[cls] + shuffled[cls, place]]
    sizes = counts.sum(1)
    at = torch.arange(len(group)) - (sizes.cumsum(0) - sizes)[client]   # place within the client
    mix = rng.uniform(seed, 0, f"partition_{split}_order", client, at)
    order = torch.argsort(client.to(torch.float64) + mix, stable=True)  # by client, then by key
    return ClientSplit(index[order], sizes)


# ---------------------------------------------------------------- the whole split

def skewed_indices(
    train_labels: torch.Tensor,
    test_labels: torch.Tensor,
    num_clients: int,
    seed: int,
    *,
    num_classes: int,
    partition: str,
    train_size: int,
    test_size: int,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    quantity_skew: float = 0.0,
    share: bool = False,
) -> tuple[ClientSplit, ClientSplit]:
    """Every client's (train, test) examples under ``partition`` and ``quantity_skew`` (the module docstring), a
    pure function of the arguments.  The sizes must fit (the data check's :func:`fits` says so first)."""
    n, k = num_clients, num_classes
    have_train = torch.bincount(train_labels.to(torch.int64).cpu(), minlength=k)[:k]
    have_test = torch.bincount(test_labels.to(torch.int64).cpu(), minlength=k)[:k]
    floor = size_floor(train_size, shards_per_client if partition == "shards" else 1)
    # a power-law size is capped at the split's size (binds only with share: without, the sizes sum to <= it)
    sizes = client_sizes(seed, n, train_size, quantity_skew, floor).clamp_max(int(have_train.sum()))
    tests = torch.full((n,), int(test_size), dtype=torch.int64)
    if partition == "dirichlet":
        train = largest_remainder(dirichlet_proportions(seed, torch.arange(n), k, alpha), sizes)
    elif partition == "shards":
        train = shard_counts(seed, have_train, sizes, shards_per_client)
    elif partition == "iid":
        train = balanced_counts(sizes, k)
    else:
        raise ValueError(f"unknown partition {partition!r}; one of {PARTITIONS}")
    train = fit_within_client(train, have_train) if share else fit_to_pool(train, have_train, seed, "partition_fit")
    if partition == "iid":         # balanced test sets, distinct across clients as the iid split's
        test = balanced_counts(tests, k)
        test = fit_within_client(test, have_test) if share else fit_to_pool(test, have_test, seed, "partition_fit")
        test_distinct = not share
    else:                          # label skew: the proportions the client trains on, its test set drawn for it alone
        test = fit_within_client(largest_remainder(train.to(torch.float64), tests), have_test)
        test_distinct = False
    return (indices_from_counts(train, train_labels, seed, "train", distinct=not share),
            indices_from_counts(test, test_labels, seed, "test", distinct=test_distinct))


def skewed(partition: str, quantity_skew: float) -> bool:
    """Whether a split is computed here (anything but iid without quantity skew)."""
    return partition != "iid" or float(quantity_skew) != 0.0


def partition_record(partition: str, alpha: float, shards_per_client: int, quantity_skew: float) -> dict:
    """summary.json's words for a pool's split: ``data_partition`` and the parameters it used (None where it
    used none): ``data_alpha`` (dirichlet), ``data_shards_per_client`` (shards), ``data_quantity_skew`` (0: every
    client the same size)."""
    return {"data_partition": partition,
            "data_alpha": float(alpha) if partition == "dirichlet" else None,
            "data_shards_per_client": int(shards_per_client) if partition == "shards" else None,
            "data_quantity_skew": float(quantity_skew)}
