"""Several models per client or per cluster, shared by the methods that keep
them (IFCA's K cluster models on the server; DFCA's k models and Facade's k
heads on every client): their common initialisations, the loss of each on a
client's training set, the choice of the model of lowest loss, the merge of
the copies peers send, and a round's result and best-of-k accuracy.

Shapes: models ``[K, P]`` (or ``[C, K, P]``, one bank per client), losses
``[C, K]``, choices int64 ``[C]``.
"""

from __future__ import annotations

from typing import Callable

import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundResult
from fedclust.network import keep_peers
from fedclust.peers import PeerIndex

INIT_STREAM = "ifca_init"   # rng stream of IFCA's cluster models' init seeds (DFCA names its own)


def assign_clusters(losses: torch.Tensor) -> torch.Tensor:
    """Cluster identity estimate ``ĵ_i = argmin_j F_i(θ_j)`` → int64 ``[C]``
    (IFCA paper Algorithm 1, "cluster identity estimation").

    ``losses[i, j]`` is client i's mean training loss under cluster model j.
    Ties go to the lowest index; a NaN loss counts as +inf (a diverged model
    is never preferred; if a whole row is NaN the client takes cluster 0).
    """
    if losses.dim() != 2 or losses.shape[1] == 0:
        raise ValueError(f"losses must be [C, K] with K >= 1, got shape {tuple(losses.shape)}")
    clean = torch.nan_to_num(losses, nan=float("inf"))
    return torch.argmin(clean, dim=1)   # torch returns the first minimum: lowest index on ties


def cluster_inits(w0: torch.Tensor, K: int, seed: int, init, restart: int = 0,
                  stream: str = INIT_STREAM) -> torch.Tensor:
    """``[K, P]`` initial cluster models of restart ``restart``: for restart 0
    ``w0``, then the default init under the seeds
    ``rng.hash_ints(seed, 0, stream, k, 0)``, k = 1..K-1; for restart
    r > 0 all K under ``rng.hash_ints(seed, r, stream, k, 0)``, k = 0..K-1
    (keyed on (seed, restart), the same on every rank).  Each is
    ``init(seed)``, the model's default init (:attr:`RunFacts.init`, as
    ``w0`` is built under the run's seed), so the K inits are independent
    draws of the same distribution and the run is a function of the seed alone."""
    rows = [w0.detach()] if restart == 0 else []
    for k in range(1 if restart == 0 else 0, K):   # K model builds, once per restart
        s = int(rng.hash_ints(seed, restart, stream, torch.tensor(k), 0))
        w = init(s).to(w0)
        if w.shape != w0.shape:
            raise ValueError(f"cluster init has {w.numel()} parameters but w0 has {w0.numel()}; "
                             "init must build the run's model")
        rows.append(w)
    return torch.stack(rows)


def loss_matrix(ctx: Context, models: torch.Tensor) -> torch.Tensor:
    """``[C, K]``: mean training loss of cluster model k on this rank's
    client c (``ctx.pair_loss``, one vectorized call per cluster)."""
    C = len(ctx.client_ids)
    local = torch.arange(C, device=models.device)
    return torch.stack([ctx.pair_loss(models[k].expand(C, -1), local) for k in range(models.shape[0])], dim=1)


def bank_losses(ctx: Context, bank: torch.Tensor) -> torch.Tensor:
    """``[C, K]``: mean training loss of model k of each client's own bank
    (``bank [C, K, P]``) on that client's training set (``ctx.pair_loss``,
    one vectorized call per k)."""
    C = bank.shape[0]
    local = torch.arange(C, device=bank.device)
    return torch.stack([ctx.pair_loss(bank[:, k], local) for k in range(bank.shape[1])], dim=1)


MERGE_CHUNK = 2**24   # numbers of a merge's temporary sums ([C, columns]) at once


def merge_copies(bank: torch.Tensor, partners, labels: torch.Tensor, view, columns=None,
                 inplace: bool = False) -> torch.Tensor:
    """Each client's copy c (``bank [C, k, H]``) made the mean of itself and every copy received from a partner
    whose ``labels[j]`` is c: ``(bank[i, c] + Σ_{j ∈ partners_i, labels_j = c} w_j) / (1 + that count)``, a copy
    nobody sent unchanged.  ``w_j`` is partner j's gathered model (``view``, read a column block at a time) at
    the flat ``columns`` (``(start, stop)`` ranges in order, their widths summing to H; None: all P).  Each
    column's sum is in partner order, so any block (and any chunk of :data:`MERGE_CHUNK` numbers) gives the same
    bits.  ``inplace``: into ``bank`` itself.
    DFCA's merge of whole models, Facade's of heads."""
    ranges = tuple(columns) if columns is not None else ((0, view.width),)
    bases, width = [], 0
    for a, b in ranges:
        bases.append(width)
        width += b - a
    if width != bank.shape[2]:
        raise ValueError(f"merge_copies: the columns hold {width} numbers but the bank's copies {bank.shape[2]}")
    idx, valid = partners.idx.to(bank.device), partners.valid.to(bank.device)
    lab = labels.to(bank.device)[idx]
    out = bank if inplace else bank.clone()
    picks = []
    for c in range(bank.shape[1]):
        sel = valid & (lab == c)
        count = sel.sum(1)
        if bool(count.any()):
            picks.append((c, idx[sel], count.cumsum(0) - count, count))
    step = max(1, MERGE_CHUNK // max(bank.shape[0], 1))   # columns merged at once: a [C, step] temporary
    for start, stop, cols in view.blocks(("after",)):   # column blocks: one gather each
        models = cols["after"]
        for (a, b), base in zip(ranges, bases):
            for lo in range(max(a, start), min(b, stop), step):
                hi = min(lo + step, b, stop)
                part = models[:, lo - start:hi - start]
                at = slice(base + lo - a, base + hi - a)
                for c, bags, offsets, count in picks:
                    sums = torch.nn.functional.embedding_bag(bags, part, offsets, mode="sum")
                    out[:, c, at] = sums.add_(bank[:, c, at]).div_((1 + count).to(bank.dtype)[:, None])
    return out


def chosen_model_result(models: torch.Tensor, peers: PeerIndex, labels: torch.Tensor,
                        mine: torch.Tensor) -> RoundResult:
    """The round's result of a peer method whose clients keep k models and each choose one (DFCA, Facade):
    ``models [C, P]`` held, the ``peers`` averaged with (index lists), every client's choice ``labels [n]`` as
    the assignment, and as neighbour lists the peers that chose as the client did (``mine [C]``, its choice)."""
    same = peers.valid & (labels[peers.idx] == mine[:, None])
    return RoundResult(
        models=models,
        lists=keep_peers(peers, same),
        averaged=peers,
        assignment=labels,
        received=peers.counts(),
    )


def best_of_k(accuracy: torch.Tensor, bank: torch.Tensor, data, score,
              model: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """``[C]`` each client's best test accuracy over its k models (an oracle figure: it picks by the test set):
    ``accuracy [C]``, that of the model it holds; ``bank [C, k, ...]``, what it keeps; ``model(j)`` its model j
    ``[C, P]``; ``score`` as :meth:`fedclust.algorithms.base.Algorithm.extra_accuracy` gives it."""
    best = accuracy.clone()
    C = bank.shape[0]
    for j in range(bank.shape[1]):   # k evaluations of every client's test set
        acc = score(model(j), data.test_x, data.test_y, data.test_counts)[0].to(best.dtype)
        best = torch.maximum(best, acc[:C])
    return best
