"""FPFC, clustered federated learning by nonconvex pairwise fusion (Yu, Liu,
Sun & Wang, AAAI 2023 student abstract; full version arXiv 2211.04218), as
the server algorithm ``fpfc``: ADMM on ``Σ_i f_i(ω_i) + 1/(2m) Σ_{i,j}
g(‖ω_i − ω_j‖, λ)`` with g the SCAD penalty, over the pairwise differences
``θ_ij = ω_i − ω_j``; clients whose ``‖θ_ij‖ ≤ ν`` share a cluster.  What
fedclust runs, its keys and why: docs/algorithms.md, "FPFC".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fedclust.algorithms.aggregation import cluster_average, own, participants
from fedclust.algorithms.base import Algorithm, Context, RoundPlan, RoundView, server_result, client_rows
from fedclust.algorithms.registry import register
from fedclust.dist import available_memory, world_from_env
from fedclust.errors import ConfigError
from fedclust.models import parameter_count
from fedclust.schema import finite, option

CHUNK_ELEMENTS = 2**24      # pairs per chunk × P at most this (64 MB per float32 buffer)


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


def check_theorem1(lam: float, a: float, xi: float, rho: float) -> None:
    """Refuse hyperparameters outside FPFC paper Theorem 1: λ > 0, a > 1,
    0 < ξ < λ and ``ρ > max(2λ/ξ, 2/(a − 1))`` (ConfigError naming the
    field, the value and the fix).  ``ρ > 2/(a − 1)`` implies the θ-step's
    ``ρ(a − 1) > 1``."""
    check_penalty(lam, a, xi)
    bound = theorem1_rho_bound(lam, a, xi)
    if not (float(rho) > bound and float(rho) < float("inf")):
        raise ConfigError(
            "fpfc.rho", rho,
            f"FPFC paper Theorem 1 needs rho > max(2*lam/xi, 2/(a-1)) = max({2 * lam / xi:.4g}, "
            f"{2 / (a - 1):.4g}) = {bound:.4g} for lam = {lam}, xi = {xi}, a = {a}; raise fpfc.rho above "
            f"{bound:.4g}, or raise fpfc.xi (at most lam) to lower the bound")


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


def theta_update(delta: torch.Tensor, lam: float, a: float, xi: float, rho: float) -> torch.Tensor:
    """Closed-form θ-step of FPFC paper Algorithm 1, step 5:
    ``argmin_θ P̃_a(‖θ‖, λ) + ρ/2 ‖δ − θ‖²`` row-wise → ``[E, P]`` for
    ``delta [E, P]`` (``θ = theta_shrink(‖δ‖)·δ/‖δ‖``; 0 for δ = 0)."""
    r = delta.norm(dim=-1)
    s = theta_shrink(r, lam, a, xi, rho)
    scale = torch.where(r > 0, s / r.clamp_min(torch.finfo(delta.dtype).tiny), torch.zeros_like(r))
    return delta * scale[..., None]


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


def pairwise_state_bytes(n: int, P: int, dtype_bytes: int = 4) -> int:
    """Bytes of FPFC's persistent pairwise state, θ and v ``[E, P]`` each:
    ``2·E·P·dtype_bytes = n(n − 1)·P·dtype_bytes`` (chunk buffers not included)."""
    return 2 * n_pairs(int(n)) * int(P) * int(dtype_bytes)


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


def zeta(omega: torch.Tensor, theta: torch.Tensor, v: torch.Tensor, rho: float, chunk_pairs: int | None = None) -> torch.Tensor:
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


def cluster_models(omega: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``α̂_l = Σ_{i∈Ĝ_l} n_i ω_i / Σ_{i∈Ĝ_l} n_i`` (FPFC paper) → ``[L, P]``,
    L = number of labels; ``weights [n]`` the data sizes (equal when None)."""
    L = int(labels.max()) + 1 if labels.numel() else 0
    prev = torch.zeros(L, omega.shape[1], dtype=omega.dtype, device=omega.device)
    return cluster_average(omega, labels, L, prev, weights)


# ----------------------------------------------------------------------------
# Round object


