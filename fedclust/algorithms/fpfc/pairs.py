"""FPFC's pairs of clients: how many, the literal order i < j of
Algorithm 1's ``[E, P]`` arrays, and how many pairs a chunk of work holds."""

from __future__ import annotations

import torch

# Pairs per chunk × P at most this (4 MB per float32 buffer, or one pair): on 2 CPU cores with 40 MLP clients a
# compact round took 0.9 s with 2^20 against 2.8 s with 2^24, whose 64 MB buffers are fresh mappings faulted in
# at every chunk, and peaked 0.25 GB lower.
CHUNK_ELEMENTS = 2**20


def n_pairs(n: int) -> int:
    """E = n(n − 1)/2 pairs i < j."""
    return n * (n - 1) // 2


def pair_index(n: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """``(i [E], j [E])`` of the pairs i < j, row-major (the layout of θ and v)."""
    ij = torch.triu_indices(n, n, offset=1, device=device)
    return ij[0], ij[1]



def pair_chunk(P: int, chunk_pairs: int | None) -> int:
    """Pairs a chunk holds: ``chunk_pairs``, or (None) as many as :data:`CHUNK_ELEMENTS` numbers of width P."""
    return max(1, chunk_pairs if chunk_pairs else CHUNK_ELEMENTS // max(P, 1))
