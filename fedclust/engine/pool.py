"""Losses of peer models on each client's own training set, grouped by client
(the loss similarity of docs/algorithms.md, PANM paper Eq. 3).

``pool_losses(models, ..., peers)`` returns ``L[c, s]``, the mean
cross-entropy of ``models[peers[c, s]]`` on client c's whole training set.
Each client ranks a pool of l + k (stage one) or up to 2l (stage two) peer
models per round, so for 100 clients this is about 1.7x the arithmetic of
the round's local training and the most expensive part of PANMLoss.

MLP path: the work is grouped by client so that client c's images meet all
of its m peers' first layers in one matrix product ``X_c [N, D] @ [D, m·H]``
(the first layer is 79% of the arithmetic); the other two layers are batched
over (client, peer).  Nothing but the peers' weights is copied; the images
stay where they are.  Other architectures (the CNN) go through the pairwise
path :func:`fedclust.engine.train.pair_losses`, which copies each pair's
model and images; both are tested against a per-model loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedclust.engine.functional import Arch
from fedclust.engine.layout import ParamLayout
from fedclust.engine.train import memory_budget, pair_losses


def _check(models: torch.Tensor, layout: ParamLayout, x: torch.Tensor, y: torch.Tensor, peers: torch.Tensor) -> None:
    if models.dim() != 2 or models.shape[1] != layout.numel:
        raise ValueError(f"models must be [M, P={layout.numel}], got shape {tuple(models.shape)}")
    if y.dim() != 2 or x.shape[:2] != y.shape:
        raise ValueError(f"x must be [C, N, *input] and y [C, N], got {tuple(x.shape)} and {tuple(y.shape)}")
    if peers.dim() != 2 or peers.shape[0] != x.shape[0]:
        raise ValueError(f"peers must be [C={x.shape[0]}, m] model indices, got shape {tuple(peers.shape)}")
    if peers.numel() and (int(peers.min()) < 0 or int(peers.max()) >= models.shape[0]):
        raise ValueError(f"peers must index models [0, {models.shape[0]}), got {int(peers.min())}..{int(peers.max())}")


# On a CPU a pass should stay near cache size, so that the product reads the
# gathered first layers from there: with 100 clients x 15 peers on 2 cores,
# passes of 1-2 clients (17-33 MB with activations) take 0.94-1.0 s, passes
# of 4-8 clients 1.2 s.
CPU_POOL_BYTES = 40 * 2**20


def pool_chunk(layout: ParamLayout, x: torch.Tensor, m: int) -> int:
    """Clients per pass of the MLP path: the gathered first layers
    ``[clients, m, H, D]`` and the hidden activations fit :func:`memory_budget`
    (on a CPU, :data:`CPU_POOL_BYTES`)."""
    w1 = layout.shapes[layout.names.index("fc1.weight")]
    per_client = m * (w1[0] * w1[1] + 3 * x.shape[1] * w1[0]) * x.element_size()
    budget = memory_budget(x.device) if x.device.type == "cuda" else CPU_POOL_BYTES
    return max(1, budget // max(per_client, 1))


@torch.no_grad()
def mlp_pool_losses(models: torch.Tensor, layout: ParamLayout, x: torch.Tensor, y: torch.Tensor,
                    peers: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """:func:`pool_losses` for the MLP of docs/algorithms.md (fc1, fc2, fc3 with ReLU)."""
    C, m = peers.shape
    N = x.shape[1]
    p = layout.views(models)
    w1, b1, w2, b2, w3, b3 = (p[k] for k in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                             "fc3.weight", "fc3.bias"))
    H, K = w1.shape[1], w3.shape[1]
    chunk = chunk or pool_chunk(layout, x, m)
    out = torch.empty(C, m, dtype=models.dtype, device=models.device)
    for c0 in range(0, C, chunk):
        c1 = min(C, c0 + chunk)
        cc, idx = c1 - c0, peers[c0:c1]
        # layer 1: client c's N images against all m peers' first layers at once
        w = w1[idx].reshape(cc, m * H, -1)                                   # [cc, m·H, D] (the one copy)
        xf = x[c0:c1].reshape(cc, N, -1)                                    # read (normalized) per pass
        h = torch.baddbmm(b1[idx].reshape(cc, 1, m * H), xf, w.transpose(1, 2))            # [cc, N, m·H]
        h = F.relu_(h).view(cc, N, m, H).transpose(1, 2).reshape(cc * m, N, H)           # [cc·m, N, H]
        flat_idx = idx.reshape(-1)
        h = F.relu_(torch.baddbmm(b2[flat_idx].unsqueeze(1), h, w2[flat_idx].transpose(1, 2)))
        logits = torch.baddbmm(b3[flat_idx].unsqueeze(1), h, w3[flat_idx].transpose(1, 2))  # [cc·m, N, K]
        labels = y[c0:c1, None, :].expand(cc, m, N).reshape(-1)
        loss = F.cross_entropy(logits.reshape(-1, K), labels, reduction="none")
        out[c0:c1] = loss.view(cc, m, N).mean(2)
    return out


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
    if arch == "mlp" and counts is None:
        return mlp_pool_losses(models, layout, x, y, peers, chunk)
    owner = torch.arange(C, device=models.device).repeat_interleave(m)
    return pair_losses(models[peers.reshape(-1)], layout, arch, x, y, owner, counts).view(C, m)
