"""FPFC, clustered federated learning by nonconvex pairwise fusion (Yu, Liu,
Sun & Wang, AAAI 2023 student abstract; full version arXiv 2211.04218), as
the server algorithm ``fpfc``: ADMM on ``Σ_i f_i(ω_i) + 1/(2m) Σ_{i,j}
g(‖ω_i − ω_j‖, λ)`` with g the SCAD penalty, over the pairwise differences
``θ_ij = ω_i − ω_j``; clients whose ``‖θ_ij‖ ≤ ν`` share a cluster.  What
fedclust runs, its keys and why: docs/algorithms.md, "FPFC".

Paper: X. Yu, Z. Liu, Y. Sun, W. Wang, "Clustered Federated Learning based on Nonconvex Pairwise
Fusion", https://arxiv.org/abs/2211.04218 (AAAI 2023 student abstract: "Clustered Federated Learning
for Heterogeneous Data")
"""

from __future__ import annotations

import sys
import typing
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from fedclust.algorithms.aggregation import cluster_average, own, participants, trainers
from fedclust.algorithms.base import Algorithm, Context, RoundPlan, RoundView, RunFacts, server_result
from fedclust.algorithms.registry import register
from fedclust.engine.layout import ParamLayout
from fedclust.errors import ConfigError
from fedclust.schema import finite, option
from fedclust.sizes import CHECKPOINT_BLOCK_BYTES

# Pairs per chunk × P at most this (4 MB per float32 buffer, or one pair): on 2 CPU cores with 40 MLP clients a
# compact round took 0.9 s with 2^20 against 2.8 s with 2^24, whose 64 MB buffers are fresh mappings faulted in
# at every chunk, and peaked 0.25 GB lower.
CHUNK_ELEMENTS = 2**20

# fpfc.mode: "paper" runs Algorithm 1 as the paper states it and enforces Theorem 1; "official" runs it as the
# authors' code (github.com/xueyu-ubc/FPFC) does (docs/algorithms.md, FPFC, "As its official code runs it").
FpfcMode = Literal["paper", "official"]
MODES = typing.get_args(FpfcMode)
# fpfc.evaluate: what a client holds and is evaluated with (docs/algorithms.md, FPFC).
FpfcEvaluate = Literal["cluster", "own", "own_then_cluster"]
EVALUATE = typing.get_args(FpfcEvaluate)
# fpfc.fuse: what the pairs fuse.  "all": the whole model (the paper; the official Synthetic code, whose model is
# one layer).  "head": the model's last layer only, the body averaged over the round's participants (the official
# LABELSWAP code for MNIST/FMNIST, FLAlgorithms/FPFC.py; docs/algorithms.md, FPFC).
FpfcFuse = Literal["all", "head"]
FUSE = typing.get_args(FpfcFuse)


# ----------------------------------------------------------------------------
# Penalty


def check_penalty(lam: float, a: float, xi: float | None = None, rho: float | None = None) -> None:
    """λ > 0, a > 1, 0 < ξ < λ, ρ(a − 1) > 1 (the θ-step's uniqueness,
    :func:`theta_shrink`): what the math functions need.  A run's
    hyperparameters must satisfy the stronger :func:`check_theorem1`."""
    if not (float(lam) > 0 and float(lam) < float("inf")):
        raise ConfigError("fpfc.lam", lam, "SCAD fusion weight lambda must be finite and > 0")
    if not (float(a) > 1 and float(a) < float("inf")):
        raise ConfigError("fpfc.a", a, "SCAD shape a must be > 1 (Fan & Li use 3.7)")
    if xi is not None and not (0 < float(xi) < float(lam)):
        raise ConfigError("fpfc.xi", xi, f"surrogate width xi must lie in (0, lambda = {lam})")
    if rho is not None and not (float(rho) * (float(a) - 1) > 1 and float(rho) < float("inf")):
        raise ConfigError("fpfc.rho", rho,
                          f"ADMM rho must satisfy rho*(a-1) > 1, i.e. rho > {1 / (float(a) - 1):.6g} "
                          f"(FPFC paper Theorem 1 asks rho > max(2*lambda/xi, 2/(a-1), ...))")


def theorem1_rho_bound(lam: float, a: float, xi: float) -> float:
    """The part of FPFC paper Theorem 1's lower bound on ρ that the
    hyperparameters fix: ``max(2λ/ξ, 2/(a − 1))``.  (Its other terms,
    ``L_f/(1 − 2c^{T/2})`` and ``L_−``, need the loss's smoothness constants,
    docs/algorithms.md.)  Scale-free: λ and ξ scaled alike leave it unchanged."""
    return max(2.0 * float(lam) / float(xi), 2.0 / (float(a) - 1.0))


def theorem1_breach(lam: float, a: float, xi: float, rho: float) -> str | None:
    """What is wrong with ρ under FPFC paper Theorem 1's
    ``ρ > max(2λ/ξ, 2/(a − 1))``, naming the values and the fix; None when
    it holds.  λ, a and ξ must already pass :func:`check_penalty`."""
    bound = theorem1_rho_bound(lam, a, xi)
    if float(rho) > bound and float(rho) < float("inf"):
        return None
    return (f"FPFC paper Theorem 1 needs rho > max(2*lam/xi, 2/(a-1)) = max({2 * lam / xi:.4g}, "
            f"{2 / (a - 1):.4g}) = {bound:.4g} for lam = {lam}, xi = {xi}, a = {a}; raise fpfc.rho above "
            f"{bound:.4g}, or raise fpfc.xi (at most lam) to lower the bound")


def check_theorem1(lam: float, a: float, xi: float, rho: float) -> None:
    """Refuse hyperparameters outside FPFC paper Theorem 1: λ > 0, a > 1,
    0 < ξ < λ and ``ρ > max(2λ/ξ, 2/(a − 1))`` (ConfigError naming the
    field, the value and the fix).  ``ρ > 2/(a − 1)`` implies the θ-step's
    ``ρ(a − 1) > 1``."""
    check_penalty(lam, a, xi)
    breach = theorem1_breach(lam, a, xi, rho)
    if breach:
        raise ConfigError("fpfc.rho", rho, breach)


def check_official(lam: float, a: float, xi: float, rho: float) -> str | None:
    """``fpfc.mode=official``: refuse what the math needs (:func:`check_penalty`,
    the θ-step's ``ρ(a − 1) > 1`` included), and return the warning, naming the
    values, when Theorem 1 is broken (None when it holds): the official code
    itself runs ρ = 1 with λ = 0.6, ξ = 1e-3, where the theorem asks ρ > 1200."""
    check_penalty(lam, a, xi, rho)
    breach = theorem1_breach(lam, a, xi, rho)
    if breach is None:
        return None
    return (f"fpfc.rho = {rho}: {breach}. fpfc.mode=official runs it anyway, as the authors' code does "
            f"(rho = 1); the convergence guarantee of Theorem 1 does not cover this run")


def scad(t: torch.Tensor, lam: float, a: float) -> torch.Tensor:
    """SCAD penalty ``P_a(t, λ)`` (FPFC paper; Fan & Li 2001), elementwise:
    ``λ|t|`` for |t| ≤ λ; ``(aλ|t| − (t² + λ²)/2)/(a − 1)`` for λ < |t| ≤ aλ;
    ``λ²(a + 1)/2`` beyond."""
    check_penalty(lam, a)
    t = t.abs()
    mid = (a * lam * t - 0.5 * (t * t + lam * lam)) / (a - 1)
    return torch.where(t <= lam, lam * t, torch.where(t <= a * lam, mid, torch.full_like(t, lam * lam * (a + 1) / 2)))


def scad_surrogate(t: torch.Tensor, lam: float, a: float, xi: float) -> torch.Tensor:
    """Smooth surrogate ``P̃_a(t, λ) = (λ t²/(2ξ) + ξλ/2)·I(|t| ≤ ξ) + P_a(t, λ)·I(|t| > ξ)``
    (FPFC paper), ξ < λ: continuously differentiable, equal to SCAD for |t| > ξ."""
    check_penalty(lam, a, xi)
    return torch.where(t.abs() <= xi, lam * t * t / (2 * xi) + xi * lam / 2, scad(t, lam, a))


