"""The float arithmetic of a run's matrix products and convolutions on an
NVIDIA GPU (the ``precision`` key).

- ``default``: PyTorch's defaults: convolutions may use TF32 tensor cores
  (Ampere and later), matrix products stay IEEE float32.
- ``fp32``: IEEE float32 throughout, convolutions included (results equal a
  CPU's up to the order of sums).
- ``tf32``: both in TF32 (10-bit mantissa products, float32 sums): the MLP's
  batched products run several times faster on tensor cores.

A CPU computes IEEE float32 under every setting, so nothing is changed there.
A run on a GPU sets both flags, each run its own, whatever an earlier run in
the same process set.  The legacy flags are used, as Lightning reads them.
"""

from __future__ import annotations

import torch

from fedclust.schema import PRECISIONS

# name -> (torch.set_float32_matmul_precision, torch.backends.cudnn.allow_tf32)
_FLAGS = {"default": ("highest", True), "fp32": ("highest", False), "tf32": ("high", True)}
assert set(_FLAGS) == set(PRECISIONS)


def precision_flags(name: str) -> tuple[str, bool]:
    """(matmul precision, cuDNN TF32) that ``name`` sets on a GPU."""
    if name not in _FLAGS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {name!r}")
    return _FLAGS[name]


def apply_precision(name: str, device_type: str) -> bool:
    """Set ``name``'s flags for this process when it computes on a GPU;
    True if it did (a CPU run changes nothing and returns False)."""
    matmul, conv = precision_flags(name)
    if device_type != "cuda":
        return False
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = conv
    return True
