"""Heuristic Neighbour Matching, stage two of PANM (PANM paper §3.2.3
Eq. 14-18, docs/algorithms.md).

Every τ rounds client i draws ``C_i`` (l uniform non-neighbours, never i)
and ``S_i`` (l uniform neighbours, all of ``N_i`` if it has ≤ l), scores
``y_j = s_ij`` on ``M = C ∪ S`` and runs hard-assignment EM for a mixture of
two 1-D Gaussians, starting from S in one component and C in the other.
``H_i`` is the component with the higher mean and ``N_i ← (N_i \\ S_i) ∪ H_i``.
The paper initialises S in the component it later calls "different" (a
typo, docs/algorithms.md): here the same-cluster side is simply the higher-mean one.

Every round of stage two averages with k neighbours drawn uniformly from
``N_i`` (all of them if fewer).

The EM is batched over clients: values ``y [C, m]`` with a validity mask.

Paper: Z. Li, J. Lu, S. Luo, D. Zhu, Y. Shao, Y. Li, Z. Zhang, C. Wu, "Mining Latent Relationships
among Clients: Peer-to-peer Federated Learning with Adaptive Neighbor Matching",
https://arxiv.org/abs/2203.12285
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedclust.algorithms.similarity import PoolScores
from fedclust.network import Reach, both
from fedclust.peers import PeerIndex, mask_indices

MAX_EM_STEPS = 100
VAR_FLOOR_REL = 1e-3    # variance floor: this share of the row's overall variance ...
VAR_FLOOR_ABS = 1e-12   # ... plus this absolute amount (all values equal, one element)


@dataclass
class EMResult:
    high: torch.Tensor       # [C, m] bool: member of the higher-mean component (valid entries only)
    empty: torch.Tensor      # [C] bool: EM ended with a component empty (no split found)
    assign_a: torch.Tensor   # [C, m] bool: final assignment to component A (the one started from init_a)
    steps: torch.Tensor      # [C] int: assignment updates until no change (MAX_EM_STEPS if capped)


def _component_stats(y: torch.Tensor, member: torch.Tensor, floor: torch.Tensor):
    """Per row count, mean and floored (population) variance of the member entries."""
    cnt = member.sum(1).to(y.dtype)
    safe = cnt.clamp_min(1.0)
    mean = (y * member).sum(1) / safe
    var = (((y - mean[:, None]) ** 2) * member).sum(1) / safe
    return cnt, mean, torch.maximum(var, floor)


def _log_weighted_density(y, cnt, total, mean, var):
    """``log(β_r φ(y; μ_r, σ_r))`` with β_r = n_r / |M|; -inf for an empty component."""
    log_beta = torch.where(cnt > 0, torch.log(cnt / total.clamp_min(1.0)), torch.full_like(cnt, -math.inf))
    return (log_beta - 0.5 * torch.log(2 * math.pi * var))[:, None] - (y - mean[:, None]) ** 2 / (2 * var[:, None])


def variance_floor(y: torch.Tensor, valid: torch.Tensor,
                   rel: float = VAR_FLOOR_REL, abs_: float = VAR_FLOOR_ABS) -> torch.Tensor:
    """``[C]`` floor for the component variances: ``rel·Var(valid y) + abs``."""
    total = valid.sum(1).to(y.dtype).clamp_min(1.0)
    mean = (y * valid).sum(1) / total
    var = (((y - mean[:, None]) ** 2) * valid).sum(1) / total
    return rel * var + abs_


def pooled_variance(cnt_a, var_a, cnt_b, var_b, floor):
    """The within-component variance shared by both components (tied
    covariance): ``(n_a σ_a² + n_b σ_b²) / (n_a + n_b)``, floored."""
    total = (cnt_a + cnt_b).clamp_min(1.0)
    return torch.maximum((cnt_a * var_a + cnt_b * var_b) / total, floor)


def em_two_gaussians(y: torch.Tensor, valid: torch.Tensor, init_a: torch.Tensor,
                     max_steps: int = MAX_EM_STEPS, rel_floor: float = VAR_FLOOR_REL,
                     abs_floor: float = VAR_FLOOR_ABS, variance: str = "separate") -> EMResult:
    """Hard-assignment EM for two 1-D Gaussians, batched over rows (PANM paper Eq. 15-17).

    ``y [C, m]`` values, ``valid [C, m]`` which of them exist, ``init_a``
    the valid entries that start in component A (the rest start in B).
    Alternates the estimates (mean, variance, weight of each component) and
    the assignment ``argmax_r β_r φ(y; μ_r, σ_r)`` (ties go to A) until no
    assignment changes, at most ``max_steps`` updates.  Variances are floored
    at ``rel_floor·Var(y) + abs_floor`` per row.  A row whose EM ends with a
    component empty (fewer than two values, all values equal, ...) is flagged
    in ``empty``.
    """
    y = torch.where(valid, y.to(torch.float64), torch.zeros((), dtype=torch.float64, device=y.device))
    a = init_a & valid
    floor = variance_floor(y, valid, rel_floor, abs_floor)
    total = valid.sum(1).to(y.dtype)
    steps = torch.zeros(y.shape[0], dtype=torch.int64, device=y.device)
    for _ in range(max_steps):  # EM steps, each vectorized over clients
        b = valid & ~a
        cnt_a, mean_a, var_a = _component_stats(y, a, floor)
        cnt_b, mean_b, var_b = _component_stats(y, b, floor)
        if variance == "tied":
            var_a = var_b = pooled_variance(cnt_a, var_a, cnt_b, var_b, floor)
        log_a = _log_weighted_density(y, cnt_a, total, mean_a, var_a)
        log_b = _log_weighted_density(y, cnt_b, total, mean_b, var_b)
        new_a = valid & (log_a >= log_b)
        changed = (new_a != a).any(1)
        if not bool(changed.any()):
            break
        steps += changed.to(torch.int64)
        a = new_a
    b = valid & ~a
    cnt_a, mean_a, _ = _component_stats(y, a, floor)
    cnt_b, mean_b, _ = _component_stats(y, b, floor)
    empty = (cnt_a == 0) | (cnt_b == 0)
    a_high = mean_a >= mean_b
    high = torch.where(a_high[:, None], a, b)
    return EMResult(high=high, empty=empty, assign_a=a, steps=steps)


def hnm_draw(seed: int, round_: int, client_ids: torch.Tensor, neighbors: torch.Tensor,
             l: int, reach: Reach | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(C_i, S_i)`` as bool ``[C, n]``: l uniform non-neighbours (never i)
    and l uniform neighbours (all of ``N_i`` if it has ≤ l), both among the
    round's graph neighbours (``reach``; None: every other client).  The
    draws read ``neighbors`` a chunk of rows at a time (no [C, n] temporaries)."""
    n = neighbors.shape[1]
    cand = PeerIndex.draw(seed, round_, "hnm_candidates", client_ids, n, l,
                          both(lambda lo, hi: ~neighbors[lo:hi], reach))
    return cand.mask(), PeerIndex.draw(seed, round_, "hnm_sample", client_ids, n, l, both(neighbors, reach)).mask()


