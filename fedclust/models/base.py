"""The contract of a built-in model: its reference ``nn.Module`` and what
the engine needs to train many clients of it at once.  One file per model
in :mod:`fedclust.models` declares a subclass and registers it
(:func:`fedclust.models.registry.register`); the engine reads only this
contract (:class:`fedclust.engine.net.Net`), never a model's name."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn


class BuiltinModel:
    """A built-in model (subclass, declare, register).

    Declared (class attributes):

    - ``name``: the ``model`` value that selects it; ``aliases``: other
      names users write for it (``logistic`` for ``logreg``), offered by the
      config error.
    - ``cpu_chunk``: clients trained at once on a CPU (measured:
      ``fedclust bench``); None: sized from memory, as on a GPU.
    - ``dense_layers``: for a dense net (linear layers with ReLU between),
      the layers' names, input first: the engine then trains it with its
      hand-written batched backward
      (:func:`fedclust.engine.functional.dense_momentum_grads_`); None:
      ``torch.func.grad`` of :meth:`batched_forward`.
    - ``pool_losses``: a hand-written path for the losses of a client's
      pool of peer models on its data (:func:`fedclust.engine.pool.pool_losses`),
      or None (the general pairwise path).

    Its methods give the reference module (:meth:`module`, the plain form
    of the model, which the engine's forwards reproduce on a flat parameter
    buffer), the single-client and batched functional forwards and the
    activations one training example keeps alive (to size chunks).
    """

    name: ClassVar[str] = ""
    aliases: ClassVar[tuple[str, ...]] = ()
    cpu_chunk: ClassVar[int | None] = None
    dense_layers: ClassVar[tuple[str, ...] | None] = None
    pool_losses = None
    engine = "batched"             # the engine's batched paths (model_record calls them "hand-written")
    engine_label = "hand-written"

    def module(self, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
        """The reference module for inputs of ``input_shape`` (one example, no batch dimension)."""
        raise NotImplementedError(f"{type(self).__name__} must define module(input_shape, num_classes)")

    def check_input(self, input_shape: tuple[int, ...]) -> str | None:
        """What the model needs of its inputs when it cannot take ``input_shape`` ("needs image inputs ...";
        None: it can)."""
        return None

    def forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """One client: params {name: [*shape]}, x [B, *input] -> logits [B, K]; vmappable over clients."""
        raise NotImplementedError(f"{type(self).__name__} must define forward(params, x)")

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """C clients at once: params {name: [C, *shape]}, x [C, B, *input] -> logits [C, B, K]."""
        raise NotImplementedError(f"{type(self).__name__} must define batched_forward(params, x)")

    def activation_bytes(self, input_shape: tuple[int, ...], element_size: int = 4) -> int:
        """Rough bytes of activations one training example keeps alive in a
        forward-backward pass (used only to size chunks)."""
        raise NotImplementedError(f"{type(self).__name__} must define activation_bytes(input_shape, element_size)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"
