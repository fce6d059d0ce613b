"""What is measured (docs/algorithms.md): neighbour precision and recall, cluster
recovery from the symmetrised neighbour graph (number of components and
adjusted Rand index against the truth)."""

from __future__ import annotations

import numpy as np
import torch

from fedclust.lists import graph_components
from fedclust.peers import PeerIndex, row_counts


def neighbor_precision_recall(lists, clusters: torch.Tensor | None, client_ids: torch.Tensor):
    """Per-client precision and recall of neighbour lists: a bool [C, n]
    mask or a :class:`fedclust.peers.PeerIndex` (then no [C, n] table is made).

    precision_i = |N_i ∩ same_i| / |N_i| (NaN for an empty list);
    recall_i = |N_i ∩ same_i| / |same_i| with same_i the other members of
    i's true cluster (NaN if i is alone in its cluster).  Both NaN for every
    client when the true clusters are not known (``clusters`` None).
    """
    device = lists.device
    if clusters is None:
        nan = torch.full((len(client_ids),), float("nan"), dtype=torch.float64, device=device)
        return nan, nan.clone()
    clusters = clusters.to(device)
    ids = client_ids.to(device)
    own = clusters[ids]
    if isinstance(lists, PeerIndex):
        same = (clusters[lists.idx] == own[:, None]) & (lists.idx != ids[:, None])
        hits = (lists.valid & same).sum(1).double()
        size = lists.counts().double()
    else:
        same = own[:, None] == clusters[None, :]
        same[torch.arange(len(client_ids), device=device), ids] = False
        hits = row_counts(lists & same).double()
        size = row_counts(lists).double()
    peers = (torch.bincount(clusters)[own] - 1).double()   # the other members of the client's cluster
    nan = torch.full_like(hits, float("nan"))
    precision = torch.where(size > 0, hits / size.clamp(min=1), nan)
    recall = torch.where(peers > 0, hits / peers.clamp(min=1), nan)
    return precision, recall


def nanmean(x: torch.Tensor) -> float | None:
    """Mean over the defined entries; None if none is defined."""
    x = x[~torch.isnan(x)]
    return float(x.mean()) if x.numel() else None


def adjusted_rand_index(labels_true, labels_pred) -> float:
    """Adjusted Rand index (Hubert and Arabie 1985) of two labelings: the
    pair counts of their contingency table (a scipy sparse matrix), counted
    exactly in integers, against their expectation under random labelings
    with the same cluster sizes.  1 when both give the same partition."""
    from scipy.sparse import csr_matrix  # here: 0.1 s of every process's start otherwise

    _, t = np.unique(np.asarray(labels_true), return_inverse=True)
    _, p = np.unique(np.asarray(labels_pred), return_inverse=True)
    table = csr_matrix((np.ones(len(t), dtype=np.int64), (t.ravel(), p.ravel()))).toarray()   # contingency
    pairs = int((table * (table - 1) // 2).sum())                 # pairs together in both
    rows = int((a := table.sum(1)) @ (a - 1) // 2)                # pairs together in labels_true
    cols = int((b := table.sum(0)) @ (b - 1) // 2)                # pairs together in labels_pred
    n = int(table.sum())
    expected = rows * cols / (n * (n - 1) // 2) if n > 1 else 0.0
    top = 0.5 * (rows + cols)
    if top == expected:   # one cluster on both sides, or every client alone on both: the same partition
        return 1.0
    return (pairs - expected) / (top - expected)


def cluster_recovery(lists, clusters) -> dict:
    """``num_clusters`` and ``ari`` of the neighbour graph's components (ari None when the true clusters are
    not known); lists as :func:`graph_components` takes them."""
    labels = graph_components(lists)
    ari = None if clusters is None else adjusted_rand_index(np.asarray(clusters), labels)
    return {"num_clusters": int(labels.max() + 1), "ari": ari}


DRIFT_BEFORE = 5      # rounds before a drift event whose accuracy is the moved clients' level (SPEC-dynamics §3.2)
DRIFT_WITHIN = 1.0    # points below that level that count as recovered
DRIFT_AFTER = 50      # rounds from the event over which the moved clients' accuracy is averaged


def drift_recovery(rounds: list[int], accuracy: list[float], event: int) -> dict:
    """What a drift event at round ``event`` did to its moved clients, from their mean accuracy (percent)
    ``accuracy[i]`` after each evaluated round ``rounds[i]`` (increasing):

    - ``pre_accuracy``: the mean over the evaluated rounds in ``[event − 5, event)`` (none there: the last
      evaluated round before the event; none at all: null, and so are the next two);
    - ``recovery_rounds``: ``t − event`` for the first evaluated round ``t >= event`` whose accuracy is at least
      ``pre_accuracy − 1`` (0: no drop after the event's own round), null where it never is (``recovered``
      false);
    - ``accuracy_after``: the mean over the evaluated rounds in ``[event, event + 50)`` (null: none)."""
    before = [a for t, a in zip(rounds, accuracy) if event - DRIFT_BEFORE <= t < event]
    if not before:
        before = [a for t, a in zip(rounds, accuracy) if t < event][-1:]
    after = [a for t, a in zip(rounds, accuracy) if event <= t < event + DRIFT_AFTER]
    pre = float(np.mean(before)) if before else None
    back = None if pre is None else next((t - event for t, a in zip(rounds, accuracy)
                                          if t >= event and a >= pre - DRIFT_WITHIN), None)
    return {"pre_accuracy": pre, "recovery_rounds": back, "recovered": back is not None,
            "accuracy_after": float(np.mean(after)) if after else None}
