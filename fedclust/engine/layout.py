"""Flat parameter layout: a module's parameters as one row of a ``[C, P]`` buffer.

Every client's model is one row of a single contiguous buffer; the layers
are slices of that row, in ``module.named_parameters()`` order.  ``views``
gives per-layer views (no copy), so an optimizer step on the views updates
the buffer in place, and averaging/gossip (docs/algorithms.md) is a plain matrix
product on the buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ParamLayout:
    """Names, shapes and offsets of a module's parameters in a flat row of ``numel`` (P) entries."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    numel: int

    @classmethod
    def from_module(cls, module: nn.Module) -> "ParamLayout":
        names, shapes, offsets, off = [], [], [], 0
        for name, p in module.named_parameters():
            names.append(name)
            shapes.append(tuple(p.shape))
            offsets.append(off)
            off += p.numel()
        return cls(tuple(names), tuple(shapes), tuple(offsets), off)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    def _check_module(self, module: nn.Module) -> list[torch.Tensor]:
        params = list(module.named_parameters())
        got = tuple((n, tuple(p.shape)) for n, p in params)
        want = tuple(zip(self.names, self.shapes))
        if got != want:
            raise ValueError(f"module parameters {got} do not match the layout {want}; "
                             "build the layout from the same architecture")
        return [p for _, p in params]

    def _check_flat(self, flat: torch.Tensor) -> None:
        if flat.dim() < 1 or flat.shape[-1] != self.numel:
            raise ValueError(f"flat parameters must have a last dimension of P = {self.numel}, "
                             f"got shape {tuple(flat.shape)}; use the layout of the model that made them")

    def flatten(self, module: nn.Module) -> torch.Tensor:
        """The module's parameters as a new flat tensor ``[P]``."""
        params = self._check_module(module)
        return torch.cat([p.detach().reshape(-1) for p in params])

    def select(self, patterns) -> tuple[int, ...]:
        """Indices (ascending) of the tensors ``patterns`` names: each entry a tensor's name (``fc3.weight``), a
        module prefix (``fc3``: ``fc3.weight``, ``fc3.bias``), or ``head``, the last layer (the tensors of the
        module that holds the last one).  ValueError naming an entry that matches nothing."""
        picked: set[int] = set()
        for pat in patterns:
            if pat == "head":
                last = self.names[-1].rsplit(".", 1)[0] if "." in self.names[-1] else self.names[-1]
                hit = {k for k, name in enumerate(self.names) if name == last or name.startswith(last + ".")}
            else:
                hit = {k for k, name in enumerate(self.names) if name == pat or name.startswith(pat + ".")}
            if not hit:
                raise ValueError(f"{pat!r} names none of the model's parameter tensors {list(self.names)}")
            picked |= hit
        return tuple(sorted(picked))

    def column_ranges(self, tensors) -> tuple[tuple[int, int], ...]:
        """The flat columns of ``tensors`` (indices) as ``(start, stop)`` ranges, adjacent ones merged."""
        out: list[tuple[int, int]] = []
        for k in sorted(tensors):
            a, b = self.offsets[k], self.offsets[k] + self.sizes[k]
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        return tuple(out)

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: view [..., *shape]}`` of a ``[..., P]`` buffer, sharing its memory."""
        self._check_flat(flat)
        return {
            name: flat[..., off:off + size].unflatten(-1, shape) if shape else flat[..., off]
            for name, shape, off, size in zip(self.names, self.shapes, self.offsets, self.sizes)
        }

    def load_into(self, module: nn.Module, flat_row: torch.Tensor) -> None:
        """Copy a ``[P]`` row into the module's parameters."""
        if flat_row.dim() != 1:
            raise ValueError(f"flat_row must be one model [P], got shape {tuple(flat_row.shape)}")
        params = self._check_module(module)
        with torch.no_grad():
            for p, v in zip(params, self.views(flat_row).values()):
                p.copy_(v)
