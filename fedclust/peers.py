"""Whom each of a rank's clients averages with, as index lists.

A peer algorithm's choice for its C clients out of n is either a bool
``[C, n]`` mask (PANM's and PENS's lists, which may hold a whole cluster) or
a :class:`PeerIndex`: each row's peers as ``[C, m]`` indices, m the longest
row (k for Random, FixTopology and Oracle), C·m numbers instead of C·n flags.
Rows never hold the row's own client.  The gossip, the metrics and the
traffic count take either form (:func:`as_indices`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust import rng

ROW_COUNT_CHUNK_ELEMENTS = 2**22   # mask entries row_counts sums at once (32 MB of int64)


def row_counts(mask: torch.Tensor) -> torch.Tensor:
    """``[C]`` int64: the True entries of each row of a bool ``[C, n]`` mask.
    torch sums a bool tensor through an int64 copy of it (8 bytes an entry,
    800 MB for 10,000 × 10,000); here a chunk of rows at a time, at most
    :data:`ROW_COUNT_CHUNK_ELEMENTS` entries."""
    C, n = mask.shape
    out = torch.empty(C, dtype=torch.int64, device=mask.device)
    step = max(1, ROW_COUNT_CHUNK_ELEMENTS // max(n, 1))
    for lo in range(0, C, step):   # chunks of rows: bounded memory
        out[lo:lo + step] = mask[lo:lo + step].sum(1)
    return out


def mask_indices(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(idx [C, m], valid [C, m]) of a bool [C, n] mask: row c's True columns
    in increasing order, padded to the longest row's m (0 and valid False there)."""
    C = mask.shape[0]
    counts = row_counts(mask)
    m = int(counts.max()) if C else 0
    rows, cols = mask.nonzero(as_tuple=True)                    # row-major: each row's columns ascending
    starts = counts.cumsum(0) - counts
    pos = torch.arange(len(rows), device=mask.device) - starts[rows]
    idx = torch.zeros(C, m, dtype=torch.long, device=mask.device)
    valid = torch.zeros(C, m, dtype=torch.bool, device=mask.device)
    idx[rows, pos] = cols
    valid[rows, pos] = True
    return idx, valid


@dataclass(frozen=True)
class PeerIndex:
    """Each row's peers among n clients: ``idx [C, m]`` int64, a row's peers in
    increasing order and then padding (0, ``valid`` False): the form
    :func:`mask_indices` gives, so either form of a choice yields the same
    indices in the same order."""

    idx: torch.Tensor
    valid: torch.Tensor
    n: int

    def __post_init__(self):
        if self.idx.shape != self.valid.shape or self.idx.dim() != 2:
            raise ValueError(f"idx and valid must both be [C, m], got {tuple(self.idx.shape)} and "
                             f"{tuple(self.valid.shape)}")

    @classmethod
    def from_mask(cls, mask: torch.Tensor) -> "PeerIndex":
        return cls(*mask_indices(mask), mask.shape[1])

    @classmethod
    def empty(cls, rows: int, n: int, device=None) -> "PeerIndex":
        """Rows with no peers (``m = 0``)."""
        return cls(torch.zeros(rows, 0, dtype=torch.long, device=device),
                   torch.zeros(rows, 0, dtype=torch.bool, device=device), n)

    @classmethod
    def draw(cls, seed: int, round_: int, stream: str, clients: torch.Tensor, n: int, k: int,
             allowed=None) -> "PeerIndex":
        """k uniform peers a row (:func:`fedclust.rng.choose_indices`: never the client itself; ``allowed`` a
        bool [C, n] mask or a function of a chunk of rows, None for every other client)."""
        return cls(*rng.choose_indices(seed, round_, stream, clients, n, k, allowed), n)

    @property
    def shape(self) -> tuple[int, int]:
        """``(C, n)``: the shape of the mask it stands for."""
        return self.idx.shape[0], self.n

    @property
    def device(self) -> torch.device:
        return self.idx.device

    def counts(self) -> torch.Tensor:
        """``[C]`` int64: peers per row."""
        return self.valid.sum(1)

    def mask(self) -> torch.Tensor:
        """The bool ``[C, n]`` mask (to combine with a mask-based choice, and to test)."""
        out = torch.zeros(self.idx.shape[0], self.n, dtype=torch.bool, device=self.idx.device)
        rows = torch.arange(self.idx.shape[0], device=self.idx.device)[:, None].expand_as(self.idx)
        out[rows[self.valid], self.idx[self.valid]] = True
        return out


