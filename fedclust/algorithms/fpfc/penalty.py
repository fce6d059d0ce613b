"""FPFC's penalty: the SCAD penalty and its smooth surrogate, the checks of
their hyperparameters (Theorem 1 of the FPFC paper, or the official code's
milder rule), and the θ-step they give in closed form (Algorithm 1, step 5).

Paper: X. Yu, Z. Liu, Y. Sun, W. Wang, "Clustered Federated Learning based on Nonconvex Pairwise
Fusion", https://arxiv.org/abs/2211.04218 (AAAI 2023 student abstract: "Clustered Federated Learning
for Heterogeneous Data")
"""

from __future__ import annotations

import torch

from fedclust.errors import ConfigError


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

