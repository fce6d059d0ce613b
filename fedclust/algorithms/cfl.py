"""CFL server math: Sattler, Müller & Samek, "Clustered Federated Learning:
Model-Agnostic Distributed Multitask Optimization Under Privacy
Constraints", IEEE TNNLS 2021 (named in papers/003 and papers/004), as SPEC §5
fixes it.

One model per cluster, starting with one cluster.  After the warm-up, a
cluster c splits in two when (CFL Algorithm 1 / Eq. for the stopping
criterion, and the authors' reference code)

    ‖ mean_{i∈c} Δθ_i ‖ < ε1    (the cluster's federated objective is near a
                                  stationary point)
    max_{i∈c} ‖Δθ_i‖   > ε2    (but some client is not: incongruent risks)
    |c| > 2                     (a split needs at least 3 clients),

and the split is the complete-linkage bipartition of the clients' pairwise
cosine similarities ``α_ij = <Δθ_i, Δθ_j> / (‖Δθ_i‖‖Δθ_j‖)`` (distance
``−α``; complete linkage only compares distances, so ``1 − α`` gives the same
tree).  Splits recurse over rounds, so the number of clusters is found.

The mean update is unweighted, as in the reference code; pass ``weights``
(data sizes) for the paper's ``|D_i|/|D_c|`` weighting.

Scaling ε1 = 0.4, ε2 = 1.6 "to the model" (SPEC §5 leaves the rule open).
Update norms grow with the parameter count and the learning rate, so the
absolute defaults only suit the model they were tuned on.  Rule adopted
here (:func:`scaled_thresholds`): keep the ratio ε1/ε2 = 1/4 and anchor ε2 at
the model's own update scale, measured once — ``u_w``, the mean client
update norm ``mean_i ‖Δθ_i‖`` over all clients in the last warm-up round
(one cluster, so every client trains the same model) — and let both
thresholds follow the learning-rate schedule, since update norms scale with
it:

    s_t  = (u_w / ε2) · (lr_t / lr_w)
    ε1_t = ε1 · s_t = (ε1/ε2) · u_w · lr_t/lr_w,     ε2_t = ε2 · s_t = u_w · lr_t/lr_w.

In words: split when some client still moves at least as far as a typical
client did at the end of warm-up (lr-corrected), while the cluster's mean
update has shrunk below a quarter of that.  Passing ``reference_norm = ε2``
and ``lr_ratio = 1`` gives back the absolute defaults.
"""

from __future__ import annotations

import torch

from fedclust.algorithms.fedavg import check_weights
from fedclust.errors import ConfigError

EPS = 1e-12  # as the CFL reference code: cos = <a,b> / (‖a‖‖b‖ + 1e-12)


