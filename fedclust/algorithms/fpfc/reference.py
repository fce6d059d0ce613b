"""FPFC's server step in Algorithm 1's literal layout, as the paper states
it: θ and v, ``[E, P]`` each, one row per pair i < j
(:func:`fedclust.algorithms.fpfc.pairs.pair_index`).  A run keeps the
compact layout instead (:mod:`fedclust.algorithms.fpfc.compact`: half the
memory, sharded between ranks); this one is kept as the reference the tests
hold the compact one to (``tests/unit/test_fpfc_math.py``, ``tests/unit/test_fpfc_state.py``).
"""

from __future__ import annotations

import torch

from fedclust.algorithms.fpfc.pairs import n_pairs, pair_chunk, pair_index
from fedclust.algorithms.fpfc.penalty import check_penalty, theta_update


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


def init_pair_state(n: int, P: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
    """θ^0 = 0 and v^0 = 0, ``[E, P]`` each (FPFC paper Algorithm 1, init)."""
    E = n_pairs(n)
    return torch.zeros(E, P, dtype=dtype, device=device), torch.zeros(E, P, dtype=dtype, device=device)


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
    step = pair_chunk(P, chunk_pairs)
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
    step = pair_chunk(P, chunk_pairs)
    for start in range(0, i.numel(), step):
        sl = slice(start, start + step)
        u = (theta[sl] - v[sl] / rho).to(omega.dtype)
        acc.index_add_(0, i[sl], u)
        acc.index_add_(0, j[sl], -u)
    return omega.mean(dim=0, keepdim=True) + acc / n

