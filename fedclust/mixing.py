"""Gossip averaging as one matrix product (docs/algorithms.md).

Client i's new model is ``(w_i + sum_{j in N_i} w_j) / (|N_i| + 1)`` over the
models after this round's local training, so for this rank's rows the new
models are ``M @ W_all`` with ``M = (I_self + A) / (1 + A.sum(1))``.
"""

from __future__ import annotations

import torch


def mixing_matrix(neighbors: torch.Tensor, self_mask: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[C, n] row-stochastic weights from a bool neighbour mask (diagonal excluded)."""
    a = (neighbors & ~self_mask).to(dtype) + self_mask.to(dtype)
    return a / a.sum(dim=1, keepdim=True)


def gossip(neighbors: torch.Tensor, self_mask: torch.Tensor, all_models: torch.Tensor) -> torch.Tensor:
    """[C, P] averaged models of this rank's clients from all [n, P] models."""
    return mixing_matrix(neighbors, self_mask, all_models.dtype) @ all_models
