"""Aggregation math shared by the algorithms (docs/algorithms.md): the gossip
average as one mixing-matrix product, weighted and per-cluster averages,
and the round's participants.  Every function is vectorized over clients.
"""

from __future__ import annotations

import math

import torch

from fedclust import rng
from fedclust.peers import PeerIndex, as_indices


def mixing_matrix(neighbors: torch.Tensor, self_mask: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[C, n] row-stochastic weights from a bool neighbour mask (diagonal excluded)."""
    a = (neighbors & ~self_mask).to(dtype) + self_mask.to(dtype)
    return a / a.sum(dim=1, keepdim=True)


# Clients from which the gossip average adds up each client's own few rows instead of multiplying a [C, n]
# mixing matrix by all n models: see gossip_path.  A function of n alone, so every rank (and every number of
# ranks) takes the same path for the same run.
SPARSE_GOSSIP_MIN_CLIENTS = 500


def gossip_path(n: int) -> str:
    """"dense" (one matrix product, faster for small n) or "sparse" (each
    client's own rows, O(C·k·P) instead of O(C·n·P)) for ``n`` clients."""
    return "sparse" if n >= SPARSE_GOSSIP_MIN_CLIENTS else "dense"


def own_mask(own_ids: torch.Tensor, n: int) -> torch.Tensor:
    """Bool ``[C, n]`` True at each row's own client ``own_ids[c]``."""
    m = torch.zeros(len(own_ids), n, dtype=torch.bool, device=own_ids.device)
    m[torch.arange(len(own_ids), device=own_ids.device), own_ids] = True
    return m


def gossip(neighbors, own_ids: torch.Tensor, all_models: torch.Tensor, path: str | None = None) -> torch.Tensor:
    """[C, P] averaged models of this rank's clients from all [n, P] models:
    each client's own model (row ``own_ids[c]``) and its neighbours', equally
    weighted (:func:`mixing_matrix`).  ``neighbors``: a bool [C, n] mask or a
    :class:`fedclust.peers.PeerIndex`.  ``path``: :func:`gossip_path` of n by default."""
    own_ids = own_ids.to(device=all_models.device, dtype=torch.long)
    n = all_models.shape[0]
    if (path or gossip_path(n)) == "dense":
        mask = neighbors.mask() if isinstance(neighbors, PeerIndex) else neighbors
        return mixing_matrix(mask, own_mask(own_ids, n), all_models.dtype) @ all_models
    return sparse_gossip(neighbors, own_ids, all_models)


def gossip_bags(neighbors, own_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(bags, offsets) of :func:`sparse_gossip`: each client's own row, then
    its neighbours' by increasing index (the row's own client left out), as
    one flat ``embedding_bag`` input."""
    idx, valid = as_indices(neighbors)
    own_ids = own_ids.to(device=idx.device, dtype=torch.long)
    valid = valid & (idx != own_ids[:, None])
    bags = torch.cat([own_ids[:, None], idx], dim=1)[torch.cat([torch.ones_like(valid[:, :1]), valid], dim=1)]
    offsets = (valid.sum(1) + 1).cumsum(0) - (valid.sum(1) + 1)
    return bags, offsets


def sparse_gossip(neighbors, own_ids: torch.Tensor, all_models: torch.Tensor) -> torch.Tensor:
    """:func:`gossip` by index: the mean of a client's own row and its
    neighbours' rows (own first, then neighbours by increasing index), one
    ``embedding_bag`` pass over just those rows; no [C, n] float matrix."""
    bags, offsets = gossip_bags(neighbors, own_ids)
    bags, offsets = bags.to(all_models.device), offsets.to(all_models.device)
    return torch.nn.functional.embedding_bag(bags, all_models, offsets, mode="mean")


def gossip_view(neighbors, own_ids: torch.Tensor, view) -> torch.Tensor:
    """:func:`gossip` of the round's gathered models (``view``, a
    :class:`fedclust.algorithms.base.RoundView`), read a column block at a
    time (:meth:`~fedclust.algorithms.base.RoundView.blocks`).  Whole models
    take :func:`gossip_path`'s path; blocks take the sparse one, whose every
    column is the same mean of the same rows in any block, so that any block
    width (and any number of processes) gives the same bits."""
    path = gossip_path(view.all_after.shape[0]) if view.whole else "sparse"
    out = None
    for start, stop, cols in view.blocks(("after",)):   # column blocks: one gather each
        part = gossip(neighbors, own_ids, cols["after"], path)
        if start == 0 and stop == view.width:
            return part
        if out is None:
            out = part.new_empty(part.shape[0], view.width)
        out[:, start:stop] = part
    if out is None:
        raise ValueError("gossip_view: the round's gather gave no column block (a model of no parameters?)")
    return out


def check_weights(weights: torch.Tensor, count: int, name: str = "weights") -> torch.Tensor:
    """Validate client weights (data sizes ``n_i``): ``[count]``, finite, ≥ 0."""
    if weights.dim() != 1 or weights.shape[0] != count:
        raise ValueError(f"{name} must have shape [{count}] (one per client), got {tuple(weights.shape)}")
    if not torch.isfinite(weights).all() or (weights < 0).any():
        raise ValueError(f"{name} must be finite and >= 0 (e.g. training-set sizes), got {weights.tolist()[:10]}")
    return weights


def pairwise_sum(rows: torch.Tensor) -> torch.Tensor:
    """``Σ_i rows_i`` → ``[P]`` by pairwise halving: rows (0, 1), (2, 3), ...
    are added, an odd last row carried, until one is left.  Each column is
    the same sequence of float additions whatever other columns ``rows``
    holds, so a column block gives the whole sum's bits (the exchange in
    column blocks); the error grows with log2 of the rows, as in a cascade sum."""
    if rows.dim() != 2 or rows.shape[0] == 0:
        raise ValueError(f"rows must be a non-empty [C, P] stack, got shape {tuple(rows.shape)}")
    while rows.shape[0] > 1:   # log2(C) halvings, each one elementwise add over the tensor
        m = rows.shape[0]
        half = rows[0:m - 1:2] + rows[1:m:2]
        rows = torch.cat([half, rows[m - 1:]]) if m % 2 else half
    return rows[0]


def weighted_average(models: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """FedAvg aggregate ``Σ_i w_i·models_i / Σ_i w_i`` → ``[P]``
    (FedGroup paper Algorithm 1 line 8; equal weights when ``weights`` is None),
    summed by :func:`pairwise_sum`, so that column blocks of ``models`` give
    the same bits as the whole.

    Raises ValueError for no clients or weights summing to 0: the caller
    decides what an empty round means (e.g. keep the previous model, as
    :func:`cluster_average` does).
    """
    if models.dim() != 2 or models.shape[0] == 0:
        raise ValueError(f"models must be a non-empty [C, P] stack, got shape {tuple(models.shape)}")
    if weights is None:
        return pairwise_sum(models) / models.shape[0]
    w = check_weights(weights, models.shape[0]).to(models.dtype)
    total = w.sum()
    if total <= 0:
        raise ValueError("weights sum to 0: no client carries weight; give positive data sizes")
    return pairwise_sum(models * (w / total)[:, None])


AVERAGE_CHUNK_ELEMENTS = 2**24   # rows x columns of the models an average copies at once (64 MB of float32)


def _row_chunks(models: torch.Tensor, rows: torch.Tensor):
    """``(start, stop, models[rows, start:stop])`` over chunks of columns of
    at most :data:`AVERAGE_CHUNK_ELEMENTS` numbers: the chosen rows are never
    copied all at once (a view when every row is chosen)."""
    every = rows.numel() == models.shape[0] and bool((rows == torch.arange(len(rows), device=rows.device)).all())
    step = max(1, AVERAGE_CHUNK_ELEMENTS // max(rows.numel(), 1))
    for start in range(0, models.shape[1], step):   # chunks of columns, not clients
        stop = min(start + step, models.shape[1])
        yield start, stop, models[:, start:stop] if every else models[rows, start:stop]


def _row_indices(rows: torch.Tensor, device) -> torch.Tensor:
    rows = rows.to(device)
    return rows.nonzero().flatten() if rows.dtype == torch.bool else rows


def average_rows(view, rows: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`weighted_average` of the gathered models' ``rows`` (bool [n] or
    indices) → ``[P]``, read whole or in column blocks (``view.columns``) and
    a chunk of columns at a time (:meth:`~fedclust.algorithms.base.RoundView.blocks`): the same bits either way,
    the sum being column by column (:func:`pairwise_sum`)."""
    rows = _row_indices(rows, view.after.device)   # view.after: this rank's models, where the gathered ones are
    out = view.after.new_empty(view.width)
    for offset, _, got in view.blocks(("after",)):
        models = got["after"]
        for start, stop, chunk in _row_chunks(models, rows):
            out[offset + start:offset + stop] = weighted_average(chunk, weights)
    return out


