"""Confident Neighbour Initialization, stage one of PANM (PANM paper §3.2.2
Eq. 8, docs/algorithms.md).

Each round client i draws l candidates ``C_i`` uniformly from the other
clients; its neighbours are the k with the highest similarity among
``C_i ∪ N_i^{t-1}`` (round 1: among ``C_i``).  PENS's stage one (Eq. 7) is
the same top-k without the previous neighbours.  Pure functions on bool
masks ``[C, n]`` and similarity matrices ``[C, n]``.

Paper: Z. Li, J. Lu, S. Luo, D. Zhu, Y. Shao, Y. Li, Z. Zhang, C. Wu, "Mining Latent Relationships
among Clients: Peer-to-peer Federated Learning with Adaptive Neighbor Matching",
https://arxiv.org/abs/2203.12285
"""

from __future__ import annotations

import torch

from fedclust.peers import PeerIndex, mask_indices


def top_k_in_mask(similarity: torch.Tensor, allowed: torch.Tensor, k: int) -> torch.Tensor:
    """Bool ``[C, n]``: per row the k allowed entries of highest similarity
    (all allowed entries if fewer).  Ties go to the lower column index; NaN
    counts as lowest.  Each row depends on that row alone.  Only the allowed
    entries are sorted (a stable sort of each row's m allowed values, taken
    in column order), not all n."""
    C, n = allowed.shape
    if min(k, n) <= 0 or C == 0:
        return torch.zeros_like(allowed)
    idx, valid = mask_indices(allowed)                   # [C, m], columns ascending
    return top_k_of_pool(similarity.gather(1, idx), idx, valid, k, n)


def top_k_of_pool(values: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor, k: int, n: int,
                  row_k: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`top_k_in_mask` from the similarities on the allowed entries
    alone: ``values [C, m]`` at columns ``idx [C, m]`` (each row's allowed
    columns in increasing order, ``valid`` False in the padding), as
    :class:`fedclust.algorithms.similarity.PoolScores` holds them.
    ``row_k [C]``: each row keeps only its ``row_k`` best of the k (at most k)."""
    C = idx.shape[0]
    if min(k, n) <= 0 or C == 0:
        return torch.zeros(C, n, dtype=torch.bool, device=idx.device)
    sim = torch.nan_to_num(values.to(torch.float64), nan=float("-inf"))
    sim = sim.masked_fill(~valid, float("-inf"))
    # stable sorts: by similarity (descending), then real entries before padding
    order = torch.sort(sim, dim=1, descending=True, stable=True).indices
    first = torch.sort(valid.gather(1, order).to(torch.int8), dim=1, descending=True, stable=True).indices
    pick = order.gather(1, first[:, :min(k, idx.shape[1])])
    # padding is picked only by rows with fewer than k entries, and sets nothing
    keep = valid.gather(1, pick)
    if row_k is not None:
        keep &= torch.arange(pick.shape[1], device=pick.device)[None, :] < row_k.to(pick.device)[:, None]
    return PeerIndex(idx.gather(1, pick), keep, n).mask()


def draw_candidates(seed: int, round_: int, client_ids: torch.Tensor, n: int, l: int,
                    stream: str = "candidates", allowed=None) -> torch.Tensor:
    """l candidates per client drawn uniformly from the n - 1 other clients (bool ``[C, n]``); ``allowed``:
    only among those (the round's graph neighbours, :class:`fedclust.network.Reach`)."""
    return PeerIndex.draw(seed, round_, stream, client_ids, n, l, allowed).mask()


def cni_pool(candidates: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
    """The peers a client scores this round: ``C_i ∪ N_i^{t-1}`` (``C_i`` in round 1)."""
    return candidates if previous is None else candidates | previous


def cni_step(similarity: torch.Tensor, candidates: torch.Tensor, previous: torch.Tensor | None,
             k: int) -> torch.Tensor:
    """``N_i^t``: the top k by similarity among ``C_i ∪ N_i^{t-1}`` (PANM paper Eq. 8)."""
    return top_k_in_mask(similarity, cni_pool(candidates, previous), k)
