"""How much of the machine one chunk of clients may use: the memory budget of a chunk, and from it how many
clients train at once and how many rows and samples one evaluation pass takes (the engine's only sizing)."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from fedclust.engine.functional import activation_bytes
from fedclust.engine.layout import ParamLayout
from fedclust.engine.net import Arch, as_net

# Bytes of activations (plus weights, gradients, momentum) one chunk may use.
CPU_EVAL_BYTES = 64 * 2**20
GPU_MEMORY_SHARE = 4  # a quarter of the device memory


class Inputs(Protocol):
    """The clients' inputs ``x [C, N, *input]`` as the engine reads them: a tensor, or anything with its shape,
    device and dtype that gives tensors when indexed (:class:`fedclust.data.base.StoredInputs`: uint8 images
    normalized when read).  The engine reads the whole of it only by index (a chunk of clients, a batch)."""

    @property
    def shape(self) -> torch.Size: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def element_size(self) -> int: ...

    def __getitem__(self, index: Any) -> torch.Tensor: ...


def memory_budget(device: torch.device) -> int:
    """Bytes one chunk may use on ``device``."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory // GPU_MEMORY_SHARE
    return CPU_EVAL_BYTES


def train_chunk_size(arch: Arch, layout: ParamLayout, x: Inputs, batch: int) -> int:
    """Clients trained at once: the model's ``cpu_chunk`` on a CPU (a
    built-in's, measured: small chunks keep each step's tensors cache-sized
    and below glibc's mmap threshold); else as many as fit
    :func:`memory_budget` (activations of a batch plus weights, gradients
    and momentum)."""
    net = as_net(arch)
    if x.device.type != "cuda" and net.cpu_chunk:
        return net.cpu_chunk
    per_client = batch * activation_bytes(arch, tuple(x.shape[2:]), x.element_size()) \
        + 3 * layout.numel * x.element_size()
    return max(1, memory_budget(x.device) // per_client)


def eval_chunk_sizes(arch: Arch, x: Inputs, rows: int, samples: int) -> tuple[int, int]:
    """(rows, samples) per forward pass so that its activations fit :func:`memory_budget`."""
    per_sample = max(1, activation_bytes(arch, tuple(x.shape[2:]), x.element_size()))
    budget = memory_budget(x.device)
    n = max(1, min(samples, budget // per_sample))
    return max(1, min(rows, budget // (per_sample * n))), n


