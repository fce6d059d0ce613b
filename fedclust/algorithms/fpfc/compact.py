"""FPFC's pair state as a run keeps it: compact and sharded.

After a step v is a multiple of θ.  With δ = ω_i − ω_j + v/ρ and θ' = t·δ
(t = s/‖δ‖, :func:`~fedclust.algorithms.fpfc.penalty.shrink_factor`), the
dual step is v' = v + ρ(ω_i − ω_j − θ') = ρ(δ − θ') = ρ(1 − t)·δ.  For δ ≠ 0, t > 0, so v' = c'·θ' with
c' = ρ(1 − t)/t; for δ = 0, θ' = v' = 0, and v' = c'·θ' holds for any c'
(c' = 0 is kept).  θ^0 = v^0 = 0 is the same form.  So a run keeps θ and one
scalar c per pair (v = c·θ): half of θ and v.

Pairs are split between clients circulantly: client i keeps its pairs with
i + 1, ..., i + K (mod n), K = ⌊(n − 1)/2⌋, as rows [K, P] of a client
field, so that a rank keeps only its own clients' rows and checkpoints hand
each row to whichever rank holds that client.  For even n the n/2 pairs
(i, i + n/2) would fall to both ends; they are kept whole, by every rank.

ζ_i sums terms of pairs that live on other ranks.  Every term is rounded to a
grid (a power of two per client, set from bounds every rank computes alike)
fine and narrow enough that every sum of terms is exact in float64: then the
one all-reduce of the partial sums gives the same bits in any order, on any
number of ranks (:func:`zeta_units`).
"""

from __future__ import annotations

import torch

from fedclust.algorithms.fpfc.pairs import n_pairs, pair_chunk
from fedclust.algorithms.fpfc.penalty import check_penalty, shrink_factor


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
    C, K, E = theta_rows.shape[0], row_slots(n), n_pairs(n)
    active = _checked_state(omega, theta_rows, theta_diam, ratio, norms, active)
    owner, partner = slot_pairs(n, omega.device)
    updated = active[owner] | active[partner]
    again = active[owner] & active[partner] if twice else None
    mean = omega.mean(dim=0)
    unit_client = zeta_units(n, pair_bounds(omega, mean, ratio, norms, updated, owner, partner, rho, again, reset),
                             owner, partner)
    unit = torch.maximum(unit_client[owner], unit_client[partner])
    buffer = torch.zeros(n * P + 2 * n * K, dtype=torch.float64, device=omega.device)
    acc = buffer[:n * P].view(n, P)
    step = pair_chunk(P, chunk_pairs)
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


def _checked_state(omega: torch.Tensor, theta_rows: torch.Tensor, theta_diam: torch.Tensor, ratio: torch.Tensor,
                   norms: torch.Tensor, active: torch.Tensor | None) -> torch.Tensor:
    """:func:`shard_sweep_`'s arguments checked (ValueError naming the shapes): the round's ``active`` as a bool
    ``[n]`` (None: everyone)."""
    n, P = omega.shape
    C, K, D, E = theta_rows.shape[0], row_slots(n), diametric_pairs(n), n_pairs(n)
    if theta_rows.shape != (C, K, P) or theta_diam.shape != (D, P) or ratio.shape != (E,) or norms.shape != (E,):
        raise ValueError(f"compact FPFC state must be rows [C, {K}, {P}], diametric [{D}, {P}], ratio and norms "
                         f"[{E}]; got {tuple(theta_rows.shape)}, {tuple(theta_diam.shape)}, {tuple(ratio.shape)}, "
                         f"{tuple(norms.shape)}")
    if active is None:
        return torch.ones(n, dtype=torch.bool, device=omega.device)
    if active.shape != (n,) or active.dtype != torch.bool:
        raise ValueError(f"active must be a bool [{n}] mask, got {active.dtype} {tuple(active.shape)}")
    return active


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
    step = pair_chunk(P, chunk_pairs)
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