# ----------------------------------------------------------------------------
# ADMM steps


def theta_shrink(r: torch.Tensor, lam: float, a: float, xi: float, rho: float) -> torch.Tensor:
    """The norm of the θ-step's solution, ``s = argmin_{s≥0} P̃_a(s, λ) + ρ/2 (r − s)²``,
    for ``r = ‖δ‖ ≥ 0``, elementwise.

    P̃ depends on ‖θ‖ only, so the θ-step's solution is ``s·δ/‖δ‖``
    (:func:`theta_update`).  For ``ρ(a − 1) > 1`` this 1-D problem is
    strictly convex and, solving each piece of P̃::

        r ≤ ξ + λ/ρ:            s = r / (1 + λ/(ρξ))
        ξ + λ/ρ < r ≤ λ + λ/ρ:  s = r − λ/ρ
        λ + λ/ρ < r ≤ aλ:       s = (ρ(a−1) r − aλ) / (ρ(a−1) − 1)
        r > aλ:                 s = r

    continuous at every knot.  Scale-equivariant:
    ``theta_shrink(r; sλ, a, sξ, ρ) = s·theta_shrink(r/s; λ, a, ξ, ρ)``
    (what ``fpfc.scale_to_model`` rests on).
    """
    check_penalty(lam, a, xi, rho)
    c = rho * (a - 1)
    return torch.where(
        r <= xi + lam / rho, r / (1 + lam / (rho * xi)),
        torch.where(r <= lam + lam / rho, r - lam / rho,
                    torch.where(r <= a * lam, (c * r - a * lam) / (c - 1), r)))


def shrink_factor(delta: torch.Tensor, lam: float, a: float, xi: float,
                  rho: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t, s)`` row-wise for ``delta [E, P]``: ``s = theta_shrink(‖δ‖)``, the
    norm of the θ-step's solution, and ``t = s/‖δ‖`` (0 for δ = 0), so that
    ``θ = t·δ`` (:func:`theta_update`).  ``t > 0`` whenever ``δ ≠ 0``: every
    piece of :func:`theta_shrink` is positive for ``r > 0``."""
    r = delta.norm(dim=-1)
    s = theta_shrink(r, lam, a, xi, rho)
    t = torch.where(r > 0, s / r.clamp_min(torch.finfo(delta.dtype).tiny), torch.zeros_like(r))
    return t, s


def theta_update(delta: torch.Tensor, lam: float, a: float, xi: float, rho: float) -> torch.Tensor:
    """Closed-form θ-step of FPFC paper Algorithm 1, step 5:
    ``argmin_θ P̃_a(‖θ‖, λ) + ρ/2 ‖δ − θ‖²`` row-wise → ``[E, P]`` for
    ``delta [E, P]`` (``θ = theta_shrink(‖δ‖)·δ/‖δ‖``; 0 for δ = 0)."""
    t, _ = shrink_factor(delta, lam, a, xi, rho)
    return delta * t[..., None]


def pair_update(
    omega_i: torch.Tensor, omega_j: torch.Tensor, theta: torch.Tensor, v: torch.Tensor,
    lam: float, a: float, xi: float, rho: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One server step for a batch of pairs (FPFC paper Algorithm 1, step 5):
    ``δ = ω_i − ω_j + v/ρ``, ``θ' = theta_update(δ)``, ``v' = v + ρ(ω_i − ω_j − θ')``.
    All arguments ``[E, P]``; returns ``(θ', v')``."""
    diff = omega_i - omega_j
    theta_new = theta_update(diff + v / rho, lam, a, xi, rho)
    return theta_new, v + rho * (diff - theta_new)


def n_pairs(n: int) -> int:
    """E = n(n − 1)/2 pairs i < j."""
    return n * (n - 1) // 2


