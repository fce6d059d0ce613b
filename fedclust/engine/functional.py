"""Functional forward passes of the docs/algorithms.md models on parameter dicts.

Two forward forms, and one backward:

- :func:`forward_fn` — one client: ``params {name: [*shape]}``, ``x [B, *input]``
  → logits ``[B, K]``; the plain form of :mod:`fedclust.models`, usable
  under ``torch.func.vmap``.
- :func:`batched_forward_fn` — C clients at once: ``params {name: [C, *shape]}``,
  ``x [C, B, *input]`` → logits ``[C, B, K]``.  The engine evaluates with
  this one and trains the CNN through ``torch.func.grad`` of it.
- :func:`dense_momentum_grads_` — the batched backward of a dense net (the
  MLP; logistic regression as the MLP with no hidden layer) written out,
  which the engine trains both with (see :mod:`fedclust.engine.train`).

The batched MLP is ``vmap`` of the single-client MLP (its linears become
batched matmuls).  The batched CNN is written out by hand instead, because
``vmap`` of ``F.conv2d`` (measured 2-3x slower than a per-client loop on a
2-core CPU) reshapes every activation between layers: here the clients are
stacked along the channel axis of one channels-last activation
``[B, C·channels, H, W]`` for the whole convolutional trunk, each
convolution is one grouped convolution (``groups=C``: client c's filters see
only client c's channels), and only the two dense layers go through batched
matmuls.  Max-pool is applied before ReLU: ``relu(maxpool(h)) ==
maxpool(relu(h))`` in value and in gradient (both monotone; the gradient
reaches the same first maximal element, or nothing when it is not
positive), and ReLU then touches 4x fewer elements.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch.func import vmap

from fedclust.engine.module_net import ModuleNet
from fedclust.errors import ConfigError

Params = dict[str, torch.Tensor]
Arch = str | ModuleNet   # a built-in model's name (hand-written paths) or any module's functional forward


def mlp_forward(p: Params, x: torch.Tensor) -> torch.Tensor:
    """One client's MLP (docs/algorithms.md): x [B, *input] -> logits [B, K]."""
    h = torch.flatten(x, 1)
    h = F.relu(F.linear(h, p["fc1.weight"], p["fc1.bias"]))
    h = F.relu(F.linear(h, p["fc2.weight"], p["fc2.bias"]))
    return F.linear(h, p["fc3.weight"], p["fc3.bias"])


def cnn_forward(p: Params, x: torch.Tensor) -> torch.Tensor:
    """One client's CNN (docs/algorithms.md): x [B, C_in, H, W] -> logits [B, K]."""
    h = F.max_pool2d(F.relu(F.conv2d(x, p["conv1.weight"], p["conv1.bias"])), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, p["conv2.weight"], p["conv2.bias"])), 2)
    h = F.relu(F.conv2d(h, p["conv3.weight"], p["conv3.bias"]))
    h = F.relu(F.linear(torch.flatten(h, 1), p["fc1.weight"], p["fc1.bias"]))
    return F.linear(h, p["fc2.weight"], p["fc2.bias"])


