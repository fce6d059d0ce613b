"""What the engine trains: a :class:`Net`, the one contract between the
engine and a model.  A built-in model gives it
(:class:`fedclust.models.base.BuiltinModel`, found by name in
:mod:`fedclust.models.registry`), and so does any ``nn.Module``
(:class:`fedclust.engine.module_net.ModuleNet`).  The engine branches on
what a Net declares, never on a model's name."""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from fedclust.models.registry import builtin


class Net(Protocol):
    """A model as the engine trains it, C clients at once on the rows of a ``[C, P]`` buffer."""

    # Read-only declarations (properties here, so that a class attribute satisfies them as well as an
    # instance attribute: BuiltinModel declares them on the class, ModuleNet on the object).

    @property
    def name(self) -> str: ...

    @property
    def engine(self) -> str: ...              # "batched" (one computation for all clients) or "loop"

    @property
    def engine_label(self) -> str: ...        # what a run's summary calls it ("hand-written", "batched", "loop")

    @property
    def cpu_chunk(self) -> int | None: ...    # clients trained at once on a CPU; None: sized from memory

    @property
    def dense_layers(self) -> tuple[str, ...] | None: ...   # a dense net's layers: the hand-written backward trains it

    @property
    def pool_losses(self) -> Callable[..., torch.Tensor] | None: ...   # a hand-written pool-loss path, or None

    def forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor: ...

    def batched_forward(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor: ...

    def activation_bytes(self, input_shape: tuple[int, ...], element_size: int = 4) -> int: ...


Arch = Any   # a Net, or a built-in model's name (resolved by as_net)


def as_net(arch: Arch) -> Net:
    """The :class:`Net` of ``arch``: itself, or the built-in model of that name."""
    return builtin(arch) if isinstance(arch, str) else arch
