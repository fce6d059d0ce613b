"""FedAvg and FedProx server/client math (docs/algorithms.md; FedGroup paper §II-A).

- FedAvg (FedGroup paper Algorithm 1, line 8): the new global model is the
  data-size weighted average of the clients' models,
  ``w_{t+1} = w_t + Σ_i (n_i/n) Δw_i = Σ_i (n_i/n) w_i`` with ``n = Σ_i n_i``
  over the clients that took part.
- FedProx (FedGroup paper Eq. 3, after Li et al.): each client minimises
  ``F_k(w) + μ/2 ‖w − w^t‖²``, so ``μ (w − w^t)`` is added to every local
  gradient; FedAvg is the case ``μ = 0``.  FPFC's local step
  (FPFC paper Algorithm 1, step 3) has the same form with ``μ = ρ`` and the
  anchor ``ζ_i`` per client, hence ``anchor`` may be ``[P]`` or ``[C, P]``.

Client models are stacked ``[C, P]`` (C clients, P flat parameters).

Round objects (below the math, fedjax style: ``init``/``plan``/``aggregate``
with the hyperparameters closed over; see ``fedclust.algorithms.base``):
:class:`FedAvg` (``fedavg``; ``fedprox`` is the same object with ``μ > 0``),
and the helpers every centralized method shares — :func:`participants`
(who takes part in round t) and :func:`server_result`.

Conventions of the centralized methods (docs/algorithms.md):
- Participation: the ``ceil(p·n)`` clients with the lowest counter-based
  keys ``rng.uniform(seed, t, "participation", i, 0)`` take part in round t
  (every client when p = 1), identical on every rank.  The runner trains
  every client; only participants' trained models enter the server's
  averages, the others keep the model they were sent.
- Data sizes: every client holds ``data.train_size`` samples (docs/algorithms.md), so
  the papers' ``n_i``-weighted averages are plain means.
- Communication (docs/algorithms.md, in models): a participant receives what the
  server sends it for training (1 model; IFCA: all K) and uploads one;
  non-participants receive nothing.  ``server_received``/``server_sent``
  are these totals.  Evaluating a client with its cluster's model is not
  counted as traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundPlan, RoundResult, RoundView
from fedclust.errors import ConfigError


def check_weights(weights: torch.Tensor, count: int, name: str = "weights") -> torch.Tensor:
    """Validate client weights (data sizes ``n_i``): ``[count]``, finite, ≥ 0."""
    if weights.dim() != 1 or weights.shape[0] != count:
        raise ValueError(f"{name} must have shape [{count}] (one per client), got {tuple(weights.shape)}")
    if not torch.isfinite(weights).all() or (weights < 0).any():
        raise ValueError(f"{name} must be finite and >= 0 (e.g. training-set sizes), got {weights.tolist()[:10]}")
    return weights


def weighted_average(models: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """FedAvg aggregate ``Σ_i w_i·models_i / Σ_i w_i`` → ``[P]``
    (FedGroup paper Algorithm 1 line 8; equal weights when ``weights`` is None).

    Raises ValueError for no clients or weights summing to 0: the caller
    decides what an empty round means (e.g. keep the previous model, as
    :func:`fedclust.algorithms.ifca.cluster_average` does).
    """
    if models.dim() != 2 or models.shape[0] == 0:
        raise ValueError(f"models must be a non-empty [C, P] stack, got shape {tuple(models.shape)}")
    if weights is None:
        return models.mean(dim=0)
    w = check_weights(weights, models.shape[0]).to(models.dtype)
    total = w.sum()
    if total <= 0:
        raise ValueError("weights sum to 0: no client carries weight; give positive data sizes")
    return (w / total) @ models


def check_mu(mu: float) -> float:
    """FedProx μ must be a finite number ≥ 0 (0 is FedAvg)."""
    mu = float(mu)
    if not mu >= 0 or mu == float("inf"):
        raise ConfigError("algorithm.mu", mu, "FedProx proximal weight must be a finite number >= 0 (0 is FedAvg)")
    return mu


def prox_grad(grads: torch.Tensor, params: torch.Tensor, anchor: torch.Tensor, mu: float) -> torch.Tensor:
    """Gradient of the FedProx local objective (FedGroup paper Eq. 3):
    ``grads + μ (params − anchor)`` → ``[C, P]``.

    ``grads``, ``params``: ``[C, P]``; ``anchor``: the round's global model
    ``[P]`` (FedProx, FedGrouProx: the group model) or one anchor per client
    ``[C, P]`` (FPFC: ``ζ_i`` with ``μ = ρ``).
    """
    mu = check_mu(mu)
    if grads.shape != params.shape:
        raise ValueError(f"grads {tuple(grads.shape)} and params {tuple(params.shape)} must have the same [C, P] shape")
    if anchor.shape != params.shape and anchor.shape != params.shape[-1:]:
        raise ValueError(f"anchor must be [P] or [C, P] = {tuple(params.shape)}, got {tuple(anchor.shape)}")
    if mu == 0.0:
        return grads
    return grads + mu * (params - anchor)


def prox_penalty(params: torch.Tensor, anchor: torch.Tensor, mu: float) -> torch.Tensor:
    """The FedProx proximal term ``μ/2 ‖params_i − anchor‖²`` per client → ``[C]``."""
    mu = check_mu(mu)
    return 0.5 * mu * (params - anchor).pow(2).sum(dim=-1)


# ----------------------------------------------------------------------------
# Shared by the centralized round objects


def participants(seed: int, round_: int, n: int, share: float, device=None) -> torch.Tensor:
    """Bool ``[n]``: the clients taking part in round ``round_`` — the
    ``ceil(share·n)`` (at least 1) with the lowest keys
    ``rng.uniform(seed, round_, "participation", i, 0)``; everyone when
    ``share >= 1``.  A pure function of (seed, round), the same on every rank."""
    if not 0 < share <= 1:
        raise ConfigError("participation", share, "must lie in (0, 1]: the share of clients per round")
    if share >= 1:
        return torch.ones(n, dtype=torch.bool, device=device)
    count = max(1, math.ceil(share * n - 1e-9))
    keys = rng.uniform(seed, round_, "participation", torch.arange(n), 0)
    chosen = torch.argsort(keys, stable=True)[:count]
    mask = torch.zeros(n, dtype=torch.bool)
    mask[chosen] = True
    return mask.to(device)


def own(ctx: Context, values: torch.Tensor) -> torch.Tensor:
    """Rows of an ``[n, ...]`` tensor that belong to this rank's clients."""
    return values[ctx.client_ids.to(values.device)]


