"""FedAvg and FedProx server/client math (SPEC §5; papers/003 §II-A).

- FedAvg (papers/003 Algorithm 1, line 8): the new global model is the
  data-size weighted average of the clients' models,
  ``w_{t+1} = w_t + Σ_i (n_i/n) Δw_i = Σ_i (n_i/n) w_i`` with ``n = Σ_i n_i``
  over the clients that took part.
- FedProx (papers/003 Eq. 3, after Li et al.): each client minimises
  ``F_k(w) + μ/2 ‖w − w^t‖²``, so ``μ (w − w^t)`` is added to every local
  gradient; FedAvg is the case ``μ = 0``.  FPFC's local step
  (papers/004 Algorithm 1, step 3) has the same form with ``μ = ρ`` and the
  anchor ``ζ_i`` per client, hence ``anchor`` may be ``[P]`` or ``[C, P]``.

Client models are stacked ``[C, P]`` (C clients, P flat parameters).
"""

from __future__ import annotations

import torch

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
    (papers/003 Algorithm 1 line 8; equal weights when ``weights`` is None).

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
    """Gradient of the FedProx local objective (papers/003 Eq. 3):
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
