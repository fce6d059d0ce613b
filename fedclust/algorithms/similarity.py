"""Client similarity metrics of PANM (PANM paper §3.2.1, docs/algorithms.md).

- Loss (Eq. 3): ``s_ij = 1 / F_i(w_j)``, the mean cross-entropy of peer j's
  current model on client i's whole training set; evaluated only on the
  (i, j) pairs a client actually contacts.
- Grad (Eq. 4-6): ``s_ij = α·cos(Δ_i, Δ_j) + (1-α)·cos(w_i - w0, w_j - w0)``
  with ``Δ = w^t - w^{t-1}`` the change over this round's local training.

Both return ``[C, n]`` matrices whose rows are this rank's clients and whose
columns are all n clients.  :func:`loss_em_input` turns loss similarities
into what PANMLoss's HNM runs its EM on (``panm.em_input``).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from fedclust.algorithms.base import loss_given
from fedclust.peers import mask_indices

EPS = 1e-12
NOT_COMPUTED = float("-inf")   # loss_similarity's value where no pair was evaluated
LOSS_FLOOR = 1e-12             # a loss of 0 would give an infinite similarity
GRAD_BLOCK = 16384             # parameters per block of grad_similarity on a CPU (cache-sized for 100 clients)
# From this many clients PANMGrad's similarity is computed on the pools only (n alone decides, the same on every
# rank).  Below it one dense product is as fast: on a 2-core CPU, P = 199,210, pools of 20, the pool path took
# 5.9 s at n = 2,000 against the dense product's 21.5 s, which falls as n² (about 1.3 s at n = 500); the pool
# path falls as n.
POOL_SIMILARITY_MIN_CLIENTS = 1000
PAIR_CHUNK_ELEMENTS = 2**26    # models per pair_loss call: at most this many weights (256 MB in float32)


@dataclass
class PoolScores:
    """A round's similarities where they were asked for, C·m numbers instead
    of C·n: ``values [C, m]`` at columns ``idx [C, m]`` (each row's pool in
    increasing order, :func:`mask_indices`; ``valid`` False in the
    padding, whose values mean nothing), and client 0's whole row where the
    similarity computed it (``row0 [n]``: PANMGrad, on the rank that holds
    client 0; else None)."""

    idx: torch.Tensor
    valid: torch.Tensor
    values: torch.Tensor
    row0: torch.Tensor | None = None

    @classmethod
    def from_matrix(cls, sim: torch.Tensor, pool: torch.Tensor, row0: torch.Tensor | None = None) -> "PoolScores":
        """The scores of a ``[C, n]`` similarity on ``pool``."""
        idx, valid = mask_indices(pool)
        return cls(idx, valid, sim.gather(1, idx), row0)

    def with_values(self, values: torch.Tensor) -> "PoolScores":
        """The same pools with other values (e.g. HNM's EM input)."""
        return PoolScores(self.idx, self.valid, values, self.row0)

    def matrix(self, n: int, fill: float = math.nan) -> torch.Tensor:
        """``[C, n]``: the values at their columns, ``fill`` elsewhere (to inspect and test)."""
        out = self.values.new_full((self.idx.shape[0], n), fill)
        rows = torch.arange(self.idx.shape[0], device=self.idx.device)[:, None].expand_as(self.idx)
        out[rows[self.valid], self.idx[self.valid]] = self.values[self.valid]
        return out


def _row_positions(rows: torch.Tensor, count: int) -> torch.Tensor:
    """Place of each entry within its row, for entries listed row by row (``rows`` ascending) of ``count`` rows."""
    per_row = torch.bincount(rows, minlength=count)
    starts = per_row.cumsum(0) - per_row
    return torch.arange(len(rows), device=rows.device) - starts[rows]


def grad_similarity(
    all_after: torch.Tensor,
    all_before: torch.Tensor,
    w0: torch.Tensor,
    alpha: float,
    own: slice = slice(None),
    block: int | None = None,
) -> torch.Tensor:
    """PANMGrad similarity, PANM paper Eq. 6: ``[C, n]``, rows ``own``.

    ``all_after``/``all_before`` are everyone's models after/before the
    round's local training ``[n, P]``, ``w0`` the common initial weights
    ``[P]``, ``own`` the contiguous rows of this rank's clients.  The two
    differences (update ``Δ``, distance from ``w0``) are formed ``block``
    parameters at a time and folded straight into the dot products and the
    squared norms, so no ``[n, P]`` temporary is written and read back (the
    products are memory-bound on a CPU; measured 74 ms instead of 113 ms for
    100 MLP clients on 2 cores).  Default ``block``: :data:`GRAD_BLOCK` on a
    CPU, all of P at once on a GPU (fewer kernel launches; bandwidth is ample).
    """
    n, P = all_after.shape
    block = block or (max(P, 1) if all_after.is_cuda else GRAD_BLOCK)
    C = len(range(n)[own])
    dot_u = all_after.new_zeros(C, n)
    dot_w = all_after.new_zeros(C, n)
    sq_u = all_after.new_zeros(n)
    sq_w = all_after.new_zeros(n)
    for s in range(0, P, block):   # parameter blocks, not clients
        u = all_after[:, s:s + block] - all_before[:, s:s + block]
        w = all_after[:, s:s + block] - w0[s:s + block]
        dot_u.addmm_(u[own], u.T)
        dot_w.addmm_(w[own], w.T)
        sq_u += (u * u).sum(1)
        sq_w += (w * w).sum(1)
    nu, nw = sq_u.sqrt().clamp_min(EPS), sq_w.sqrt().clamp_min(EPS)
    cos_update = dot_u / (nu[own][:, None] * nu[None, :])
    cos_total = dot_w / (nw[own][:, None] * nw[None, :])
    return cos_update.mul_(alpha).add_(cos_total, alpha=1.0 - alpha)


POOL_BLOCK = 16384            # parameters per block of grad_similarity_pool


def grad_similarity_pool(
    all_after: torch.Tensor,
    all_before: torch.Tensor,
    w0: torch.Tensor,
    alpha: float,
    pool: torch.Tensor,
    own: slice = slice(None),
    full_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`grad_similarity` at the True entries of ``pool`` [C, n] only
    (what CNI and HNM read), NaN elsewhere: the dot products of just those
    pairs (``torch.sparse.sampled_addmm`` on the pool's pattern, O(C·m·P)
    for pools of m peers instead of O(C·n·P)), in fixed blocks of
    :data:`POOL_BLOCK` parameters so that a row's sums do not depend on how
    many rows a rank holds.  Rows where ``full_rows`` [C] is True are
    computed against all n clients (client 0's row, kept for its figure)."""
    whole = [(0, all_after.shape[1], {"after": all_after, "before": all_before})]
    return grad_similarity_blocks(whole, all_after.shape[0], w0, alpha, pool, own, full_rows)


def grad_similarity_blocks(blocks, n: int, w0: torch.Tensor, alpha: float, pool: torch.Tensor,
                           own: slice = slice(None), full_rows: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`grad_pool_scores` as a ``[C, n]`` matrix, NaN where not computed."""
    scores, full, full_values = grad_pool_scores(blocks, n, w0, alpha, pool, own, full_rows, keep_full=True)
    out = scores.matrix(n)
    if len(full):
        out[full] = full_values
    return out


def grad_pool_scores(blocks, n: int, w0: torch.Tensor, alpha: float, pool: torch.Tensor,
                     own: slice = slice(None), full_rows: torch.Tensor | None = None, keep_full: bool = False):
    """:func:`grad_similarity_pool` from the models in column blocks, as
    :class:`PoolScores` (``row0``: the first full row, client 0's where
    ``full_rows`` marks it; ``keep_full`` also returns every full row:
    ``(scores, full row indices, [F, n] values)``):
    ``blocks`` yields ``(start, stop, {"after": [n, stop - start], "before":
    ...})`` in increasing order (one pass of
    :class:`fedclust.dist.ColumnBlocks`, or the whole models as one block).
    The sums go in :data:`POOL_BLOCK` pieces cut at fixed parameter
    positions (multiples of POOL_BLOCK, and the blocks' edges), so blocks
    whose widths are multiples of POOL_BLOCK give the whole models' result
    bit for bit."""
    device = w0.device
    C = pool.shape[0]
    own_idx = torch.arange(n, device=device)[own]
    idx, valid, cols, rows, pattern = _pool_pattern(pool.to(device), n, w0)
    full = (full_rows.nonzero(as_tuple=True)[0] if full_rows is not None else
            torch.zeros(0, dtype=torch.long)).to(device)
    dot_u, dot_w = w0.new_zeros(len(cols)), w0.new_zeros(len(cols))
    full_u, full_w = w0.new_zeros(len(full), n), w0.new_zeros(len(full), n)
    sq_u, sq_w = w0.new_zeros(n), w0.new_zeros(n)
    # The pieces' buffers are made once: a fresh [n, POOL_BLOCK] tensor per piece is a fresh mapping of pages
    # that the kernel faults in one by one (3,000 clients: about a third of the time).
    u_buf = w0.new_empty(n, POOL_BLOCK)
    w_buf = w0.new_empty(n, POOL_BLOCK)
    sq_buf = w0.new_empty(n, POOL_BLOCK)
    for start, stop, got in blocks:   # column blocks of the exchange
        after, before = got["after"], got["before"]
        s = start
        while s < stop:   # pieces of the block, cut at multiples of POOL_BLOCK
            e = min(stop, (s // POOL_BLOCK + 1) * POOL_BLOCK)
            width = e - s   # contiguous [n, width] views of the buffers' first n·width numbers
            u = torch.sub(after[:, s - start:e - start], before[:, s - start:e - start],
                          out=u_buf.view(-1)[:n * width].view(n, width))
            w = torch.sub(after[:, s - start:e - start], w0[s:e], out=w_buf.view(-1)[:n * width].view(n, width))
            if len(cols):   # own rows as a view of the contiguous shard, not an indexed copy
                dot_u += torch.sparse.sampled_addmm(pattern, u[own], u.T, beta=0.0).values()
                dot_w += torch.sparse.sampled_addmm(pattern, w[own], w.T, beta=0.0).values()
            if len(full):
                full_u.addmm_(u[own_idx[full]], u.T)
                full_w.addmm_(w[own_idx[full]], w.T)
            sq = sq_buf.view(-1)[:n * width].view(n, width)
            sq_u += torch.mul(u, u, out=sq).sum(1)
            sq_w += torch.mul(w, w, out=sq).sum(1)
            s = e
    nu, nw = sq_u.sqrt().clamp_min(EPS), sq_w.sqrt().clamp_min(EPS)
    me = own_idx[rows]
    cos = (dot_u / (nu[me] * nu[cols])).mul_(alpha).add_(dot_w / (nw[me] * nw[cols]), alpha=1.0 - alpha)
    values = w0.new_full(idx.shape, math.nan)
    values[rows, _row_positions(rows, C)] = cos
    full_values = None
    if len(full):
        own_full = own_idx[full]
        full_values = (full_u / (nu[own_full][:, None] * nu[None, :])).mul_(alpha).add_(
            full_w / (nw[own_full][:, None] * nw[None, :]), alpha=1.0 - alpha)
    scores = PoolScores(idx, valid, values, None if full_values is None else full_values[0])
    return (scores, full, full_values) if keep_full else scores


def _pool_pattern(pool: torch.Tensor, n: int, w0: torch.Tensor):
    """``(idx, valid, cols, rows, pattern)`` of a ``[C, n]`` bool pool: its index lists (row by row, columns
    ascending: the CSR pattern's order), the entries' columns and rows, and the sparse CSR ``[C, n]`` pattern
    of ones (w0's dtype) that :func:`grad_pool_scores` samples its products on."""
    C = pool.shape[0]
    idx, valid = mask_indices(pool)
    counts = valid.sum(1)
    crow = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    cols = idx[valid]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # "sparse CSR support is in beta": the product is tested
        # built from the pool's indices (a dense [C, n] float copy of the mask would cost 4 bytes an entry)
        pattern = torch.sparse_csr_tensor(crow, cols, w0.new_ones(len(cols)), size=(C, n))
    rows = torch.repeat_interleave(torch.arange(C, device=crow.device), counts)
    return idx, valid, cols, rows, pattern


def padded_pools(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(peers [C, m], valid [C, m])`` of a ``[C, n]`` bool mask: row c's
    True columns in ascending order, padded to the longest row ``m`` with
    the row's first True column (or 0); ``valid`` marks the real entries."""
    idx, valid = mask_indices(mask)
    return _pad_with_first(idx, valid), valid


def _pad_with_first(idx: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``idx`` with each row's padding replaced by its first entry (a real peer, so every index is a model)."""
    return torch.where(valid, idx, idx[:, :1].expand_as(idx))


def loss_similarity(
    pair_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    all_after: torch.Tensor,
    cand_mask: torch.Tensor,
    chunk: int | None = None,
    pool_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """PANMLoss / PENS similarity, PANM paper Eq. 3: ``[C, n]``, :func:`loss_pool_scores`
    at the True entries of ``cand_mask`` and ``-inf`` (``NOT_COMPUTED``) elsewhere."""
    return loss_pool_scores(pair_loss, all_after, cand_mask, chunk, pool_loss).matrix(cand_mask.shape[1],
                                                                                     NOT_COMPUTED)


def loss_pool_scores(
    pair_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
    all_after: torch.Tensor,
    cand_mask: torch.Tensor,
    chunk: int | None = None,
    pool_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> PoolScores:
    """PANMLoss / PENS similarity, PANM paper Eq. 3, on the pools (:class:`PoolScores`).

    ``s_cj = 1 / F_c(w_j)`` for every True entry of ``cand_mask [C, n]``
    (float32; the padding holds ``-inf``).  The losses come
    from ``pool_loss(models [n, P], peers [C, m]) -> [C, m]`` when given
    (the engine's grouped path: client c's loss of ``models[peers[c, s]]``,
    rows padded by :func:`padded_pools`), else from
    ``pair_loss(models [M, P], local_index [M]) -> [M]``, the mean
    cross-entropy of each model on the training set of this rank's client
    ``local_index``, called on chunks of at most ``chunk`` pairs (default:
    as many as fit in ``PAIR_CHUNK_ELEMENTS`` weights).
    """
    idx, valid = mask_indices(cand_mask)
    values = torch.full(idx.shape, NOT_COMPUTED, dtype=torch.float32, device=cand_mask.device)
    scores = PoolScores(idx, valid, values)
    if not bool(valid.any()):
        return scores
    if pool_loss is not None:
        peers = _pad_with_first(idx, valid).to(all_after.device)   # as padded_pools: padding repeats a real peer
        loss = pool_loss(all_after, peers).to(device=values.device, dtype=torch.float32)
        values[valid] = 1.0 / loss[valid].clamp_min(LOSS_FLOOR)   # padding never written
        return scores
    if pair_loss is None:
        raise ValueError("loss_similarity needs pair_loss or pool_loss")
    if chunk is None:
        chunk = max(1, PAIR_CHUNK_ELEMENTS // max(1, all_after.shape[1]))
    rows, cols = cand_mask.nonzero(as_tuple=True)
    losses = []
    for start in range(0, rows.numel(), chunk):  # chunks of pairs, bounded memory
        r, c = rows[start:start + chunk], cols[start:start + chunk]
        losses.append(pair_loss(all_after[c.to(all_after.device)], r).reshape(-1).to(values.device))
    loss = torch.cat(losses).to(torch.float32)
    values[rows, _row_positions(rows, idx.shape[0])] = 1.0 / loss.clamp_min(LOSS_FLOOR)
    return scores


def loss_em_input(similarity: torch.Tensor, em_input: str) -> torch.Tensor:
    """HNM's EM input from loss similarities ``s = 1/F`` (``panm.em_input``).

    ``"inverse"``: ``s`` itself (PANM paper's literal ``1/F``).
    ``"neg_loss"``: ``-F = -1/s``, the negative loss (the default, docs/algorithms.md): on
    ``1/F`` the same-cluster values spread widely (a peer almost equal to
    oneself has a tiny loss and a huge ``1/F``) and EM splits them; on ``-F``
    they stay together.  Both orders are the same, so only the EM differs.
    Entries not computed stay :data:`NOT_COMPUTED`.
    """
    if em_input == "inverse":
        return similarity
    if em_input != "neg_loss":
        raise ValueError(f"em_input must be 'neg_loss' or 'inverse', not {em_input!r}")
    computed = similarity != NOT_COMPUTED
    return torch.where(computed, -1.0 / torch.where(computed, similarity, torch.ones_like(similarity)), similarity)


# ----------------------------------------------------------------------------
# Used by PANM and PENS


def similarity_for(metric: str, alpha: float, ctx, view, pool: torch.Tensor) -> PoolScores:
    """The similarity of this rank's clients to the peers in ``pool``
    (:class:`PoolScores`; PANMGrad also gives client 0's whole row)."""
    if metric == "loss":
        pair_loss = ctx.pair_loss if loss_given(ctx.pair_loss) else None
        pool_loss = ctx.pool_loss if loss_given(ctx.pool_loss) else None
        if pair_loss is None and pool_loss is None:
            raise ValueError("loss similarity needs ctx.pool_loss or ctx.pair_loss (the engine's loss of peer "
                             "models on own data)")
        return loss_pool_scores(pair_loss, view.all_after, pool, pool_loss=pool_loss)
    if view.whole and view.all_before is None:
        raise ValueError("grad similarity needs view.all_before: the algorithm must set gathers_before=True")
    w0 = ctx.w0.to(view.after.device)
    client0 = ctx.client_ids == 0
    if view.whole and ctx.n < POOL_SIMILARITY_MIN_CLIENTS:   # one dense product: faster for few clients
        sim = grad_similarity(view.all_after, view.all_before, w0, alpha, own=ctx.own_rows)
        at = client0.nonzero().flatten()
        return PoolScores.from_matrix(sim, pool.to(sim.device), sim[int(at[0])] if len(at) else None)
    return grad_pool_scores(view.blocks(("after", "before")), ctx.n, w0, alpha, pool, own=ctx.own_rows,
                            full_rows=client0)


def pool_similarity(scores: PoolScores) -> torch.Tensor:
    """What the state keeps of a round's similarities: ``[C, m]`` float32,
    row c's values at its pool's columns in increasing order, NaN in the
    padding.  C·m numbers, not C·n."""
    return scores.values.to(torch.float32).masked_fill(~scores.valid, math.nan)


def similarity_matrix(pool: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``[C, n]`` float32 of :func:`pool_similarity`'s values: the similarity
    where it was computed (the pool), NaN elsewhere (to inspect and test)."""
    idx, valid = mask_indices(pool)
    return PoolScores(idx, valid, values[:, :idx.shape[1]].to(torch.float32)).matrix(pool.shape[1])


def client0_similarity(scores: PoolScores, client_ids: torch.Tensor, n: int) -> torch.Tensor | None:
    """Client 0's similarities for the figure (``[n]`` float32, NaN where not
    computed and on client 0 itself) on the rank that holds client 0, None on
    the others: its whole row where the similarity computed it (PANMGrad),
    else its pool."""
    at = (client_ids == 0).nonzero().flatten()
    if len(at) == 0:
        return None
    if scores.row0 is not None:
        row = scores.row0.to(torch.float32).clone()
    else:
        c = int(at[0])
        keep = scores.valid[c]
        row = torch.full((n,), math.nan, dtype=torch.float32, device=scores.values.device)
        row[scores.idx[c][keep]] = scores.values[c][keep].to(torch.float32)
    row[0] = math.nan
    return row


def drop_last_similarity(clients: dict, server: dict) -> None:
    """A checkpoint's PANM or PENS state in today's form: they kept the last round's ``[n, n]`` float32
    similarities (``last_similarity``); now the pool's, per round, never saved (:meth:`Algorithm.upgrade_state`)."""
    clients.pop("last_similarity", None)
    server.pop("last_similarity", None)