def update_norms(updates: torch.Tensor, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖mean_i Δθ_i‖, max_i ‖Δθ_i‖)`` of one cluster's updates ``[m, P]``
    (0-dim tensors).  ``weights [m]`` weights the mean (paper); None: plain
    mean (reference code)."""
    if updates.dim() != 2 or updates.shape[0] == 0:
        raise ValueError(f"updates must be a non-empty [m, P] stack, got shape {tuple(updates.shape)}")
    if weights is None:
        mean = updates.mean(dim=0)
    else:
        w = check_weights(weights, updates.shape[0]).to(updates.dtype)
        if w.sum() <= 0:
            raise ValueError("weights sum to 0: give positive data sizes")
        mean = (w / w.sum()) @ updates
    return mean.norm(), updates.norm(dim=1).max()


def check_thresholds(eps1: float, eps2: float) -> None:
    """ε1, ε2 must be finite and > 0."""
    for name, v in (("algorithm.eps1", eps1), ("algorithm.eps2", eps2)):
        if not (float(v) > 0 and float(v) < float("inf")):
            raise ConfigError(name, v, "CFL split threshold must be a finite number > 0 (defaults 0.4 and 1.6)")


def should_split(
    updates: torch.Tensor,
    eps1: float,
    eps2: float,
    min_clients: int = 3,
    weights: torch.Tensor | None = None,
) -> bool:
    """CFL split criterion for one cluster (SPEC §5): ``‖mean Δθ‖ < ε1`` and
    ``max ‖Δθ_i‖ > ε2`` and ``m ≥ min_clients`` (default 3: "more than 2
    clients").  ``updates [m, P]`` are the cluster's client updates of this
    round; a cluster with fewer than ``min_clients`` clients never splits
    (returns False, also for m = 0)."""
    check_thresholds(eps1, eps2)
    if updates.dim() != 2:
        raise ValueError(f"updates must be [m, P], got shape {tuple(updates.shape)}")
    if updates.shape[0] < max(min_clients, 2):
        return False
    mean_norm, max_norm = update_norms(updates, weights)
    return bool(mean_norm < eps1) and bool(max_norm > eps2)


def scaled_thresholds(
    reference_norm: float, eps1: float = 0.4, eps2: float = 1.6, lr_ratio: float = 1.0
) -> tuple[float, float]:
    """ε1, ε2 scaled to the model (module docstring):
    ``s = reference_norm / ε2 · lr_ratio``; returns ``(ε1·s, ε2·s)``.

    ``reference_norm``: mean client update norm of the last warm-up round;
    ``lr_ratio``: ``lr_t / lr_w``, this round's learning rate over the one
    of that warm-up round.
    """
    check_thresholds(eps1, eps2)
    if not (float(reference_norm) > 0 and float(reference_norm) < float("inf")):
        raise ConfigError("reference_norm", reference_norm,
                          "needs the (finite, > 0) mean client update norm of the last warm-up round")
    if not float(lr_ratio) > 0:
        raise ConfigError("lr_ratio", lr_ratio, "must be > 0 (learning rate now / at the end of warm-up)")
    s = float(reference_norm) / float(eps2) * float(lr_ratio)
    return float(eps1) * s, float(eps2) * s


def pairwise_cosine(updates: torch.Tensor) -> torch.Tensor:
    """``α_ij = <Δθ_i, Δθ_j> / (‖Δθ_i‖‖Δθ_j‖ + 1e-12)`` → ``[m, m]``
    (CFL Eq. for the cosine similarity; 0 for a zero update)."""
    if updates.dim() != 2:
        raise ValueError(f"updates must be [m, P], got shape {tuple(updates.shape)}")
    norms = updates.norm(dim=1)
    return (updates @ updates.T) / (norms[:, None] * norms[None, :] + EPS)


def complete_linkage_labels(distance: torch.Tensor, n_clusters: int) -> torch.Tensor:
    """Agglomerative complete-linkage clustering of ``m`` items stopped at
    ``n_clusters`` clusters → int64 ``[m]`` labels numbered by smallest member
    (the item 0's cluster is 0).

    ``distance [m, m]`` symmetric (it is symmetrised as ``(D + Dᵀ)/2``).  Each
    of the ``m − n_clusters`` merges joins the two clusters with the smallest
    complete-linkage distance ``max_{a∈A, b∈B} D_ab``; ties go to the pair
    that comes first in row-major order.  Distances between clusters follow
    the Lance-Williams rule ``d(A∪B, C) = max(d(A,C), d(B,C))``.  O(m³) work
    in ``m`` vectorized steps — a split happens a few times per run.
    """
    m = distance.shape[0]
    if distance.shape != (m, m):
        raise ValueError(f"distance must be square [m, m], got {tuple(distance.shape)}")
    if not 1 <= n_clusters <= max(m, 1):
        raise ValueError(f"n_clusters must lie in [1, {m}], got {n_clusters}")
    d = ((distance + distance.T) / 2).to(torch.float64).clone()
    inf = torch.tensor(float("inf"), dtype=d.dtype, device=d.device)
    upper = torch.ones(m, m, dtype=torch.bool, device=d.device).triu(1)
    labels = torch.arange(m, device=d.device)
    active = torch.ones(m, dtype=torch.bool, device=d.device)
    for _ in range(m - n_clusters):
        pair_ok = upper & active[:, None] & active[None, :]
        flat = torch.where(pair_ok, d, inf).flatten().argmin()
        a, b = int(flat // m), int(flat % m)            # a < b
        merged = torch.maximum(d[a], d[b])
        d[a], d[:, a] = merged, merged
        active[b] = False
        labels[labels == b] = a
    _, canon = torch.unique(labels, return_inverse=True)  # representatives are the smallest members
    return canon


def bipartition(similarity: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CFL split: complete-linkage bipartition of ``similarity [m, m]``
    (distance ``−similarity``) → ``(idx_a, idx_b)``, sorted int64 index
    tensors into the cluster's clients; ``idx_a`` holds client 0.

    Equal to ``scipy.cluster.hierarchy.linkage(squareform(1 − S),
    "complete")`` cut at 2 clusters when no distances tie.
    """
    m = similarity.shape[0]
    if similarity.dim() != 2 or similarity.shape != (m, m) or m < 2:
        raise ValueError(f"similarity must be square [m, m] with m >= 2, got {tuple(similarity.shape)}")
    labels = complete_linkage_labels(-similarity, 2)
    idx = torch.arange(m, device=similarity.device)
    return idx[labels == 0], idx[labels == 1]
