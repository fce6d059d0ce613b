"""How often each client picked each peer, kept as short per-client lists
instead of a ``[C, n]`` table: ``peers [C, w]`` int64, each row's peers in
increasing order and padded with -1 at the end, and ``counts [C, w]`` int32
(0 in the padding).  A row holds only the peers ever counted, so w is at most
the picks of all rounds (PENS's stage one: T1·k), whatever n.  Used by PENS's
stage-one counts and the runner's record of who averaged with whom in stage
one.  Every function works on each row alone, batched over rows.
"""

from __future__ import annotations

import torch

from fedclust.peers import as_indices, mask_indices

_LAST = torch.iinfo(torch.int64).max   # sorts after every peer


def empty_counts(rows: int, width: int = 0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(peers, counts)`` of ``rows`` clients that counted nobody yet, ``width`` slots each."""
    return (torch.full((rows, width), -1, dtype=torch.int64, device=device),
            torch.zeros(rows, width, dtype=torch.int32, device=device))


def add_counts(peers: torch.Tensor, counts: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor,
               width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Count once more each ``idx[c, s]`` where ``valid[c, s]`` (a row's valid
    entries distinct, e.g. :func:`mask_indices` of a mask): the lists
    merged row by row.  The result is as wide as the row with the most peers
    needs, or exactly ``width`` (a fixed width, the same on every rank, for a
    state that checkpoints gather); ValueError if a row needs more."""
    rows = peers.shape[0]
    cols = torch.cat([peers.masked_fill(peers < 0, _LAST), idx.to(torch.int64).masked_fill(~valid, _LAST)], dim=1)
    weight = torch.cat([counts, valid.to(counts.dtype)], dim=1)
    cols, order = torch.sort(cols, dim=1, stable=True)
    weight = weight.gather(1, order)
    real = cols != _LAST
    first = real.clone()
    first[:, 1:] &= cols[:, 1:] != cols[:, :-1]     # the first entry of each distinct peer
    slot = first.cumsum(1) - 1                        # its place in the merged row
    need = int(first.sum(1).max()) if rows and cols.shape[1] else 0
    if width is not None:
        if need > width:
            raise ValueError(f"a client counted {need} distinct peers, more than the {width} slots its list has")
        need = width
    slot = torch.where(real, slot, torch.full_like(slot, need))   # padding goes to a spare column, dropped
    out_peers = torch.full((rows, need + 1), -1, dtype=torch.int64, device=peers.device)
    out_counts = torch.zeros(rows, need + 1, dtype=counts.dtype, device=peers.device)
    # every entry written to a slot carries the same peer, so the order of the writes does not matter
    out_peers.scatter_(1, slot, torch.where(real, cols, torch.full_like(cols, -1)))
    out_counts.scatter_add_(1, slot, weight * real.to(weight.dtype))
    return out_peers[:, :need].contiguous(), out_counts[:, :need].contiguous()


def add_mask(peers: torch.Tensor, counts: torch.Tensor, mask,
             width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`add_counts` of the True entries of a bool ``[C, n]`` mask (or a :class:`fedclust.peers.PeerIndex`)."""
    idx, valid = as_indices(mask)
    return add_counts(peers, counts, idx, valid, width)


def counts_matrix(peers: torch.Tensor, counts: torch.Tensor, n: int) -> torch.Tensor:
    """The ``[C, n]`` int64 table the lists stand for (to test and inspect)."""
    out = torch.zeros(peers.shape[0], n, dtype=torch.int64, device=peers.device)
    rows = torch.arange(peers.shape[0], device=peers.device)[:, None].expand_as(peers)
    ok = peers >= 0
    out[rows[ok], peers[ok]] = counts[ok].to(torch.int64)
    return out


def counted_more_than(peers: torch.Tensor, counts: torch.Tensor, threshold: int, n: int) -> torch.Tensor:
    """Bool ``[C, n]``: the peers counted more than ``threshold`` times."""
    out = torch.zeros(peers.shape[0], n, dtype=torch.bool, device=peers.device)
    rows = torch.arange(peers.shape[0], device=peers.device)[:, None].expand_as(peers)
    keep = (peers >= 0) & (counts.to(torch.int64) > threshold)
    out[rows[keep], peers[keep]] = True
    return out


def from_matrix(table: torch.Tensor, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The lists of a ``[C, n]`` table of counts (checkpoints of earlier
    versions hold the table): its nonzero entries, row by row."""
    idx, valid = mask_indices(table != 0)
    peers = torch.where(valid, idx, torch.full_like(idx, -1))
    counts = torch.where(valid, table.gather(1, idx), torch.zeros_like(idx)).to(torch.int32)
    w = peers.shape[1]
    if width is not None:
        if w > width:
            raise ValueError(f"a client counted {w} distinct peers, more than the {width} slots its list has")
        pad = width - w
        peers = torch.cat([peers, peers.new_full((peers.shape[0], pad), -1)], dim=1)
        counts = torch.cat([counts, counts.new_zeros((counts.shape[0], pad))], dim=1)
    return peers, counts