def hnm_update(neighbors: torch.Tensor, cand: torch.Tensor, sample: torch.Tensor,
               similarity: torch.Tensor | PoolScores, **em_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """One HNM step (PANM paper Eq. 18): ``(new N [C, n], failed [C])``.

    ``similarity`` must hold ``s_ij`` on ``M = C ∪ S``: a ``[C, n]`` matrix,
    or :class:`fedclust.algorithms.similarity.PoolScores` on that pool
    (its values are read as they are, no ``[C, n]`` matrix).  S starts in
    component A, C in B; ``H`` is the higher-mean component and
    ``N ← (N \\ S) ∪ H``.  Where EM ends with a component empty, N is left
    unchanged and ``failed`` is True.
    """
    if isinstance(similarity, torch.Tensor):
        idx, valid = mask_indices(cand | sample)   # padding points at column 0: read only where valid
        values = similarity.gather(1, idx)
    else:                                     # PoolScores on this pool: its columns are the same idx
        idx, valid, values = similarity.idx, similarity.valid, similarity.values
    if idx.shape[1] == 0:
        return neighbors.clone(), torch.ones(neighbors.shape[0], dtype=torch.bool, device=neighbors.device)
    # The EM is a loop of tiny steps ([C, 2l] values) with a convergence check each step: on a GPU that is
    # hundreds of kernel launches and a host sync per step, so it runs on the host there (same float64 math).
    host = torch.device("cpu")
    res = em_two_gaussians(values.to(host), valid.to(host),
                           (sample.gather(1, idx) & valid).to(host), **em_kwargs)
    res_high, res_empty = res.high.to(neighbors.device), res.empty.to(neighbors.device)
    # N ← (N \ S) ∪ H on a copy of N, written by index (rows whose EM emptied a component keep N)
    updated = neighbors.clone()
    rows = torch.arange(neighbors.shape[0], device=neighbors.device)[:, None]
    s_idx, s_valid = mask_indices(sample)
    drop = s_valid & ~res_empty[:, None]
    updated[rows.expand_as(s_idx)[drop], s_idx[drop]] = False
    add = res_high & valid & ~res_empty[:, None]                      # idx holds pool entries only
    updated[rows.expand_as(idx)[add], idx[add]] = True
    return updated, res_empty


def draw_average(seed: int, round_: int, client_ids: torch.Tensor, neighbors: torch.Tensor, k: int,
                 reach: Reach | None = None) -> PeerIndex:
    """Whom to average with this round of stage two: k uniform from ``N_i`` (all if fewer), among the round's
    graph neighbours (``reach``), as index lists."""
    return PeerIndex.draw(seed, round_, "neighbors", client_ids, neighbors.shape[1], k, both(neighbors, reach))
