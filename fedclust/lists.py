"""Neighbour lists as a run records them: ``[n, m]`` int32 client ids, each
row ascending, padded with -1 (n·m numbers, never an ``[n, n]`` table), and
the graph they define.  numpy and scipy only: the report and figure commands
read them without torch."""

from __future__ import annotations

import numpy as np


def index_lists(lists) -> np.ndarray:
    """Neighbour lists as ``[n, m]`` int32 client ids, each row ascending and
    padded with -1 to the longest list's m: the form a run records
    (``neighbors.npz``'s ``final_lists``).  A bool ``[n, n]`` adjacency (the
    form of runs and checkpoints before it) is converted; index lists are
    returned as they are."""
    lists = np.asarray(lists)
    if lists.dtype != bool:
        return lists.astype(np.int32, copy=False)
    counts = lists.sum(1)
    rows, cols = np.nonzero(lists)                        # row-major: each row's columns ascending
    out = np.full((lists.shape[0], int(counts.max()) if len(counts) else 0), -1, dtype=np.int32)
    out[rows, np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)] = cols
    return out


def list_edges(lists) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) of every entry j in client i's list, in row order; lists as
    :func:`index_lists` takes them."""
    idx = index_lists(lists)
    valid = idx >= 0
    return np.nonzero(valid)[0], idx[valid].astype(np.int64)


def graph_components(lists) -> np.ndarray:
    """Labels of the connected components of the symmetrised neighbour graph
    (i ~ j if i lists j or j lists i) of ``[n, m]`` index lists or a bool
    ``[n, n]`` adjacency; a sparse graph of the listed entries, no n × n."""
    from scipy.sparse import csr_matrix  # here: 0.1 s of every process's start otherwise
    from scipy.sparse.csgraph import connected_components

    n = np.asarray(lists).shape[0]
    i, j = list_edges(lists)
    graph = csr_matrix((np.ones(len(i), dtype=np.int8), (i, j)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    return labels


def count_table(peers, counts, n: int, max_side: int = 1000) -> tuple[np.ndarray, int]:
    """``(table, block)``: the ``[n, n]`` table of how often client i counted
    peer j from its lists (``peers [n, w]``, -1 padding; ``counts [n, w]``),
    summed over blocks of ``block`` clients a side so that no side exceeds
    ``max_side`` (block 1: the table itself)."""
    peers, counts = np.asarray(peers), np.asarray(counts)
    block = max(1, -(-n // max_side))
    side = -(-n // block)
    table = np.zeros((side, side), dtype=np.int64)
    rows, slots = np.nonzero(peers >= 0)
    np.add.at(table, (rows // block, peers[rows, slots] // block), counts[rows, slots])
    return table, block
