"""IFCA server math (SPEC §5; papers/002, Ghosh et al. 2020, Algorithm 1,
option II "model averaging").

Each round every participating client i evaluates the K cluster models on
its own training data and takes ``ĵ = argmin_j F_i(θ_j)`` (its cluster
identity estimate); it trains that model locally and the server averages,
per cluster, the models of the clients that chose it.  A cluster nobody
chose keeps its model (papers/002: for k larger than the true number of
clusters the extra clusters stay empty).

Shapes: client models ``[C, P]``, cluster models ``[K, P]``, losses
``[C, K]``, assignments int64 ``[C]``.
"""

from __future__ import annotations

import torch

from fedclust.algorithms.fedavg import check_weights


def assign_clusters(losses: torch.Tensor) -> torch.Tensor:
    """Cluster identity estimate ``ĵ_i = argmin_j F_i(θ_j)`` → int64 ``[C]``
    (papers/002 Algorithm 1, "cluster identity estimation").

    ``losses[i, j]`` is client i's mean training loss under cluster model j.
    Ties go to the lowest index; a NaN loss counts as +inf (a diverged model
    is never preferred; if a whole row is NaN the client takes cluster 0).
    """
    if losses.dim() != 2 or losses.shape[1] == 0:
        raise ValueError(f"losses must be [C, K] with K >= 1, got shape {tuple(losses.shape)}")
    clean = torch.nan_to_num(losses, nan=float("inf"))
    return torch.argmin(clean, dim=1)   # torch returns the first minimum: lowest index on ties


def cluster_counts(assign: torch.Tensor, K: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Total weight (client count when ``weights`` is None) per cluster → ``[K]``."""
    w = torch.ones(assign.shape[0], dtype=torch.float64, device=assign.device) if weights is None else weights.to(torch.float64)
    return torch.zeros(K, dtype=torch.float64, device=assign.device).index_add_(0, assign, w)


def cluster_average(
    models: torch.Tensor,
    assign: torch.Tensor,
    K: int,
    previous: torch.Tensor,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-cluster (weighted) average of client models → ``[K, P]``
    (papers/002 Algorithm 1 option II: ``θ_j ← Σ_{i: ĵ_i=j} n_i θ_i / Σ n_i``).

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
    w = torch.ones(C, dtype=models.dtype, device=models.device) if weights is None else check_weights(weights, C).to(models.dtype)
    sums = torch.zeros(K, P, dtype=models.dtype, device=models.device).index_add_(0, assign, models * w[:, None])
    totals = torch.zeros(K, dtype=models.dtype, device=models.device).index_add_(0, assign, w)
    filled = totals > 0
    means = sums / totals.clamp_min(torch.finfo(models.dtype).tiny)[:, None]
    return torch.where(filled[:, None], means, previous.to(models.dtype))
