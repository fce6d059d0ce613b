"""Client similarity metrics of PANM (papers/001 §3.2.1, SPEC §4).

- Loss (Eq. 3): ``s_ij = 1 / F_i(w_j)``, the mean cross-entropy of peer j's
  current model on client i's whole training set; evaluated only on the
  (i, j) pairs a client actually contacts.
- Grad (Eq. 4-6): ``s_ij = α·cos(Δ_i, Δ_j) + (1-α)·cos(w_i - w0, w_j - w0)``
  with ``Δ = w^t - w^{t-1}`` the change over this round's local training.

Both return ``[C, n]`` matrices whose rows are this rank's clients and whose
columns are all n clients.
"""

from __future__ import annotations

from typing import Callable

import torch

EPS = 1e-12
NOT_COMPUTED = float("-inf")   # loss_similarity's value where no pair was evaluated
LOSS_FLOOR = 1e-12             # a loss of 0 would give an infinite similarity
PAIR_CHUNK_ELEMENTS = 2**26    # models per pair_loss call: at most this many weights (256 MB in float32)


def cosine_matrix(a: torch.Tensor, b: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """``[A, B]`` cosines between the rows of ``a [A, P]`` and ``b [B, P]``
    (0 where either row is zero).  One matrix product, then division by the
    row norms, so no normalised copy of ``b`` is made."""
    na = a.norm(dim=1).clamp_min(eps)
    nb = b.norm(dim=1).clamp_min(eps)
    return (a @ b.T) / (na[:, None] * nb[None, :])


def cosine_rows(b: torch.Tensor, own: slice, eps: float = EPS) -> torch.Tensor:
    """``cosine_matrix(b[own], b)``: the rows ``own`` of ``b``'s cosine matrix,
    with the row norms computed once."""
    nb = b.norm(dim=1).clamp_min(eps)
    return (b[own] @ b.T) / (nb[own][:, None] * nb[None, :])


def grad_similarity(
    all_after: torch.Tensor,
    all_before: torch.Tensor,
    w0: torch.Tensor,
    alpha: float,
    own: slice = slice(None),
) -> torch.Tensor:
    """PANMGrad similarity, papers/001 Eq. 6: ``[C, n]``, rows ``own``.

    ``all_after``/``all_before`` are everyone's models after/before the
    round's local training ``[n, P]``, ``w0`` the common initial weights
    ``[P]``, ``own`` the contiguous rows of this rank's clients.  Each
    difference (update, distance from w0) is formed once for all n clients,
    one ``[n, P]`` temporary at a time, and this rank's rows are slices of it.
    """
    cos_update = cosine_rows(all_after - all_before, own)
    cos_total = cosine_rows(all_after - w0, own)
    return cos_update.mul_(alpha).add_(cos_total, alpha=1.0 - alpha)


def padded_pools(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(peers [C, m], valid [C, m])`` of a ``[C, n]`` bool mask: row c's
    True columns in ascending order, padded to the longest row ``m`` with
    the row's first True column (or 0); ``valid`` marks the real entries."""
    counts = mask.sum(1)
    m = int(counts.max()) if mask.numel() else 0
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)[:, :m]   # True columns first
    valid = torch.arange(m, device=mask.device)[None, :] < counts[:, None]
    peers = torch.where(valid, order, order[:, :1].expand_as(order))
    return peers, valid


def loss_similarity(
    pair_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    all_after: torch.Tensor,
    cand_mask: torch.Tensor,
    chunk: int | None = None,
    pool_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """PANMLoss / PENS similarity, papers/001 Eq. 3: ``[C, n]``.

    ``s_cj = 1 / F_c(w_j)`` for every True entry of ``cand_mask [C, n]``;
    entries not asked for are ``-inf`` (``NOT_COMPUTED``).  The losses come
    from ``pool_loss(models [n, P], peers [C, m]) -> [C, m]`` when given
    (the engine's grouped path: client c's loss of ``models[peers[c, s]]``,
    rows padded by :func:`padded_pools`), else from
    ``pair_loss(models [M, P], local_index [M]) -> [M]``, the mean
    cross-entropy of each model on the training set of this rank's client
    ``local_index``, called on chunks of at most ``chunk`` pairs (default:
    as many as fit in ``PAIR_CHUNK_ELEMENTS`` weights).
    """
    rows, cols = cand_mask.nonzero(as_tuple=True)
    out = torch.full(cand_mask.shape, NOT_COMPUTED, dtype=torch.float32, device=cand_mask.device)
    if rows.numel() == 0:
        return out
    if pool_loss is not None:
        peers, valid = padded_pools(cand_mask)
        loss = pool_loss(all_after, peers.to(all_after.device)).to(device=out.device, dtype=torch.float32)
        r = torch.arange(len(peers), device=out.device)[:, None].expand_as(peers)
        out[r[valid], peers[valid]] = 1.0 / loss[valid].clamp_min(LOSS_FLOOR)   # padding never written
        return out
    if pair_loss is None:
        raise ValueError("loss_similarity needs pair_loss or pool_loss")
    if chunk is None:
        chunk = max(1, PAIR_CHUNK_ELEMENTS // max(1, all_after.shape[1]))
    losses = []
    for start in range(0, rows.numel(), chunk):  # chunks of pairs, bounded memory
        r, c = rows[start:start + chunk], cols[start:start + chunk]
        losses.append(pair_loss(all_after[c.to(all_after.device)], r).reshape(-1).to(out.device))
    loss = torch.cat(losses).to(torch.float32)
    out[rows, cols] = 1.0 / loss.clamp_min(LOSS_FLOOR)
    return out
