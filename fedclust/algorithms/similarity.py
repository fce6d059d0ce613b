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


def grad_similarity(
    after_own: torch.Tensor,
    before_own: torch.Tensor,
    all_after: torch.Tensor,
    all_before: torch.Tensor,
    w0: torch.Tensor,
    alpha: float,
) -> torch.Tensor:
    """PANMGrad similarity, papers/001 Eq. 6: ``[C, n]``.

    ``after_own``/``before_own`` are this rank's models after/before the
    round's local training ``[C, P]``, ``all_after``/``all_before`` everyone's
    ``[n, P]``, ``w0`` the common initial weights ``[P]``.
    """
    # one [n, P] temporary at a time
    cos_update = cosine_matrix(after_own - before_own, all_after - all_before)
    cos_total = cosine_matrix(after_own - w0, all_after - w0)
    return alpha * cos_update + (1.0 - alpha) * cos_total


def loss_similarity(
    pair_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    all_after: torch.Tensor,
    cand_mask: torch.Tensor,
    chunk: int | None = None,
) -> torch.Tensor:
    """PANMLoss / PENS similarity, papers/001 Eq. 3: ``[C, n]``.

    ``s_cj = 1 / F_c(w_j)`` for every True entry of ``cand_mask [C, n]``,
    where ``pair_loss(models [M, P], local_index [M]) -> [M]`` is the mean
    cross-entropy of each model on the training set of this rank's client
    ``local_index``.  Entries not asked for are ``-inf`` (``NOT_COMPUTED``).
    The pairs go to ``pair_loss`` in chunks of at most ``chunk`` models
    (default: as many as fit in ``PAIR_CHUNK_ELEMENTS`` weights).
    """
    rows, cols = cand_mask.nonzero(as_tuple=True)
    out = torch.full(cand_mask.shape, NOT_COMPUTED, dtype=torch.float32, device=cand_mask.device)
    if rows.numel() == 0:
        return out
    if chunk is None:
        chunk = max(1, PAIR_CHUNK_ELEMENTS // max(1, all_after.shape[1]))
    losses = []
    for start in range(0, rows.numel(), chunk):  # chunks of pairs, bounded memory
        r, c = rows[start:start + chunk], cols[start:start + chunk]
        losses.append(pair_loss(all_after[c.to(all_after.device)], r).reshape(-1).to(out.device))
    loss = torch.cat(losses).to(torch.float32)
    out[rows, cols] = 1.0 / loss.clamp_min(LOSS_FLOOR)
    return out