def union(a: PeerIndex, b: PeerIndex) -> PeerIndex:
    """Each row's peers in ``a`` or ``b`` (the same rows, the same n), each once, in increasing order: two index
    lists merged with no ``[C, n]`` mask (cost ``C · (m_a + m_b)``)."""
    if a.idx.shape[0] != b.idx.shape[0] or a.n != b.n:
        raise ValueError(f"union of index lists of different shapes: {a.shape} and {b.shape}")
    n = a.n
    both = torch.cat([torch.where(a.valid, a.idx, n), torch.where(b.valid, b.idx, n)], dim=1)
    both = torch.sort(both, dim=1).values                        # padding (n) last
    repeat = torch.zeros_like(both, dtype=torch.bool)
    repeat[:, 1:] = both[:, 1:] == both[:, :-1]
    both = torch.where(repeat, n, both)
    both = torch.sort(both, dim=1).values
    valid = both < n
    width = int(valid.sum(1).max()) if valid.numel() else 0
    return PeerIndex(torch.where(valid, both, 0)[:, :width], valid[:, :width], n)


def incoming(pushes: PeerIndex, lo: int, hi: int) -> PeerIndex:
    """Whom clients ``lo .. hi − 1`` receive from: every sender j whose ``pushes`` row (``[n, s]``: the peers j
    pushes to) holds the client, as index lists of the C = hi − lo receivers, senders ascending."""
    n = pushes.idx.shape[0]
    senders = torch.arange(n, device=pushes.idx.device)[:, None].expand_as(pushes.idx)[pushes.valid]
    targets = pushes.idx[pushes.valid]
    mine = (targets >= lo) & (targets < hi)
    receiver, sender = targets[mine] - lo, senders[mine]
    order = torch.argsort(receiver * n + sender, stable=True)     # by receiver, then sender
    receiver, sender = receiver[order], sender[order]
    C = hi - lo
    counts = torch.bincount(receiver, minlength=C)
    width = int(counts.max()) if C and len(receiver) else 0
    pos = torch.arange(len(receiver), device=receiver.device) - (counts.cumsum(0) - counts)[receiver]
    idx = torch.zeros(C, width, dtype=torch.int64, device=receiver.device)
    valid = torch.zeros(C, width, dtype=torch.bool, device=receiver.device)
    idx[receiver, pos] = sender
    valid[receiver, pos] = True
    return PeerIndex(idx, valid, n)


def as_indices(peers) -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx, valid)`` of a choice in either form (a :class:`PeerIndex` or a bool ``[C, n]`` mask)."""
    if isinstance(peers, PeerIndex):
        return peers.idx, peers.valid
    return mask_indices(peers)


def as_mask(peers) -> torch.Tensor:
    """The bool ``[C, n]`` mask of a choice in either form."""
    return peers.mask() if isinstance(peers, PeerIndex) else peers


def peer_counts(peers) -> torch.Tensor:
    """``[C]`` int64 peers per row of a choice in either form."""
    return peers.counts() if isinstance(peers, PeerIndex) else row_counts(peers)


_BITS = (1 << torch.arange(8, dtype=torch.uint8))   # bit k of a packed byte holds column 8·b + k


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """A bool ``[C, w]`` mask as ``[C, ceil(w / 8)]`` uint8, eight columns a
    byte: how checkpoints hold masks (a neighbour list of 100,000 clients is
    1.25 GB instead of 10 GB).  :func:`unpack_bits` reverses it."""
    C, w = mask.shape
    padded = torch.nn.functional.pad(mask.to(torch.uint8), (0, (-w) % 8)).view(C, (w + 7) // 8, 8)
    return (padded * _BITS.to(mask.device)).sum(-1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, width: int) -> torch.Tensor:
    """The bool ``[C, width]`` mask of :func:`pack_bits`' bytes."""
    bits = (packed[..., None] & _BITS.to(packed.device)) != 0
    return bits.reshape(packed.shape[0], packed.shape[1] * 8)[:, :width]
