"""What the engine trains: a :class:`Net`, the one contract between the
engine and a model.  A built-in model gives it
(:class:`fedclust.models.base.BuiltinModel`, ``fedclust.models.builtin(name)``),
and so does any ``nn.Module`` (:class:`fedclust.engine.module_net.ModuleNet`).
The engine takes a built Net, never a model's name, and branches on what the
Net declares."""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch


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


Arch = Any   # a Net (typed Any: BuiltinModel declares on the class what ModuleNet sets on the object)


def as_net(arch: Arch) -> Net:
    """``arch`` itself, a built Net; a model's name is refused (build it first: ``fedclust.models.builtin(name)``,
    or ``fedclust.models.make_net`` for a run's model)."""
    if isinstance(arch, str):
        raise TypeError(f"the engine takes a built model, not the name {arch!r}: pass fedclust.models.builtin("
                        f"{arch!r}) or what fedclust.models.make_net returns")
    return arch