def fpfc_memory_need(n: int, P: int, ranks_sharing: int = 1) -> int:
    """Bytes FPFC holds per run on one memory: θ and v ``[E, P]``
    (:func:`fedclust.algorithms.fpfc.pairwise_state_bytes`) plus ω and ζ
    ``[n, P]`` and a few chunk buffers, float32, once per rank that shares
    the memory (the server state is replicated on every rank)."""
    per_rank = pairwise_state_bytes(n, P) + 3 * n * P * 4 + 6 * min(CHUNK_ELEMENTS, max(n * (n - 1) // 2, 1) * P) * 4
    return per_rank * ranks_sharing


def check_fpfc_memory(cfg, available: tuple[int, str] | None = None) -> None:
    """Refuse an FPFC run whose pairwise state would not fit (ConfigError on
    ``clients`` naming the numbers and the largest client count that fits)."""
    n, P = cfg.clients, parameter_count(cfg)
    free, where = available or available_memory(cfg.device)
    sharing = 1
    if where.startswith("host"):
        sharing = world_from_env()[0]   # ranks on this node share its RAM
    need = fpfc_memory_need(n, P, sharing)
    if need <= free:
        return
    fits = 1
    while fits < n and fpfc_memory_need(fits + 1, P, sharing) <= free:
        fits += 1
    gib = 2.0**30
    raise ConfigError(
        "clients", n,
        f"FPFC keeps theta and v for all n(n-1)/2 = {n * (n - 1) // 2} client pairs: {need / gib:.2f} GiB "
        f"(n = {n}, P = {P} parameters, float32{f', x{sharing} ranks' if sharing > 1 else ''}) but only "
        f"{free / gib:.2f} GiB are free in {where}; use at most {fits} clients, a smaller model, "
        "or a machine with more memory")


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

    def validate(self, cfg) -> None:
        check_theorem1(self.lam, self.a, self.xi, self.rho)
        finite("fpfc.nu", self.nu, "the cluster threshold must be a finite number >= 0 (paper: in [xi, 0.5])",
               strict=False)
        check_fpfc_memory(cfg)


@dataclass
class FpfcState:
    """The server's state, replicated on every rank and computed from the
    gathered ω alone.  θ and v are kept as Algorithm 1 writes them, though
    after a step both are multiples of δ (``v/ρ = (1/t − 1)·θ`` with
    ``t = s/r > 0``), so θ and one scalar per pair would do: the literal form
    is easier to check."""

    omega: torch.Tensor          # [n, P] every client's latest ω
    zeta: torch.Tensor = client_rows()  # [C, P] ζ_i of this rank's clients
    theta: torch.Tensor = None   # [E, P] θ_ij, i < j
    v: torch.Tensor = None       # [E, P] v_ij
    scale: float | None = None   # u_1 (1.0 without scale_to_model); None until round 1 sets it
    labels: torch.Tensor = None  # [n] int64 clusters read off ‖θ_ij‖ <= ν


@register
@dataclass
class Fpfc(Algorithm):
    """FPFC's round (FPFC paper Algorithm 1; docs/algorithms.md, "FPFC")."""

    fpfc: FpfcConfig = field(default_factory=FpfcConfig)
    participation: float = 1.0

    name = "fpfc"
    report_position = 13
    sections = {"fpfc": FpfcConfig}
    paper_results = {("synthetic", None, 4): (89.46, 0.04)}

    @classmethod
    def from_config(cls, cfg) -> "Fpfc":
        return cls(cfg.fpfc, cfg.participation)

    def init(self, ctx: Context) -> FpfcState:
        """ω_i^0 all equal (w0), ζ_i^0 = ω_i^0, θ^0 = 0, v^0 = 0."""
        n, w0 = ctx.n, ctx.w0.detach()
        theta, v = init_pair_state(n, w0.numel(), w0.dtype, w0.device)
        return FpfcState(omega=w0.expand(n, -1).clone(), zeta=w0.expand(len(ctx.client_ids), -1).clone(),
                         theta=theta, v=v, scale=None, labels=torch.zeros(n, dtype=torch.int64, device=w0.device))

    def plan(self, state: FpfcState, ctx: Context, round_: int, models: torch.Tensor):
        """Client i trains from its own ω_i with the proximal term ``ρ/2‖ω − ζ_i‖²``
        (Algorithm 1 step 3: ``ω ← ω − α[∇f_i(ω) + ρ(ω − ζ_i)]``)."""
        return state, RoundPlan(start=own(ctx, state.omega), anchor=state.zeta, mu=self.fpfc.rho)

    def aggregate(self, state: FpfcState, ctx: Context, view: RoundView):
        """Participants' ω become their trained models; then every pair's θ and v
        (:func:`server_update_`), every ζ (:func:`zeta`), and the clusters read
        off ‖θ_ij‖ ≤ ν.  A client holds, and is evaluated with, its cluster's
        mean model."""
        f, after = self.fpfc, view.all_after
        active = participants(ctx.seed, view.round, ctx.n, self.participation, after.device)
        scale = state.scale
        if scale is None:   # u_1 = participants' mean ‖ω_i^1 − ω_i^0‖: λ, ξ and ν are read in its units
            scale = float((after[active] - state.omega[active]).norm(dim=1).mean()) if f.scale_to_model else 1.0
            if not scale > 0:
                raise ValueError("FPFC: no client moved in round 1 (mean update norm 0); "
                                 "check train.lr, or set fpfc.scale_to_model=false")
        lam, xi, nu = f.lam * scale, f.xi * scale, f.nu * scale
        omega = torch.where(active[:, None], after, state.omega)
        theta, v = server_update_(omega, state.theta, state.v, lam, f.a, xi, f.rho, active)
        zeta_own = own(ctx, zeta(omega, theta, v, f.rho)).clone()
        labels = clusters_from_theta(theta_norm_matrix(theta, ctx.n), nu)
        centres = cluster_models(omega, labels)
        state = FpfcState(omega=omega, zeta=zeta_own, theta=theta, v=v, scale=scale, labels=labels)
        return state, server_result(ctx, centres[own(ctx, labels)], labels, active.to(torch.float64),
                                    int(active.sum()))