def pair_index(n: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(i [E], j [E])`` of the pairs i < j, row-major (the layout of θ and v)."""
    ij = torch.triu_indices(n, n, offset=1, device=device)
    return ij[0], ij[1]


def pairwise_state_bytes(n: int, P: int, world: int = 1, dtype_bytes: int = 4) -> int:
    """Bytes of FPFC's persistent pairwise state on the rank that keeps the
    most, in the compact layout a run keeps (:func:`shard_sweep_`): θ for its
    ``⌈n/world⌉`` clients' rows of K pairs and for the D diametric pairs,
    ``(⌈n/world⌉·K + D)·P·dtype_bytes``, plus two float64 scalars per pair (c
    and ‖θ‖, on every rank), ``16·E``.  One process: ``E·P·dtype_bytes + 16·E``,
    half of Algorithm 1's literal θ and v (``2·E·P·dtype_bytes``)."""
    n, world = int(n), max(1, int(world))
    rows = -(-n // world) * row_slots(n)
    return (rows + diametric_pairs(n)) * int(P) * int(dtype_bytes) + 16 * n_pairs(n)


def init_pair_state(n: int, P: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
    """θ^0 = 0 and v^0 = 0, ``[E, P]`` each (FPFC paper Algorithm 1, init)."""
    E = n_pairs(n)
    return torch.zeros(E, P, dtype=dtype, device=device), torch.zeros(E, P, dtype=dtype, device=device)


def _chunk(P: int, chunk_pairs: int | None) -> int:
    return max(1, chunk_pairs if chunk_pairs else CHUNK_ELEMENTS // max(P, 1))


def server_update_(
    omega: torch.Tensor, theta: torch.Tensor, v: torch.Tensor,
    lam: float, a: float, xi: float, rho: float,
    active: torch.Tensor | None = None, chunk_pairs: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Server step of FPFC paper Algorithm 1 for all pairs, **in place** on
    ``theta``/``v`` ``[E, P]`` (returned for convenience).

    ``omega [n, P]``: every client's current ω (ω^{k+1} for i ∈ A_k, ω^k
    otherwise).  ``active`` bool ``[n]`` (None: everyone): pairs with at least
    one active end are updated, the others kept (docs/algorithms.md, FPFC,
    partial participation).  Pairs go in chunks of ``chunk_pairs`` (default:
    ``CHUNK_ELEMENTS // P``), so the transient memory is a few
    ``chunk × P`` buffers.  Only pairs i < j are stored: ``θ_ji = −θ_ij``,
    ``v_ji = −v_ij``.
    """
    check_penalty(lam, a, xi, rho)
    n, P = omega.shape
    E = n_pairs(n)
    if theta.shape != (E, P) or v.shape != (E, P):
        raise ValueError(f"theta and v must be [n(n-1)/2, P] = [{E}, {P}], got {tuple(theta.shape)}, {tuple(v.shape)}")
    i, j = pair_index(n, omega.device)
    if active is not None:
        if active.shape != (n,) or active.dtype != torch.bool:
            raise ValueError(f"active must be a bool [{n}] mask, got {active.dtype} {tuple(active.shape)}")
        sel = torch.nonzero(active[i] | active[j]).flatten()
    else:
        sel = torch.arange(E, device=omega.device)
    step = _chunk(P, chunk_pairs)
    for start in range(0, sel.numel(), step):   # chunks of pairs, not clients
        e = sel[start:start + step]
        t_new, v_new = pair_update(omega[i[e]], omega[j[e]], theta[e], v[e], lam, a, xi, rho)
        theta[e] = t_new.to(theta.dtype)
        v[e] = v_new.to(v.dtype)
    return theta, v


def zeta(omega: torch.Tensor, theta: torch.Tensor, v: torch.Tensor, rho: float,
         chunk_pairs: int | None = None) -> torch.Tensor:
    """``ζ_i = 1/m Σ_j (ω_j + θ_ij − v_ij/ρ)`` (FPFC paper Algorithm 1, last
    server line) → ``[n, P]``, using θ_ii = v_ii = 0, θ_ji = −θ_ij, v_ji = −v_ij:
    ``ζ = mean(ω) + (1/m)(Σ_{j>i} u_ij − Σ_{j<i} u_ji)`` with ``u = θ − v/ρ``."""
    n, P = omega.shape
    i, j = pair_index(n, omega.device)
    acc = torch.zeros(n, P, dtype=omega.dtype, device=omega.device)
    step = _chunk(P, chunk_pairs)
    for start in range(0, i.numel(), step):
        sl = slice(start, start + step)
        u = (theta[sl] - v[sl] / rho).to(omega.dtype)
        acc.index_add_(0, i[sl], u)
        acc.index_add_(0, j[sl], -u)
    return omega.mean(dim=0, keepdim=True) + acc / n


# ----------------------------------------------------------------------------
# Cluster read-off


def theta_norm_matrix(theta: torch.Tensor, n: int) -> torch.Tensor:
    """Symmetric ``[n, n]`` matrix of ``‖θ_ij‖`` (zero diagonal) from ``theta [E, P]``."""
    i, j = pair_index(n, theta.device)
    out = torch.zeros(n, n, dtype=theta.dtype, device=theta.device)
    norms = theta.norm(dim=1)
    out[i, j] = norms
    out[j, i] = norms
    return out


def clusters_from_theta(theta_norms: torch.Tensor, nu: float) -> torch.Tensor:
    """Clusters of FPFC paper: i ~ j when ``‖θ_ij‖ ≤ ν``; the clusters are the
    connected components of that graph → int64 ``[n]`` labels, numbered by
    smallest member (client 0 is in cluster 0).

    ``theta_norms [n, n]``: see :func:`theta_norm_matrix` (only the part
    above the diagonal is read, so it need not be symmetric).  Components
    via ``scipy.sparse.csgraph.connected_components`` (read-off happens once).
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    n = theta_norms.shape[0]
    if theta_norms.shape != (n, n):
        raise ValueError(f"theta_norms must be square [n, n], got {tuple(theta_norms.shape)}")
    if not float(nu) >= 0:
        raise ConfigError("fpfc.nu", nu, "FPFC's cluster threshold must be >= 0 (paper: in [xi, 0.5])")
    adj = (theta_norms <= nu).triu(1).cpu().numpy()
    _, comp = connected_components(csr_matrix(adj), directed=False)
    # relabel by first occurrence so that numbering follows the smallest member
    _, first = np.unique(comp, return_index=True)
    order = np.empty_like(first)
    order[np.argsort(first)] = np.arange(first.size)
    return torch.as_tensor(order[comp], dtype=torch.int64, device=theta_norms.device)


def threshold_groups(theta_norms: torch.Tensor, nu: float) -> list[list[int]]:
    """The groups the authors' code reads (Synthetic/utils/util.py, ``threshold``):
    client i's list is every j with ``‖θ_ij‖ < ν`` (i itself included), and
    the groups are the distinct lists in order of first appearance.  Not
    connected components: where the ``< ν`` graph is not a union of cliques,
    lists overlap and there are more groups than components."""
    n = theta_norms.shape[0]
    adj = ((theta_norms < nu) | torch.eye(n, dtype=torch.bool, device=theta_norms.device)).cpu()
    lists, inverse = torch.unique(adj, dim=0, return_inverse=True)     # each distinct list once, in any order
    first = torch.full((len(lists),), n).scatter_reduce_(0, inverse, torch.arange(n), "amin")
    return [torch.nonzero(lists[g]).flatten().tolist() for g in torch.argsort(first)]


def threshold_labels(theta_norms: torch.Tensor, nu: float) -> torch.Tensor:
    """``[n]`` int64 the clusters the authors' code reads (``threshold``): each
    client takes the index of the last group of :func:`threshold_groups` that
    holds it; renumbered by smallest member (client 0 in cluster 0)."""
    label = np.zeros(theta_norms.shape[0], dtype=np.int64)
    for k, members in enumerate(threshold_groups(theta_norms, nu)):
        label[members] = k
    values, first = np.unique(label, return_index=True)
    rank = np.empty_like(first)
    rank[np.argsort(first)] = np.arange(first.size)
    lut = np.zeros(label.max() + 1, dtype=np.int64)
    lut[values] = rank
    return torch.as_tensor(lut[label], device=theta_norms.device)


def threshold_models(omega: torch.Tensor, theta_norms: torch.Tensor, nu: float) -> torch.Tensor:
    """``[n, P]`` the models the authors' code gives its clients after its last
    round (``threshold``): each group of :func:`threshold_groups` in turn
    replaces its members' models by their mean, from the models as earlier
    groups left them (a client in several groups ends with the last one's).
    The code weighs the mean by the clients' sample counts; fedclust's clients
    hold equal counts (a file's natural clients excepted, weighed equally here)."""
    models = omega.clone()
    for members in threshold_groups(theta_norms, nu):
        idx = torch.tensor(members, device=omega.device)
        models[idx] = models[idx].mean(dim=0)
    return models


def cluster_models(omega: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``α̂_l = Σ_{i∈Ĝ_l} n_i ω_i / Σ_{i∈Ĝ_l} n_i`` (FPFC paper) → ``[L, P]``,
    L = number of labels; ``weights [n]`` the data sizes (equal when None)."""
    L = int(labels.max()) + 1 if labels.numel() else 0
    prev = torch.zeros(L, omega.shape[1], dtype=omega.dtype, device=omega.device)
    return cluster_average(omega, labels, L, prev, weights)


# ----------------------------------------------------------------------------
# Compact, sharded pair state (what a run keeps)
#
# After a step v is a multiple of θ.  With δ = ω_i − ω_j + v/ρ and θ' = t·δ
# (t = s/‖δ‖, :func:`shrink_factor`), the dual step is v' = v + ρ(ω_i − ω_j − θ')
# = ρ(δ − θ') = ρ(1 − t)·δ.  For δ ≠ 0, t > 0, so v' = c'·θ' with
# c' = ρ(1 − t)/t; for δ = 0, θ' = v' = 0, and v' = c'·θ' holds for any c'
# (c' = 0 is kept).  θ^0 = v^0 = 0 is the same form.  So a run keeps θ and one
# scalar c per pair (v = c·θ): half of θ and v.
#
# Pairs are split between clients circulantly: client i keeps its pairs with
# i + 1, ..., i + K (mod n), K = ⌊(n − 1)/2⌋, as rows [K, P] of a client
# field, so that a rank keeps only its own clients' rows and checkpoints hand
# each row to whichever rank holds that client.  For even n the n/2 pairs
# (i, i + n/2) would fall to both ends; they are kept whole, by every rank.
#
# ζ_i sums terms of pairs that live on other ranks.  Every term is rounded to a
# grid (a power of two per client, set from bounds every rank computes alike)
# fine and narrow enough that every sum of terms is exact in float64: then the
# one all-reduce of the partial sums gives the same bits in any order, on any
# number of ranks (:func:`zeta_units`).


def row_slots(n: int) -> int:
    """K = ⌊(n − 1)/2⌋ pairs each client keeps as rows: client i's pairs with
    i + 1, ..., i + K (mod n), so every client keeps the same number and a
    shard of clients a near-equal share of the pairs."""
    return (int(n) - 1) // 2


def diametric_pairs(n: int) -> int:
    """D = n/2 for even n, else 0: the pairs (i, i + n/2), i < n/2, that a
    circulant split of K slots per client leaves over (``E − n·K``); every
    rank keeps them whole (they are n/2 rows, half of ω's size)."""
    return n_pairs(int(n)) - int(n) * row_slots(n)


def slot_pairs(n: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(owner [E], partner [E])`` of every pair in the compact layout: first
    the rows (client i's slot d = 1..K: partner (i + d) mod n), client-major,
    then the D diametric pairs (i, i + n/2).  Slot e keeps
    ``θ_{owner, partner} = −θ_{partner, owner}``."""
    K, D = row_slots(n), diametric_pairs(n)
    owner = torch.arange(n, device=device).repeat_interleave(K)
    partner = (owner + torch.arange(1, K + 1, device=device).repeat(n)) % n
    half = torch.arange(D, device=device)
    return torch.cat([owner, half]), torch.cat([partner, half + D])


def slot_literal_index(n: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(index [E], sign [E])``: slot e of :func:`slot_pairs` is pair
    ``index[e]`` of :func:`pair_index`'s order (i < j), with θ and v times
    ``sign[e]`` (−1 where the owner is the larger client)."""
    owner, partner = slot_pairs(n, device)
    lo, hi = torch.minimum(owner, partner), torch.maximum(owner, partner)
    index = lo * n - lo * (lo + 1) // 2 + (hi - lo - 1)
    return index, torch.where(owner < partner, 1.0, -1.0).to(device)


def compact_pair_update(
    omega_i: torch.Tensor, omega_j: torch.Tensor, theta: torch.Tensor, ratio: torch.Tensor,
    lam: float, a: float, xi: float, rho: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`pair_update` in the compact form ``v = c·θ``: ``omega_i``,
    ``omega_j``, ``theta [m, P]`` and ``ratio`` c ``[m]`` (float64) →
    ``(θ' [m, P], c' [m], ‖θ'‖ [m])``, with ``δ = ω_i − ω_j + (c/ρ)·θ``,
    ``θ' = t·δ``, ``c' = ρ(1 − t)/t`` (0 where t = 0, i.e. δ = 0) and
    ``‖θ'‖ = s`` (:func:`shrink_factor`).  One operation per kernel, no fused
    multiply-add, so that the bits depend on the values, not on how many
    pairs a chunk holds."""
    delta = omega_i - omega_j
    delta += (ratio / rho).to(theta.dtype)[:, None] * theta
    t, s = shrink_factor(delta, lam, a, xi, rho)
    delta *= t[:, None]
    t64 = t.to(torch.float64)
    ratio_new = torch.where(t64 > 0, rho * (1 - t64) / t64.clamp_min(torch.finfo(torch.float64).tiny),
                            torch.zeros_like(t64))
    return delta, ratio_new, s.to(torch.float64)


def pair_bounds(omega: torch.Tensor, mean: torch.Tensor, ratio: torch.Tensor, norms: torch.Tensor,
                updated: torch.Tensor, owner: torch.Tensor, partner: torch.Tensor, rho: float,
                again: torch.Tensor | None = None, reset: bool = False) -> torch.Tensor:
    """Float64 ``[E]``: a bound on every coordinate of each pair's ζ term
    ``u = θ − v/ρ = (1 − c/ρ)·θ`` after this round's step, from what every
    rank holds (ω, and c and ‖θ‖ of every pair), so that all ranks compute it
    alike and before any pair is updated.

    An updated pair's ``u' = (2t − 1)·δ`` with ``t ∈ (0, 1]``, so
    ``|u'_p| ≤ |δ_p| ≤ |ω_ip − ω_jp| + |c|/ρ·‖θ‖ ≤ a_i + a_j + |c|/ρ·‖θ‖`` with
    ``a_i = max_p |ω_ip − mean_p|``; a pair kept as it is has
    ``|u_p| ≤ |1 − c/ρ|·‖θ‖``.  A pair stepped a second time (``again``,
    :func:`shard_sweep_`) has ``δ₂ = ω_i − ω_j + (1 − t₁)·δ₁``, so ``|u''_p| ≤
    |δ₂_p| ≤ 2(a_i + a_j) + |c|/ρ·‖θ‖``.  With ``reset`` a pair not stepped
    reads θ = 0 and keeps v: ``u = −(c/ρ)·θ``, ``|u_p| ≤ |c|/ρ·‖θ‖``.  Float
    rounding is left to :func:`zeta_units`' margin."""
    dev = (omega - mean).abs_().amax(dim=1).to(torch.float64)       # a_i
    kept = kept_coef(ratio, rho, reset).abs() * norms
    spread = dev[owner] + dev[partner]
    moved = spread + (ratio / rho).abs() * norms
    if again is not None:
        moved = torch.where(again, moved + spread, moved)
    return torch.where(updated, moved, kept)


def zeta_units(n: int, bounds: torch.Tensor, owner: torch.Tensor, partner: torch.Tensor) -> torch.Tensor:
    """Float64 ``[n]``: client k's grid, the power of two
    ``2^⌈log2(16·n·B_k)⌉ / 2^53`` with ``B_k`` the largest bound
    (:func:`pair_bounds`) of k's pairs (1 where ``B_k`` is 0 or not finite).

    A term of k's ζ sum, rounded to a multiple of a grid at least k's, is at
    most twice its size, so the n − 1 terms of k's sum and all their partial
    sums stay below ``2n·B_k·(1 + margin) < 2^53`` grid steps: float64 holds
    every one of them exactly, and ζ's sum is the same in any order (the
    factor 16 leaves 8x for the float rounding of the bounds, of ‖θ‖ and of
    the terms).  The grid is about ``2^-44·B_k`` for 100 clients, far below
    float32's resolution of ζ."""
    top = torch.zeros(n, dtype=torch.float64, device=bounds.device)
    top = top.scatter_reduce(0, owner, bounds, "amax").scatter_reduce(0, partner, bounds, "amax")
    _, exponent = torch.frexp(top * (16.0 * n))        # 16·n·B_k < 2^exponent
    biased = (exponent.to(torch.int64) - 53 + 1023).clamp(64, 2046)
    unit = (biased << 52).view(torch.float64)          # 2^(exponent − 53), built from its bits: exact
    return torch.where(torch.isfinite(top) & (top > 0), unit, torch.ones_like(top))


def kept_coef(ratio: torch.Tensor, rho: float, reset: bool) -> torch.Tensor:
    """The ζ term's factor ``u = coef·θ`` of a pair this round does not step:
    ``1 − c/ρ`` (θ and ``v = c·θ`` kept, Algorithm 1), or with ``reset``
    ``−c/ρ`` (the official LABELSWAP server's fresh zero θ every round: the
    pair reads θ = 0 and keeps its v until it is stepped again)."""
    return -(ratio / rho) if reset else 1 - ratio / rho


def add_zeta_terms_(acc: torch.Tensor, theta: torch.Tensor, coef: torch.Tensor, unit: torch.Tensor,
                    owner: torch.Tensor, partner: torch.Tensor) -> None:
    """Add pairs' ζ terms ``u = coef·θ`` (``coef = 1 − c/ρ``, float64 ``[m]``)
    to ``acc [n, P]`` (float64), ``+u`` to the owner's row and ``−u`` to the
    partner's, each rounded to a multiple of ``unit [m]`` (a power of two, the
    coarser of the two ends' :func:`zeta_units`)."""
    x = theta.to(torch.float64)
    x *= (coef / unit)[:, None]       # unit is a power of two: coef/unit is exact
    x.round_()
    x *= unit[:, None]                # exact
    acc.index_add_(0, owner, x)
    acc.index_add_(0, partner, x, alpha=-1)


def _sweep_(omega: torch.Tensor, theta: torch.Tensor, ratio: torch.Tensor, norms: torch.Tensor,
            owner: torch.Tensor, partner: torch.Tensor, updated: torch.Tensor, adds: torch.Tensor,
            unit: torch.Tensor, acc: torch.Tensor, lam: float, a: float, xi: float, rho: float, step: int,
            again: torch.Tensor | None = None, reset: bool = False) -> None:
    """One pass over some pairs ``[M]``: the server step for the ``updated``
    ones (``theta [M, P]``, ``ratio``, ``norms [M]`` in place), a second step
    for those in ``again`` (a subset of ``updated``; None: none), and the ζ
    terms of the pairs in ``adds`` into ``acc`` (those not stepped with
    :func:`kept_coef`); chunks of ``step`` pairs."""
    todo = torch.nonzero(updated | adds).flatten()
    for start in range(0, todo.numel(), step):   # chunks of pairs, not clients
        e = todo[start:start + step]
        th, keep = theta[e], adds[e]
        for up in (updated[e],) if again is None else (updated[e], again[e]):
            if bool(up.all()):
                th, ratio[e], norms[e] = compact_pair_update(omega[owner[e]], omega[partner[e]], th, ratio[e],
                                                             lam, a, xi, rho)
                theta[e] = th
            elif bool(up.any()):
                u = e[up]
                th_new, ratio[u], norms[u] = compact_pair_update(omega[owner[u]], omega[partner[u]], th[up],
                                                                 ratio[u], lam, a, xi, rho)
                theta[u] = th_new
                th[up] = th_new
        coef = torch.where(updated[e], 1 - ratio[e] / rho, kept_coef(ratio[e], rho, reset))
        if bool(keep.all()):
            add_zeta_terms_(acc, th, coef, unit[e], owner[e], partner[e])
        elif bool(keep.any()):
            add_zeta_terms_(acc, th[keep], coef[keep], unit[e[keep]], owner[e[keep]], partner[e[keep]])


def shard_sweep_(
    omega: torch.Tensor, theta_rows: torch.Tensor, theta_diam: torch.Tensor, ratio: torch.Tensor,
    norms: torch.Tensor, first: int, active: torch.Tensor | None,
    lam: float, a: float, xi: float, rho: float, chunk_pairs: int | None = None, twice: bool = False,
    reset: bool = False,
) -> torch.Tensor:
    """One rank's part of the server step of FPFC paper Algorithm 1 in the
    compact layout; :func:`sum_over_ranks` of what it returns, then
    :func:`shard_finish`, complete it.

    ``omega [n, P]``: every client's current ω; ``theta_rows [C, K, P]``: the
    rows of this rank's clients ``first .. first + C − 1``, updated in place;
    ``theta_diam [D, P]``, ``ratio`` and ``norms`` (float64 ``[E]``, every
    pair's c and ‖θ‖ in :func:`slot_pairs`' order, replicated): updated in
    place for the pairs this rank steps (its rows and the diametric pairs).
    ``active`` bool ``[n]`` (None: everyone): pairs with at least one active
    end are stepped.  ``twice``: pairs with both ends active are stepped
    twice, as the authors' code does (``fpfc.mode=official``: its server loops
    over the participants i and every j, so such a pair is stepped from i's
    side, then from j's; θ's step is odd in δ, so the second is one more
    step of the same pair).  ``reset``: a pair not stepped this round reads
    θ = 0 in ζ, its v kept (:func:`kept_coef`; ``fpfc.reset_theta``, the
    official LABELSWAP server); its stored θ and c, and so v = c·θ and its
    next step, are unchanged.  Returns the float64 buffer ``[n·P + 2·n·K]``: this rank's
    exact partial ζ sums (its rows' pairs, and the diametric pairs its
    clients own) and its rows' new c and ‖θ‖ (zeros elsewhere).
    """
    check_penalty(lam, a, xi, rho)
    n, P = omega.shape
    C, K, D = theta_rows.shape[0], row_slots(n), diametric_pairs(n)
    E = n_pairs(n)
    if theta_rows.shape != (C, K, P) or theta_diam.shape != (D, P) or ratio.shape != (E,) or norms.shape != (E,):
        raise ValueError(f"compact FPFC state must be rows [C, {K}, {P}], diametric [{D}, {P}], ratio and norms "
                         f"[{E}]; got {tuple(theta_rows.shape)}, {tuple(theta_diam.shape)}, {tuple(ratio.shape)}, "
                         f"{tuple(norms.shape)}")
    owner, partner = slot_pairs(n, omega.device)
    if active is None:
        active = torch.ones(n, dtype=torch.bool, device=omega.device)
    elif active.shape != (n,) or active.dtype != torch.bool:
        raise ValueError(f"active must be a bool [{n}] mask, got {active.dtype} {tuple(active.shape)}")
    updated = active[owner] | active[partner]
    again = active[owner] & active[partner] if twice else None
    mean = omega.mean(dim=0)
    unit_client = zeta_units(n, pair_bounds(omega, mean, ratio, norms, updated, owner, partner, rho, again, reset),
                             owner, partner)
    unit = torch.maximum(unit_client[owner], unit_client[partner])
    buffer = torch.zeros(n * P + 2 * n * K, dtype=torch.float64, device=omega.device)
    acc = buffer[:n * P].view(n, P)
    step = _chunk(P, chunk_pairs)
    rows = slice(first * K, (first + C) * K)
    _sweep_(omega, theta_rows.view(C * K, P), ratio[rows], norms[rows], owner[rows], partner[rows], updated[rows],
            torch.ones(C * K, dtype=torch.bool, device=omega.device), unit[rows], acc, lam, a, xi, rho, step,
            None if again is None else again[rows], reset)
    diam = slice(n * K, E)   # every rank steps them alike; the rank of the owner adds their terms
    mine = (owner[diam] >= first) & (owner[diam] < first + C)
    _sweep_(omega, theta_diam, ratio[diam], norms[diam], owner[diam], partner[diam], updated[diam], mine,
            unit[diam], acc, lam, a, xi, rho, step, None if again is None else again[diam], reset)
    stats = buffer[n * P:].view(2, n * K)
    stats[0, rows], stats[1, rows] = ratio[rows], norms[rows]
    return buffer


def sum_over_ranks(buffer: torch.Tensor, all_reduce=lambda x: x) -> torch.Tensor:
    """Every rank's ``buffer`` summed, in place (``all_reduce``: the
    context's, one all-reduce; the default, one process, the buffer as it
    is).  FPFC's sums are exact (:func:`zeta_units`), so the collective's
    order does not matter."""
    return all_reduce(buffer)


def shard_finish(buffer: torch.Tensor, omega: torch.Tensor, ratio: torch.Tensor, norms: torch.Tensor,
                 first: int, count: int) -> torch.Tensor:
    """After :func:`sum_over_ranks`: every pair's c and ‖θ‖ into ``ratio`` and
    ``norms`` (in place), and ``ζ [count, P]`` of clients ``first ..
    first + count − 1``: ``ζ_i = mean(ω) + (1/n)·Σ_j u_ij``, the exact float64
    sum rounded once."""
    n, P = omega.shape
    K = row_slots(n)
    stats = buffer[n * P:].view(2, n * K)
    ratio[:n * K], norms[:n * K] = stats[0], stats[1]
    acc = buffer[:n * P].view(n, P)[first:first + count]
    return (omega.mean(dim=0).to(torch.float64) + acc / n).to(omega.dtype)


def stepped_pairs(n: int, active: torch.Tensor) -> torch.Tensor:
    """Bool ``[E]`` in :func:`slot_pairs`' order: the pairs a round with
    participants ``active`` (bool ``[n]``) steps, those with at least one
    active end."""
    owner, partner = slot_pairs(n, active.device)
    return active[owner] | active[partner]


def read_norms(norms: torch.Tensor, n: int, active: torch.Tensor, reset: bool) -> torch.Tensor:
    """Every pair's ``‖θ‖`` as the round's clusters read it (float64 ``[E]``):
    the stored norms, or with ``reset`` (``fpfc.reset_theta``) 0 for the pairs
    this round did not step (:func:`stepped_pairs`), whose θ reads 0."""
    return torch.where(stepped_pairs(n, active), norms, torch.zeros_like(norms)) if reset else norms


def slot_norm_matrix(norms: torch.Tensor, n: int) -> torch.Tensor:
    """Symmetric ``[n, n]`` float32 matrix of ``‖θ_ij‖`` (zero diagonal) from
    every pair's norm in :func:`slot_pairs`' order (as :func:`theta_norm_matrix`
    for the literal layout)."""
    owner, partner = slot_pairs(n, norms.device)
    out = torch.zeros(n, n, dtype=torch.float32, device=norms.device)
    values = norms.to(torch.float32)
    out[owner, partner] = values
    out[partner, owner] = values
    return out


def literal_pairs(theta_rows: torch.Tensor, theta_diam: torch.Tensor,
                  ratio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(θ, v)`` ``[E, P]`` in Algorithm 1's literal layout (pairs i < j,
    :func:`pair_index`) from the compact one holding every client's rows
    (``theta_rows [n, K, P]``): what the reference functions keep."""
    n, K, P = theta_rows.shape
    if K != row_slots(n) or theta_diam.shape != (diametric_pairs(n), P) or ratio.shape != (n_pairs(n),):
        raise ValueError(f"literal_pairs needs every client's rows [n, {row_slots(n)}, P] and the diametric pairs, "
                         f"got {tuple(theta_rows.shape)} and {tuple(theta_diam.shape)}")
    index, sign = slot_literal_index(n, theta_rows.device)
    slots = torch.cat([theta_rows.reshape(n * K, P), theta_diam]) * sign[:, None].to(theta_rows.dtype)
    theta = torch.empty_like(slots)
    theta[index] = slots
    v = torch.empty_like(slots)
    v[index] = slots * ratio[:, None].to(slots.dtype)
    return theta, v


def from_literal(theta: torch.Tensor, v: torch.Tensor, n: int, first: int, count: int, rho: float,
                 chunk_pairs: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The compact state ``(rows [count, K, P], diametric [D, P], ratio [E],
    norms [E])`` of clients ``first .. first + count − 1`` from the literal
    ``θ, v [E, P]`` (checkpoints written before the compact layout): c is
    ``⟨v, θ⟩/‖θ‖²`` per pair (0 where θ = 0).  Refuses (ValueError) a pair
    whose v is not that multiple of θ to ``1e-3·(‖v‖ + ρ‖θ‖)`` (the scale of
    the float32 rounding in v's update), which Algorithm 1 never leaves."""
    E, P = theta.shape
    K = row_slots(n)
    index, sign = slot_literal_index(n, theta.device)
    ratio = torch.zeros(E, dtype=torch.float64, device=theta.device)
    norms = torch.zeros(E, dtype=torch.float64, device=theta.device)
    step = _chunk(P, chunk_pairs)
    for start in range(0, E, step):   # chunks of pairs
        sl = slice(start, start + step)
        th, vv = theta[sl].to(torch.float64), v[sl].to(torch.float64)
        sq = (th * th).sum(dim=1)
        c = torch.where(sq > 0, (vv * th).sum(dim=1) / sq.clamp_min(torch.finfo(torch.float64).tiny),
                        torch.zeros_like(sq))
        residual = (vv - c[:, None] * th).norm(dim=1)
        bad = torch.nonzero(residual > 1e-3 * (vv.norm(dim=1) + rho * sq.sqrt())).flatten()
        if bad.numel():
            raise ValueError(f"pair {start + int(bad[0])}: v is not a multiple of theta (residual "
                             f"{float(residual[bad[0]]):.3g}); Algorithm 1 never leaves that")
        ratio[sl], norms[sl] = c, theta[sl].norm(dim=1).to(torch.float64)
    ratio, norms = ratio[index], norms[index]     # slot order
    rows = slice(first * K, (first + count) * K)
    own = theta[index[rows]] * sign[rows, None].to(theta.dtype)
    diam = theta[index[n * K:]] * sign[n * K:, None].to(theta.dtype)
    return own.view(count, K, P), diam, ratio, norms


def held_models(ctx: Context, omega: torch.Tensor, labels: torch.Tensor, evaluate: str, last_round: bool,
                means=None) -> torch.Tensor:
    """``[C, P]`` the models this rank's clients hold, and are evaluated with,
    after a round (``fpfc.evaluate``): ``cluster``, its cluster's mean model
    (every round); ``own``, its own ω_i (the authors' MNIST/FMNIST code never
    reads clusters); ``own_then_cluster``, its own ω_i and, in the run's last
    round, its cluster's mean (the authors' Synthetic code reads the clusters
    once, after its last server step).  ``means``: a function giving every
    client's cluster model ``[n, P]`` (None: :func:`cluster_models` of
    ``labels``).  Only what is evaluated changes: every client trains from
    its own ω_i."""
    if evaluate == "own" or (evaluate == "own_then_cluster" and not last_round):
        return own(ctx, omega)
    if means is None:
        return cluster_models(omega, labels)[own(ctx, labels)]
    return own(ctx, means())


# ----------------------------------------------------------------------------
# Head-only fusion (fpfc.fuse=head)


def head_layers(layout: ParamLayout) -> tuple[tuple[str, ...], int]:
    """``(names, first)``: the parameter tensors of the model's last layer,
    those of ``layout.names`` (``named_parameters`` order) that share the
    last name's module (``fc3.weight``, ``fc3.bias`` → ``fc3``), and the
    first column of the flat row they occupy (they end it: the head is
    columns ``first .. P − 1``, the body ``0 .. first − 1``).  Refuses
    (ConfigError on ``fpfc.fuse``) a model whose last layer cannot be told
    that way: a last parameter owned by no submodule."""
    names = layout.names
    module = names[-1].rpartition(".")[0] if names else ""
    if not module:
        raise ConfigError("fpfc.fuse", "head", f"the model's last parameter tensor {names[-1:]} belongs to no "
                          f"submodule, so its last layer (the head) cannot be told; give the classifier its own "
                          f"layer (e.g. self.head = nn.Linear(...)), or use fpfc.fuse=all")
    # named_parameters lists a module's own tensors, then its children's: the last name's module has no
    # children with parameters, and its own tensors are the last ones of the row
    k = len(names)
    while k and names[k - 1].rpartition(".")[0] == module:
        k -= 1
    return names[k:], layout.offsets[k]


def fused_columns(cfg, layout: ParamLayout) -> tuple[tuple[str, ...] | None, int]:
    """``(prox_layers, first)`` of a run of a model of ``layout``: the
    tensors that carry the local proximal term (None: all) and the first of
    the columns ``first .. P − 1`` the pairs fuse; ``(None, 0)`` for
    ``fpfc.fuse=all``, the head's (:func:`head_layers`) for ``head``."""
    if cfg.fpfc.fuse != "head":
        return None, 0
    return head_layers(layout)


def average_body_(omega: torch.Tensor, active: torch.Tensor, first: int) -> torch.Tensor:
    """The official LABELSWAP server's last step (``FPFC.server``, after the
    pairs'): the body, columns ``0 .. first − 1`` of ``omega [n, P]``, of
    every participant (``active`` bool ``[n]``) becomes the participants'
    plain mean (equal weights, whatever their sample counts); the
    non-participants keep their own body.  In place; ``first = 0`` (no body)
    leaves ``omega`` as it is."""
    if first and bool(active.any()):
        omega[active, :first] = omega[active, :first].mean(dim=0)
    return omega


# ----------------------------------------------------------------------------
# Round object


def checkpoint_gather_bytes(n: int, P: int, world: int) -> int:
    """Bytes a checkpoint adds to a run on several ranks: the runner collects
    client rows on rank 0's host (``LoopState.state_dict``), every client's θ
    rows, in column blocks of at most ``CHECKPOINT_BLOCK_BYTES`` that every
    rank receives in turn (twice that when the shards differ in size and are
    trimmed).  One process gathers nothing."""
    if world <= 1:
        return 0
    return n * row_slots(n) * int(P) * 4 + 2 * CHECKPOINT_BLOCK_BYTES


def fpfc_memory_need(n: int, P: int, ranks_sharing: int = 1, world: int = 1, fused: int | None = None) -> int:
    """Bytes FPFC holds on one memory shared by ``ranks_sharing`` ranks of a
    run on ``world`` ranks (at least ``ranks_sharing``), float32: on each, its
    pairwise state (:func:`pairwise_state_bytes`), ω before and after the
    round and the bounds' ``ω − mean`` ``[n, P]``, its clients' ζ, the
    float64 ζ buffer ``[n, P]``, a chunk's buffers (8 of ``chunk × P``, for
    the few float32 ones and the float64 terms); and once, the checkpoint's
    collection on rank 0 (:func:`checkpoint_gather_bytes`).  ``fused``: the
    columns the pairs fuse (``fpfc.fuse=head``: the head's; None: all P),
    the width of θ, ζ and their buffers; a head-only run also builds its
    clients' ``[C, P]`` proximal centre and the fused columns of ω."""
    n, P, world = int(n), int(P), max(int(world), int(ranks_sharing), 1)
    F = P if fused is None else int(fused)
    clients = -(-n // world)
    pairs = clients * row_slots(n) + diametric_pairs(n)
    per_rank = (pairwise_state_bytes(n, F, world) + 3 * n * P * 4 + clients * F * 4
                + n * F * 8 + 16 * n * row_slots(n) + 8 * min(_chunk(F, None), max(pairs, 1)) * F * 4)
    if F != P:
        per_rank += clients * P * 4 + n * F * 4   # the [C, P] centre; the fused columns of ω, contiguous
    return per_rank * int(ranks_sharing) + checkpoint_gather_bytes(n, F, world)


def check_fpfc_memory(cfg, facts: RunFacts, available: tuple[int, str] | None = None) -> None:
    """Refuse an FPFC run whose pairwise state would not fit (ConfigError on
    ``clients`` naming the numbers and the largest client count that fits)."""
    n, P = cfg.clients, facts.layout.numel
    first = fused_columns(cfg, facts.layout)[1]
    free, where = available or facts.free_memory()
    world, sharing = facts.world, 1
    if where.startswith("host"):
        sharing = facts.ranks_per_node   # ranks on this node share its RAM
    need = fpfc_memory_need(n, P, sharing, world, P - first)
    if need <= free:
        return
    # the largest count that fits (the need is not monotonic: shards of unequal size cost a copy at checkpoints)
    fits = next((k for k in range(n - 1, 1, -1) if fpfc_memory_need(k, P, sharing, world, P - first) <= free), 1)
    gib = 2.0**30
    ranks = f", {world} ranks" + (f", {sharing} on this memory" if sharing > 1 else "") if world > 1 else ""
    raise ConfigError(
        "clients", n,
        f"FPFC keeps theta and one number per client pair, n(n-1)/2 = {n_pairs(n)} pairs split between the ranks: "
        f"{need / gib:.2f} GiB (n = {n}, P = {P} parameters, float32{ranks}) but only {free / gib:.2f} GiB are "
        f"free in {where}; use at most {fits} clients, a smaller model, more ranks or a machine with more memory")


@dataclass
class FpfcConfig:
    """The ``fpfc`` section; why the defaults: docs/algorithms.md, FPFC, "Defaults from Theorem 1"."""

    lam: float = option(2.0, "lambda of the SCAD fusion penalty, > 0")
    a: float = option(3.7, "SCAD's a, > 1 (Fan & Li 2001: 3.7)")
    xi: float = option(0.5, "width of the smooth surrogate, in (0, lam)")
    rho: float = option(10.0, "ADMM penalty, also the local proximal weight; > max(2 lam/xi, 2/(a-1)) (FPFC "
                              "paper Theorem 1)")
    nu: float = option(0.5, "||theta_ij|| <= nu puts i and j in one cluster, >= 0 (paper: in [xi, 0.5])")
    scale_to_model: bool = option(True, "read lam, xi and nu in units of round 1's mean update norm")
    mode: FpfcMode = option("paper", "paper: Algorithm 1 as the paper states it, Theorem 1 enforced; official: as the "
                                "authors' code runs it (Theorem 1 only warned about, pairs with both ends "
                                "participating stepped twice, clusters read as its threshold(): equal lists of "
                                "||theta_ij|| < nu)",
        doc=("`paper`: Algorithm 1 as the paper states it, Theorem 1's `rho > max(2·lam/xi, 2/(a−1))` "
            "required; `official`: as the authors' code (`xueyu-ubc/FPFC`) runs it: a breach of Theorem "
            "1 is a printed warning naming the values (the code runs `rho = 1` where the bound is "
            "1200), `rho·(a−1) > 1` is still required, a pair of two participants is stepped twice in a "
            "round, and clusters are read as the code's `threshold()` (distinct lists of `‖θ_ij‖ < nu`)"))
    evaluate: FpfcEvaluate = option("cluster", "what a client holds and is evaluated with: cluster (its cluster's mean "
                                      "model), own (its own omega_i; the official MNIST/FMNIST code), "
                                      "own_then_cluster (own omega_i, its cluster's mean in the last round; the "
                                      "official Synthetic code)",
        doc=("what an FPFC client holds and is evaluated with: `cluster` (its cluster's mean model), "
            "`own` (its own `ω_i`; the code's MNIST/FMNIST runs), `own_then_cluster` (its own `ω_i`, "
            "and its cluster's mean in the last round; the code's Synthetic run). Training is the same "
            "under all three"))
    fuse: FpfcFuse = option("all", "what the pairs fuse: all (the whole model) or head (the model's last layer, with "
                              "the local proximal term on it alone; the body is the round's participants' plain "
                              "mean: the official MNIST/FMNIST code)",
        doc=("what FPFC's pairs fuse: `all`, the whole model; `head`, the model's last layer only (its "
            "tensors as the flat layout lists them, e.g. the MLP's `fc3.weight`, `fc3.bias`; refused "
            "for a model whose last tensor belongs to no submodule), which alone carries the local "
            "proximal term, while the body is the plain mean of the round's participants, handed to "
            "them only: as the official MNIST/FMNIST code (`configs/fpfc_official_fmnist.yaml`); θ and "
            "ζ then cover only the head's columns"))
    reset_theta: bool = option(False, "false: a pair neither of whose ends takes part in a round keeps its theta "
                                      "(Algorithm 1); true: it reads theta = 0, its v kept, until it is stepped "
                                      "again (the official MNIST/FMNIST code's server makes a fresh zero theta "
                                      "every round); matters only with participation < 1",
        doc=("`false`: a pair of FPFC clients neither of which takes part in a round keeps its θ "
            "(Algorithm 1); `true`: it reads θ = 0 in ζ and in the clusters, its v kept, until a round "
            "steps it again, as the official MNIST/FMNIST server, which makes a fresh zero θ every "
            "round (`configs/fpfc_official_fmnist.yaml`). Matters only with `participation` below 1"))

    def validate(self, cfg) -> None:
        if self.mode == "official":
            warning = check_official(self.lam, self.a, self.xi, self.rho)
            if warning:
                print(f"fedclust: warning: {warning}", file=sys.stderr)
        else:
            check_theorem1(self.lam, self.a, self.xi, self.rho)
        if self.reset_theta and cfg.participation >= 1:
            print("fedclust: warning: fpfc.reset_theta=true changes nothing with participation = 1 (every pair is "
                  "stepped every round); set participation below 1, as the official code's 0.5", file=sys.stderr)
        finite("fpfc.nu", self.nu, "the cluster threshold must be a finite number >= 0 (paper: in [xi, 0.5])",
               strict=False)


@dataclass
class FpfcState:
    """The server's state in the compact layout (:func:`shard_sweep_`): θ
    and one scalar c per pair, ``v = c·θ``, the pairs split between the
    clients' rows; computed from the gathered ω.  :attr:`theta` and :attr:`v`
    give Algorithm 1's literal ``[E, P]`` pair arrays where this rank holds
    every client.  With ``fpfc.reset_theta`` a pair the last round did not
    step keeps its last θ here (v = c·θ), and reads as θ = 0 (:func:`read_norms`)."""

    # Every field is given whenever an FpfcState is made: none has a default.  zeta and theta_rows are client
    # rows, as base.client_rows() marks them, written out as the field() call it makes so that type checkers
    # see fields without a default.
    omega: torch.Tensor                       # [n, P] every client's latest ω
    zeta: torch.Tensor = field(metadata={"rows": "client"})        # [C, P] ζ_i of this rank's clients
    theta_rows: torch.Tensor = field(metadata={"rows": "client"})  # [C, K, P] θ of its clients' pairs (slot_pairs)
    theta_diam: torch.Tensor                  # [D, P] θ of the diametric pairs (even n), on every rank
    ratio: torch.Tensor                       # [E] float64 c of every pair, v = c·θ (slot_pairs' order)
    norms: torch.Tensor                       # [E] float64 ‖θ‖ of every pair
    scale: float | None                       # u_1 (1.0 without scale_to_model); None until round 1 sets it
    labels: torch.Tensor                      # [n] int64 clusters read off ‖θ_ij‖ <= ν

    @property
    def theta(self) -> torch.Tensor:
        """θ ``[E, P]`` in the literal layout (:func:`literal_pairs`)."""
        return literal_pairs(self.theta_rows, self.theta_diam, self.ratio)[0]

    @property
    def v(self) -> torch.Tensor:
        """v ``[E, P]`` in the literal layout (:func:`literal_pairs`)."""
        return literal_pairs(self.theta_rows, self.theta_diam, self.ratio)[1]


@register
@dataclass
class Fpfc(Algorithm):
    """FPFC's round (FPFC paper Algorithm 1; docs/algorithms.md, "FPFC")."""

    fpfc: FpfcConfig = field(default_factory=FpfcConfig)
    participation: float = 1.0
    rounds: int = 0            # the run's last round (fpfc.evaluate=own_then_cluster reads the clusters there)
    prox_layers: tuple[str, ...] | None = None   # fpfc.fuse=head: the head's tensors (None: the whole model)
    first: int = 0             # the pairs fuse columns first .. P - 1 (fpfc.fuse=head: the head's); 0 .. first - 1
    #                            (the body) are averaged over the participants

    name = "fpfc"
    report_position = 13
    sections = {"fpfc": FpfcConfig}
    paper_results = {("synthetic", None, 4): (89.46, 0.04)}

    @classmethod
    def from_config(cls, cfg, facts: RunFacts) -> "Fpfc":  # type: ignore[override]  # takes the run's facts (registry.build passes them to a from_config that names them)
        prox_layers, first = fused_columns(cfg, facts.layout)
        return cls(cfg.fpfc, cfg.participation, cfg.rounds, prox_layers, first)

    @classmethod
    def check_run(cls, cfg, facts: RunFacts) -> None:
        check_fpfc_memory(cfg, facts)

    def init(self, ctx: Context) -> FpfcState:
        """ω_i^0 all equal (w0), ζ_i^0 = ω_i^0, θ^0 = 0, v^0 = 0 (c = 0); ζ and
        θ over the fused columns (``fpfc.fuse=head``: the head's)."""
        n, w0 = ctx.n, ctx.w0.detach()
        P, C, E = w0.numel() - self.first, len(ctx.client_ids), n_pairs(n)
        return FpfcState(omega=w0.expand(n, -1).clone(), zeta=w0[self.first:].expand(C, -1).clone(),
                         theta_rows=torch.zeros(C, row_slots(n), P, dtype=w0.dtype, device=w0.device),
                         theta_diam=torch.zeros(diametric_pairs(n), P, dtype=w0.dtype, device=w0.device),
                         ratio=torch.zeros(E, dtype=torch.float64, device=w0.device),
                         norms=torch.zeros(E, dtype=torch.float64, device=w0.device),
                         scale=None, labels=torch.zeros(n, dtype=torch.int64, device=w0.device))

    def plan(self, state: FpfcState, ctx: Context, round_: int, models: torch.Tensor):
        """Client i trains from its own ω_i with the proximal term ``ρ/2‖ω − ζ_i‖²``
        (Algorithm 1 step 3: ``ω ← ω − α[∇f_i(ω) + ρ(ω − ζ_i)]``); with
        ``fpfc.fuse=head`` on the head alone, the body trains plain (the
        official LABELSWAP code's ``FPFC.client``)."""
        start = own(ctx, state.omega)
        # only participants' training is read
        trains = trainers(ctx.seed, round_, ctx.n, self.participation, ctx.online(round_))
        if self.prox_layers is None:
            return state, RoundPlan(start=start, anchor=state.zeta, mu=self.fpfc.rho, trains=trains)
        anchor = start.clone()   # the body's columns are never read (no proximal term there)
        anchor[:, self.first:] = state.zeta
        return state, RoundPlan(start=start, anchor=anchor, mu=self.fpfc.rho, prox_layers=self.prox_layers,
                                trains=trains)

    def aggregate(self, state: FpfcState, ctx: Context, view: RoundView):
        """Participants' ω become their trained models; then each rank steps
        its clients' pairs and the diametric ones (:func:`shard_sweep_`), one
        all-reduce sums the exact ζ terms and shares every pair's c and ‖θ‖,
        and every rank reads the clusters off ‖θ_ij‖ ≤ ν (official mode: as
        the authors' code, :func:`threshold_labels`).  A client holds, and is evaluated with, the model
        ``fpfc.evaluate`` names (:func:`held_models`).  ``fpfc.fuse=head``: the
        pairs and ζ cover the head's columns; the participants' bodies become
        their plain mean (:func:`average_body_`; the pairs never read the
        body, so that it follows their step, as in the code, changes nothing).
        ``fpfc.reset_theta``: the pairs not stepped read θ = 0 in ζ and the
        clusters (:func:`kept_coef`, :func:`read_norms`)."""
        f, after, head = self.fpfc, view.whole_after(), self.first
        active = participants(ctx.seed, view.round, ctx.n, self.participation, after.device, ctx.online(view.round))
        scale = state.scale
        if scale is None:   # u_1 = participants' mean ‖ω_i^1 − ω_i^0‖, fused columns: λ, ξ and ν in its units
            moved = after[active] - state.omega[active]
            moved = moved[:, head:] if head else moved
            scale = float(moved.norm(dim=1).mean()) if f.scale_to_model else 1.0
            if not scale > 0:
                raise ValueError("FPFC: no client moved in round 1 (mean update norm 0); "
                                 "check train.lr, or set fpfc.scale_to_model=false")
        lam, xi, nu = f.lam * scale, f.xi * scale, f.nu * scale
        omega = average_body_(torch.where(active[:, None], after, state.omega), active, head)
        fused = omega[:, head:].contiguous() if head else omega
        first, count = ctx.own_rows.start, len(ctx.client_ids)
        official = f.mode == "official"
        buffer = shard_sweep_(fused, state.theta_rows, state.theta_diam, state.ratio, state.norms, first, active,
                              lam, f.a, xi, f.rho, twice=official, reset=f.reset_theta)
        zeta_own = shard_finish(sum_over_ranks(buffer, ctx.all_reduce), fused, state.ratio, state.norms, first, count)
        del fused
        del buffer
        norms = slot_norm_matrix(read_norms(state.norms, ctx.n, active, f.reset_theta), ctx.n)
        if official:   # the code's threshold(): groups of equal neighbour lists, means taken group after group
            labels = threshold_labels(norms, nu)
            held = held_models(ctx, omega, labels, f.evaluate, view.round == self.rounds,
                               means=lambda: threshold_models(omega, norms, nu))
        else:
            labels = clusters_from_theta(norms, nu)
            held = held_models(ctx, omega, labels, f.evaluate, view.round == self.rounds)
        state = FpfcState(omega=omega, zeta=zeta_own, theta_rows=state.theta_rows, theta_diam=state.theta_diam,
                          ratio=state.ratio, norms=state.norms, scale=scale, labels=labels)
        return state, server_result(ctx, held, labels, active.to(torch.float64), int(active.sum()))

    def load_state_dict(self, ctx: Context, saved: dict) -> FpfcState:
        """The state from a checkpoint, built from the saved tensors alone (no
        zero state of the same size first)."""
        server = dict(saved["server"])
        width = server["theta_diam"].shape[-1]
        want = int(ctx.w0.numel()) - self.first
        if width != want:
            raise ConfigError("fpfc.fuse", self.fpfc.fuse, f"the checkpoint's pair state covers {width} columns but "
                              f"fpfc.fuse={self.fpfc.fuse} fuses {want}; resume with the fpfc.fuse the run started "
                              f"with, or start afresh with overwrite=true")
        return FpfcState(**saved["clients"], **server)