def grouped_conv(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Per-client 2-D convolution of client-stacked channels.

    h [B, C·in, H, W]; weight [C, out, in, k, k]; bias [C, out]
    -> [B, C·out, H-k+1, W-k+1], client c's block of ``out`` channels being
    ``conv2d(h[:, c·in:(c+1)·in], weight[c], bias[c])``.
    """
    c, out, cin, kh, kw = weight.shape
    return F.conv2d(h, weight.reshape(c * out, cin, kh, kw), bias.reshape(c * out), groups=c)


def batched_linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Per-client linear map: h [C, B, in], weight [C, out, in], bias [C, out] -> [C, B, out]."""
    return torch.baddbmm(bias.unsqueeze(1), h, weight.transpose(1, 2))


def cnn_forward_batched(p: Params, x: torch.Tensor) -> torch.Tensor:
    """C clients' CNNs at once: x [C, B, C_in, H, W] -> logits [C, B, K].

    Equals ``vmap(cnn_forward)`` (see the module docstring for the layout).
    """
    c, b, cin, hgt, wid = x.shape
    h = x.transpose(0, 1).reshape(b, c * cin, hgt, wid).contiguous(memory_format=torch.channels_last)
    h = F.relu(F.max_pool2d(grouped_conv(h, p["conv1.weight"], p["conv1.bias"]), 2))
    h = F.relu(F.max_pool2d(grouped_conv(h, p["conv2.weight"], p["conv2.bias"]), 2))
    h = F.relu(grouped_conv(h, p["conv3.weight"], p["conv3.bias"]))
    h = h.reshape(b, c, -1).transpose(0, 1)  # [C, B, 64·s·s], torch.flatten order per client
    h = F.relu(batched_linear(h, p["fc1.weight"], p["fc1.bias"]))
    return batched_linear(h, p["fc2.weight"], p["fc2.bias"])


def dense_momentum_grads_(p: Params, bufs: Params, x: torch.Tensor, y: torch.Tensor, beta: float,
                          layers: tuple[str, ...]) -> torch.Tensor:
    """Backpropagation of C clients' dense nets written out, accumulated into momentum.

    The net is ``layers`` (names of linear layers, input first) with ReLU
    between them: ("fc1", "fc2", "fc3") is the MLP, ("fc1",) multinomial
    logistic regression (an MLP with no hidden layer).
    p, bufs: {name: [C, *shape]} weights and momentum buffers; x [C, B, *input],
    y [C, B].  For every client c and parameter w:
    ``bufs[w][c] <- beta * bufs[w][c] + d L_c / d w[c]`` with ``L_c`` the mean
    cross-entropy of client c's batch (the momentum update of
    ``torch.optim.SGD``, docs/algorithms.md).  Returns the losses [C].

    The weight gradients ``delta^T a`` are computed by ``baddbmm_`` straight
    into the momentum buffers, so no gradient tensor is ever stored; the same
    values as ``torch.func.grad`` of the single-client forward (tests check both).
    """
    acts, pre = [torch.flatten(x, 2)], []                       # a0 [C, B, in]
    for k, layer in enumerate(layers):
        z = batched_linear(acts[-1], p[f"{layer}.weight"], p[f"{layer}.bias"])
        if k + 1 < len(layers):
            pre.append(z)
            acts.append(F.relu(z))
    logp = F.log_softmax(z, dim=-1)
    target = y.unsqueeze(-1)
    losses = -logp.gather(-1, target).squeeze(-1).mean(1)
    # d L / d logits = (softmax - onehot) / B
    delta = logp.exp_().scatter_add_(-1, target, torch.full_like(target, -1, dtype=logp.dtype)).div_(y.shape[1])
    for k in range(len(layers) - 1, -1, -1):
        layer = layers[k]
        nxt = torch.bmm(delta, p[f"{layer}.weight"]).mul_(pre[k - 1] > 0) if k > 0 else None
        bufs[f"{layer}.weight"].baddbmm_(delta.transpose(1, 2), acts[k], beta=beta)
        bufs[f"{layer}.bias"].mul_(beta).add_(delta.sum(1))
        delta = nxt
    return losses


DENSE_LAYERS = {"mlp": ("fc1", "fc2", "fc3"), "logreg": ("fc1",)}   # the layers dense_momentum_grads_ runs


def logreg_forward(p: Params, x: torch.Tensor) -> torch.Tensor:
    """One client's multinomial logistic regression (docs/algorithms.md): x [B, *input] -> logits [B, K]."""
    return F.linear(torch.flatten(x, 1), p["fc1.weight"], p["fc1.bias"])


def logreg_forward_batched(p: Params, x: torch.Tensor) -> torch.Tensor:
    """C clients' logistic regressions: x [C, B, *input] -> logits [C, B, K]."""
    return batched_linear(torch.flatten(x, 2), p["fc1.weight"], p["fc1.bias"])


_SINGLE = {"logreg": logreg_forward, "mlp": mlp_forward, "cnn": cnn_forward}
_BATCHED = {"logreg": logreg_forward_batched, "mlp": vmap(mlp_forward), "cnn": cnn_forward_batched}


def _check_arch(arch: Arch) -> None:
    if isinstance(arch, str) and arch not in _SINGLE:
        raise ConfigError("model", arch, f"choose one of {', '.join(_SINGLE)}, or FILE.py:NAME for your own module")


def forward_fn(arch: Arch) -> Callable[[Params, torch.Tensor], torch.Tensor]:
    """Single-client functional forward of ``arch`` (a built-in name, or a
    :class:`~fedclust.engine.module_net.ModuleNet`), vmappable over clients."""
    _check_arch(arch)
    return _SINGLE[arch] if isinstance(arch, str) else arch.forward


def batched_forward_fn(arch: Arch) -> Callable[[Params, torch.Tensor], torch.Tensor]:
    """Forward of C clients at once: ({name: [C, *shape]}, x [C, B, *input]) -> [C, B, K]."""
    _check_arch(arch)
    return _BATCHED[arch] if isinstance(arch, str) else arch.batched_forward


def per_client_cross_entropy(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of logits [C, B, K] against labels [C, B], averaged
    (or summed) over each client's B samples -> [C]."""
    c, b, k = logits.shape
    per_sample = F.cross_entropy(logits.reshape(c * b, k), y.reshape(c * b), reduction="none").view(c, b)
    return per_sample.mean(1) if reduction == "mean" else per_sample.sum(1)


def activation_bytes(arch: Arch, input_shape: tuple[int, ...], element_size: int = 4) -> int:
    """Rough bytes of activations one training sample keeps alive in a
    forward-backward pass (used only to size chunks)."""
    _check_arch(arch)
    if not isinstance(arch, str):
        return arch.activation_bytes(tuple(input_shape), element_size)
    if arch == "logreg":
        floats = math.prod(input_shape) + 3 * 10
    elif arch == "mlp":
        floats = math.prod(input_shape) + 3 * (200 + 200 + 10)
    else:
        _, hgt, wid = input_shape
        h1, w1 = hgt - 2, wid - 2
        h2, w2 = h1 // 2 - 2, w1 // 2 - 2
        h3, w3 = h2 // 2 - 2, w2 // 2 - 2
        # conv outputs, pooled maps (+ int64 indices), ReLU outputs, dense layers
        floats = 3 * (32 * h1 * w1 + 64 * h2 * w2) + 2 * 64 * h3 * w3 + 4 * 64 + math.prod(input_shape)
    return int(floats * element_size)
