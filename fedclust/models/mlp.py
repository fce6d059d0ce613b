"""``model=mlp`` (MNIST, Fashion-MNIST; docs/algorithms.md): Flatten,
Linear(in, 200), ReLU, Linear(200, 200), ReLU, Linear(200, classes).

The engine trains it with its hand-written batched backward (a dense net),
and scores a client's pool of peer models on its data with a path of its
own (:func:`mlp_pool_losses`): client c's images meet all of its m peers'
first layers in one matrix product ``X_c [N, D] @ [D, m·H]`` (the first
layer is 79% of the arithmetic); the other two layers are batched over
(client, peer).  Nothing but the peers' weights is copied."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from fedclust.engine.layout import ParamLayout
from fedclust.engine.memory import memory_budget
from fedclust.models.base import BuiltinModel
from fedclust.models.registry import register

HIDDEN = 200


class MLP(nn.Module):
    """MLP in-200-200-classes with ReLU (docs/algorithms.md)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = HIDDEN):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.flatten(x, 1)
        h = F.relu(self.fc1(h))
        h = F.relu(self.fc2(h))
        return self.fc3(h)


def mlp_forward(p: dict, x: torch.Tensor) -> torch.Tensor:
    """One client's MLP: x [B, *input] -> logits [B, K]."""
    h = torch.flatten(x, 1)
    h = F.relu(F.linear(h, p["fc1.weight"], p["fc1.bias"]))
    h = F.relu(F.linear(h, p["fc2.weight"], p["fc2.bias"]))
    return F.linear(h, p["fc3.weight"], p["fc3.bias"])


# On a CPU a pass should stay near cache size, so that the product reads the
# gathered first layers from there: with 100 clients x 15 peers on 2 cores,
# passes of 1-2 clients (17-33 MB with activations) take 0.94-1.0 s, passes
# of 4-8 clients 1.2 s.
CPU_POOL_BYTES = 40 * 2**20


def pool_chunk(layout: ParamLayout, x: torch.Tensor, m: int) -> int:
    """Clients per pass of :func:`mlp_pool_losses`: the gathered first layers
    ``[clients, m, H, D]`` and the hidden activations fit the engine's
    memory budget (on a CPU, :data:`CPU_POOL_BYTES`)."""
    w1 = layout.shapes[layout.names.index("fc1.weight")]
    per_client = m * (w1[0] * w1[1] + 3 * x.shape[1] * w1[0]) * x.element_size()
    budget = memory_budget(x.device) if x.device.type == "cuda" else CPU_POOL_BYTES
    return max(1, budget // max(per_client, 1))


@torch.no_grad()
def mlp_pool_losses(models: torch.Tensor, layout: ParamLayout, x: torch.Tensor, y: torch.Tensor,
                    peers: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """:func:`fedclust.engine.pool.pool_losses` for the MLP (fc1, fc2, fc3 with ReLU): ``[C, m]``, the mean
    cross-entropy of ``models[peers[c, s]]`` on client c's whole training set ``x[c]``, ``y[c]``."""
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


@register
class MlpModel(BuiltinModel):
    name = "mlp"
    aliases = ("dense", "fc")
    # clients trained at once on a CPU (fedclust bench, 2 cores): small chunks keep each step's tensors
    # cache-sized and below glibc's mmap threshold (re-used, not page-faulted anew every step)
    cpu_chunk = 8
    dense_layers = ("fc1", "fc2", "fc3")

    def __init__(self):
        self._batched = vmap(mlp_forward)

    def module(self, input_shape, num_classes):
        return MLP(math.prod(input_shape), num_classes)

    def forward(self, params, x):
        return mlp_forward(params, x)

    def batched_forward(self, params, x):
        return self._batched(params, x)

    def activation_bytes(self, input_shape, element_size=4):
        return int((math.prod(input_shape) + 3 * (HIDDEN + HIDDEN + 10)) * element_size)

    def pool_losses(self, models, layout, x, y, peers, chunk=None):
        return mlp_pool_losses(models, layout, x, y, peers, chunk)
