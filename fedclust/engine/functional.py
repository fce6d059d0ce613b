"""The engine's functional building blocks on parameter dicts: the batched
layers the models' forwards are written with, the hand-written batched
backward of a dense net, and the forwards of a :class:`~fedclust.engine.net.Net`.

- :func:`forward_fn` — one client: ``params {name: [*shape]}``, ``x [B, *input]``
  → logits ``[B, K]``, usable under ``torch.func.vmap``.
- :func:`batched_forward_fn` — C clients at once: ``params {name: [C, *shape]}``,
  ``x [C, B, *input]`` → logits ``[C, B, K]``.  The engine evaluates with
  this one and trains through ``torch.func.grad`` of it.
- :func:`dense_momentum_grads_` — the batched backward of a dense net (the
  MLP; logistic regression as the MLP with no hidden layer) written out,
  which the engine trains a Net declaring ``dense_layers`` with
  (see :mod:`fedclust.engine.train`).
- :func:`batched_linear`, :func:`grouped_conv` — per-client linear maps and
  convolutions of client-stacked activations (:mod:`fedclust.models.cnn`).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn.functional as F

from fedclust.engine.net import Arch, as_net

Params = dict[str, torch.Tensor]


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
        if nxt is None:   # the input layer: done
            break
        delta = nxt
    return losses


def forward_fn(arch: Arch) -> Callable[[Params, torch.Tensor], torch.Tensor]:
    """Single-client functional forward of ``arch`` (a :class:`~fedclust.engine.net.Net` or a built-in's
    name), vmappable over clients."""
    return as_net(arch).forward


@contextmanager
def evaluating(arch: Arch) -> Iterator[None]:
    """Within it, a module of the user's (a :class:`~fedclust.engine.module_net.ModuleNet`) is in eval mode, as
    ``model.eval()`` before inference; back in train mode after.  Built-in models: nothing to switch."""
    module = getattr(as_net(arch), "module", None)
    if not isinstance(module, torch.nn.Module) or not module.training:
        yield
        return
    module.eval()
    try:
        yield
    finally:
        module.train()


def batched_forward_fn(arch: Arch) -> Callable[[Params, torch.Tensor], torch.Tensor]:
    """Forward of C clients at once: ({name: [C, *shape]}, x [C, B, *input]) -> [C, B, K]."""
    return as_net(arch).batched_forward


def per_client_cross_entropy(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of logits [C, B, K] against labels [C, B], averaged
    (or summed) over each client's B samples -> [C]."""
    c, b, k = logits.shape
    per_sample = F.cross_entropy(logits.reshape(c * b, k), y.reshape(c * b), reduction="none").view(c, b)
    return per_sample.mean(1) if reduction == "mean" else per_sample.sum(1)


def activation_bytes(arch: Arch, input_shape: tuple[int, ...], element_size: int = 4) -> int:
    """Rough bytes of activations one training sample keeps alive in a
    forward-backward pass (used only to size chunks)."""
    return as_net(arch).activation_bytes(tuple(input_shape), element_size)
