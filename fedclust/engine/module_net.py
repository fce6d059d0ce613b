"""Any ``nn.Module`` as a model of the engine: the functional forward of a
user's module (``model=FILE.py:NAME``, docs/algorithms.md "Models") on the
rows of the ``[C, P]`` parameter buffer.

A :class:`ModuleNet` is a :class:`fedclust.engine.net.Net`, as a built-in
model is: it gives the single-client forward
``torch.func.functional_call(module, params, x)`` and the forward of C
clients at once, either

- ``batched``: ``torch.func.vmap`` of the single-client forward over the
  clients' parameters and data (one computation for all clients), or
- ``loop``: the same single-client forward called client after client.

Training takes ``torch.func.grad`` of the sum of the per-client losses over
that forward (clients share no parameters, so each client's gradient is
its own), then the same SGD with momentum, proximal term and batch orders
as the built-ins (:mod:`fedclust.engine.train`).  Buffers the module holds
are passed to every client unchanged (constants; a module that updates a
buffer in its forward is refused by :func:`fedclust.models.check_module`).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.func import functional_call, vmap

ENGINES = ("batched", "loop")


class ModuleNet:
    """A module's functional forward for the engine (see the module docstring)."""

    cpu_chunk = None        # chunks sized from memory
    dense_layers = None     # trained through torch.func.grad
    pool_losses = None      # peers' losses by the pairwise path

    def __init__(self, module: nn.Module, engine: str, name: str = ""):
        if engine not in ENGINES:
            raise ValueError(f"engine = {engine!r}: use one of {', '.join(ENGINES)}")
        self.module = module
        self.engine = engine
        self.engine_label = engine
        self.name = name or type(module).__name__
        self.buffers = {k: b.detach() for k, b in module.named_buffers()}
        self._buffers_on: dict = {}
        self._vmapped = vmap(self.forward, in_dims=(0, 0), randomness="error")
        self._act_bytes: dict = {}

    def module_on(self, device: torch.device) -> nn.Module:
        """The module on ``device`` (moved once; the loop engine trains its parameters in place)."""
        if next(self.module.parameters()).device != torch.device(device):
            self.module.to(device)
            self._buffers_on.clear()
        return self.module

    def __repr__(self) -> str:
        return f"ModuleNet({self.name}, engine={self.engine})"

    def _buffers_for(self, x: torch.Tensor) -> dict:
        key = (x.device, x.dtype)
        if key not in self._buffers_on:
            self._buffers_on[key] = {k: b.to(device=x.device, dtype=x.dtype if b.is_floating_point() else b.dtype)
                                     for k, b in self.buffers.items()}
        return self._buffers_on[key]

    def forward(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        """One client: params {name: [*shape]}, x [B, *input] -> logits [B, K]."""
        if self.buffers:
            return functional_call(self.module, (params, self._buffers_for(x)), (x,))
        return functional_call(self.module, params, (x,))

    def batched_forward(self, params: dict, x: torch.Tensor) -> torch.Tensor:
        """C clients: params {name: [C, *shape]}, x [C, B, *input] -> logits [C, B, K]."""
        if self.engine == "batched":
            return self._vmapped(params, x)
        return torch.stack([self.forward({k: v[c] for k, v in params.items()}, x[c]) for c in range(x.shape[0])])

    def activation_bytes(self, input_shape: tuple[int, ...], element_size: int = 4) -> int:
        """Bytes one training sample keeps alive, measured once: the outputs
        of every submodule on one sample (about what backward keeps)."""
        key = (tuple(input_shape), element_size)
        if key not in self._act_bytes:
            total = [math.prod(input_shape)]

            def hook(_m, _i, out):
                if isinstance(out, torch.Tensor):
                    total.append(out.numel())

            handles = [m.register_forward_hook(hook) for m in self.module.modules()]
            try:
                with torch.no_grad():
                    p = next(self.module.parameters())
                    self.module(torch.zeros((1,) + tuple(input_shape), dtype=p.dtype, device=p.device))
            finally:
                for h in handles:
                    h.remove()
            self._act_bytes[key] = int(2 * sum(total) * element_size)
        return self._act_bytes[key]
