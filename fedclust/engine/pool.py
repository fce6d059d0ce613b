"""Losses of peer models on each client's own training set, grouped by client
(the loss similarity of docs/algorithms.md, PANM paper Eq. 3).

``pool_losses(models, ..., peers)`` returns ``L[c, s]``, the mean
cross-entropy of ``models[peers[c, s]]`` on client c's whole training set.
Each client ranks a pool of l + k (stage one) or up to 2l (stage two) peer
models per round, so for 100 clients this is about 1.7x the arithmetic of
the round's local training and the most expensive part of PANMLoss.

A model may declare a path of its own (its Net's ``pool_losses``: the
MLP's groups the work by client, :mod:`fedclust.models.mlp`); the others
(the CNN, users' models) go through the pairwise path
:func:`fedclust.engine.train.pair_losses`, which copies each pair's model
and images; both are tested against a per-model loop.
"""

from __future__ import annotations

import torch

from fedclust.engine.layout import ParamLayout
from fedclust.engine.net import Arch, as_net
from fedclust.engine.train import pair_losses


def _check(models: torch.Tensor, layout: ParamLayout, x: torch.Tensor, y: torch.Tensor, peers: torch.Tensor) -> None:
    if models.dim() != 2 or models.shape[1] != layout.numel:
        raise ValueError(f"models must be [M, P={layout.numel}], got shape {tuple(models.shape)}")
    if y.dim() != 2 or x.shape[:2] != y.shape:
        raise ValueError(f"x must be [C, N, *input] and y [C, N], got {tuple(x.shape)} and {tuple(y.shape)}")
    if peers.dim() != 2 or peers.shape[0] != x.shape[0]:
        raise ValueError(f"peers must be [C={x.shape[0]}, m] model indices, got shape {tuple(peers.shape)}")
    if peers.numel() and (int(peers.min()) < 0 or int(peers.max()) >= models.shape[0]):
        raise ValueError(f"peers must index models [0, {models.shape[0]}), got {int(peers.min())}..{int(peers.max())}")


def pool_losses(models: torch.Tensor, layout: ParamLayout, arch: Arch, x: torch.Tensor, y: torch.Tensor,
                peers: torch.Tensor, chunk: int | None = None, counts: torch.Tensor | None = None) -> torch.Tensor:
    """``[C, m]``: mean cross-entropy of ``models[peers[c, s]]`` ([M, P]) on
    client c's whole training set ``x[c]`` [N, ...], ``y[c]`` [N] (its first
    counts[c] samples when ``counts`` is given: the pairwise path)."""
    _check(models, layout, x, y, peers)
    peers = peers.to(device=models.device, dtype=torch.long)
    y = y.to(x.device)
    C, m = peers.shape
    if C == 0 or m == 0:
        return torch.empty(C, m, dtype=models.dtype, device=models.device)
    fast = as_net(arch).pool_losses
    if fast is not None and counts is None:   # the model's own path (the MLP's: fedclust.models.mlp)
        return fast(models, layout, x, y, peers, chunk)
    owner = torch.arange(C, device=models.device).repeat_interleave(m)
    return pair_losses(models[peers.reshape(-1)], layout, arch, x, y, owner, counts).view(C, m)