def server_result(ctx: Context, models: torch.Tensor, assignment: torch.Tensor, received: torch.Tensor,
                  uploads: int) -> RoundResult:
    """RoundResult of a server round: ``models [C, P]`` held (and evaluated)
    by this rank's clients, ``assignment [n]``, ``received [n]`` models each
    client got from the server this round (replicated; this rank's rows are
    reported), ``uploads`` models the server received."""
    return RoundResult(models=models.contiguous(), assignment=assignment.to(torch.int64),
                       received=own(ctx, received).to(torch.float64),
                       server_received=int(uploads), server_sent=int(received.sum()))


@dataclass
class FedAvg:
    """FedAvg / FedProx round (FedGroup paper Algorithm 1 and Eq. 3).

    State: the global model ``w [P]`` (replicated).  Plan: every client
    trains from ``w`` (FedProx: with the proximal term ``μ/2‖·−w‖²``).
    Aggregate: ``w ← mean`` of the participants' trained models; every
    client then holds ``w`` and is evaluated with it; one cluster."""

    participation: float = 1.0
    mu: float = 0.0
    name: str = "fedavg"
    gathers_before: bool = False

    def __post_init__(self):
        self.mu = check_mu(self.mu)

    def init(self, ctx: Context) -> torch.Tensor:
        return ctx.w0.detach().clone()

    def plan(self, state: torch.Tensor, ctx: Context, round_: int, models: torch.Tensor):
        start = state.expand(len(ctx.client_ids), -1)
        return state, RoundPlan(start=start, anchor=start if self.mu > 0 else None, mu=self.mu)

    def aggregate(self, state: torch.Tensor, ctx: Context, view: RoundView):
        active = participants(ctx.seed, view.round, ctx.n, self.participation, view.all_after.device)
        w = weighted_average(view.all_after[active])
        C = len(ctx.client_ids)
        return w, server_result(ctx, w.expand(C, -1).clone(), torch.zeros(ctx.n, dtype=torch.int64, device=w.device),
                                active.to(torch.float64), int(active.sum()))


def make_fedavg(cfg) -> FedAvg:
    return FedAvg(participation=cfg.participation)


def make_fedprox(cfg) -> FedAvg:
    return FedAvg(participation=cfg.participation, mu=cfg.fedprox.mu, name="fedprox")