def cluster_average_rows(view, rows: torch.Tensor, assign: torch.Tensor, K: int, previous: torch.Tensor,
                         weights: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`cluster_average` of the gathered models' ``rows`` (bool [n] or
    indices), ``assign [n]`` every client's cluster → ``[K, P]``, read as
    :func:`average_rows` reads them, with the same bits (``index_add_`` adds
    each column's rows in order)."""
    rows = _row_indices(rows, previous.device)
    assign = assign.to(previous.device)[rows]
    out = torch.empty_like(previous)
    for offset, _, got in view.blocks(("after",)):
        models = got["after"]
        for start, stop, chunk in _row_chunks(models, rows):
            a, b = offset + start, offset + stop
            out[:, a:b] = cluster_average(chunk, assign, K, previous[:, a:b], weights)
    return out


def participants(seed: int, round_: int, n: int, share: float, device=None,
                 online: torch.Tensor | None = None) -> torch.Tensor:
    """Bool ``[n]``: the clients taking part in round ``round_`` — the
    ``ceil(share·n)`` (at least 1) with the lowest keys
    ``rng.uniform(seed, round_, "participation", i, 0)``; everyone when
    ``share >= 1``.  A pure function of (seed, round), the same on every rank.
    ``online`` (bool ``[n]``, config ``network.p_offline``): the server
    samples among the clients online this round, ``ceil(share · online)``
    of them (at least 1 when anyone is online); None: everyone is online."""
    if not 0 < share <= 1:
        raise ValueError(f"participation share must lie in (0, 1], got {share}")
    if online is not None:
        online = online.to("cpu", torch.bool)
        if share >= 1:
            return online.to(device)
        count = max(1, math.ceil(share * int(online.sum()) - 1e-9)) if bool(online.any()) else 0
        keys = rng.uniform(seed, round_, "participation", torch.arange(n), 0).masked_fill(~online, 2.0)
        chosen = torch.argsort(keys, stable=True)[:count]
        mask = torch.zeros(n, dtype=torch.bool)
        mask[chosen] = True
        return mask.to(device)
    if share >= 1:
        return torch.ones(n, dtype=torch.bool, device=device)
    count = max(1, math.ceil(share * n - 1e-9))
    keys = rng.uniform(seed, round_, "participation", torch.arange(n), 0)
    chosen = torch.argsort(keys, stable=True)[:count]
    mask = torch.zeros(n, dtype=torch.bool)
    mask[chosen] = True
    return mask.to(device)


def trainers(seed: int, round_: int, n: int, share: float, online: torch.Tensor | None = None) -> torch.Tensor | None:
    """``RoundPlan.trains`` of an algorithm whose aggregate reads the trained
    models of the round's :func:`participants` alone: that mask (on the CPU),
    or None (everyone trains) when ``share >= 1`` and everyone is online."""
    return None if share >= 1 and online is None else participants(seed, round_, n, share, online=online)


def own(ctx, values: torch.Tensor) -> torch.Tensor:
    """Rows of an ``[n, ...]`` tensor that belong to this rank's clients."""
    return values[ctx.client_ids.to(values.device)]


def cluster_counts(assign: torch.Tensor, K: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Total weight (client count when ``weights`` is None) per cluster → ``[K]``."""
    w = (torch.ones(assign.shape[0], dtype=torch.float64, device=assign.device) if weights is None
         else weights.to(torch.float64))
    return torch.zeros(K, dtype=torch.float64, device=assign.device).index_add_(0, assign, w)


def cluster_average(
    models: torch.Tensor,
    assign: torch.Tensor,
    K: int,
    previous: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-cluster (weighted) average of client models → ``[K, P]``
    (IFCA paper Algorithm 1 option II: ``θ_j ← Σ_{i: ĵ_i=j} n_i θ_i / Σ n_i``).

    ``assign`` int64 ``[C]`` in ``[0, K)``; ``previous`` ``[K, P]`` the cluster
    models before the round; ``weights`` ``[C]`` ≥ 0 (data sizes), equal when
    None.  A cluster with no client (or zero total weight) keeps
    ``previous[j]``.  One ``index_add_`` over clients, no Python loop.
    """
    C, P = models.shape
    if assign.shape != (C,) or assign.dtype != torch.int64:
        raise ValueError(f"assign must be int64 [{C}], got {assign.dtype} {tuple(assign.shape)}")
    if previous.shape != (K, P):
        raise ValueError(f"previous must be [K, P] = [{K}, {P}], got {tuple(previous.shape)}")
    if C and (assign.min() < 0 or assign.max() >= K):
        raise ValueError(f"assign values must lie in [0, {K}), got range [{int(assign.min())}, {int(assign.max())}]")
    w = (torch.ones(C, dtype=models.dtype, device=models.device) if weights is None
         else check_weights(weights, C).to(models.dtype))
    weighted = models if weights is None else models * w[:, None]   # equal weights: x * 1 is x, no copy
    sums = torch.zeros(K, P, dtype=models.dtype, device=models.device).index_add_(0, assign, weighted)
    totals = torch.zeros(K, dtype=models.dtype, device=models.device).index_add_(0, assign, w)
    filled = totals > 0
    means = sums / totals.clamp_min(torch.finfo(models.dtype).tiny)[:, None]
    return torch.where(filled[:, None], means, previous.to(models.dtype))
