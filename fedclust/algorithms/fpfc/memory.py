"""What an FPFC run holds, and the check, before anything starts, that it
fits the machine (:meth:`fedclust.algorithms.fpfc.Fpfc.check_run`)."""

from __future__ import annotations

from fedclust.algorithms.base import RunFacts
from fedclust.algorithms.fpfc.compact import diametric_pairs, pairwise_state_bytes, row_slots
from fedclust.algorithms.fpfc.head import fused_columns
from fedclust.algorithms.fpfc.pairs import n_pairs, pair_chunk
from fedclust.errors import ConfigError
from fedclust.sizes import CHECKPOINT_BLOCK_BYTES


def checkpoint_gather_bytes(n: int, P: int, world: int) -> int:
    """Bytes a checkpoint adds to a run on several ranks: the runner collects
    client rows on rank 0's host (``LoopState.state_dict``), every client's θ
    rows, in column blocks of at most ``CHECKPOINT_BLOCK_BYTES`` that every
    rank receives in turn (twice that when the shards differ in size and are
    trimmed).  One process gathers nothing."""
    if world <= 1:
        return 0
    return n * row_slots(n) * int(P) * 4 + 2 * CHECKPOINT_BLOCK_BYTES


def fpfc_memory_need(n: int, P: int, ranks_sharing: int = 1, world: int = 1, fused: int | None = None) -> int:
    """Bytes FPFC holds on one memory shared by ``ranks_sharing`` ranks of a
    run on ``world`` ranks (at least ``ranks_sharing``), float32: on each, its
    pairwise state (:func:`pairwise_state_bytes`), ω before and after the
    round and the bounds' ``ω − mean`` ``[n, P]``, its clients' ζ, the
    float64 ζ buffer ``[n, P]``, a chunk's buffers (8 of ``chunk × P``, for
    the few float32 ones and the float64 terms); and once, the checkpoint's
    collection on rank 0 (:func:`checkpoint_gather_bytes`).  ``fused``: the
    columns the pairs fuse (``fpfc.fuse=head``: the head's; None: all P),
    the width of θ, ζ and their buffers; a head-only run also builds its
    clients' ``[C, P]`` proximal centre and the fused columns of ω."""
    n, P, world = int(n), int(P), max(int(world), int(ranks_sharing), 1)
    F = P if fused is None else int(fused)
    clients = -(-n // world)
    pairs = clients * row_slots(n) + diametric_pairs(n)
    per_rank = (pairwise_state_bytes(n, F, world) + 3 * n * P * 4 + clients * F * 4
                + n * F * 8 + 16 * n * row_slots(n) + 8 * min(pair_chunk(F, None), max(pairs, 1)) * F * 4)
    if F != P:
        per_rank += clients * P * 4 + n * F * 4   # the [C, P] centre; the fused columns of ω, contiguous
    return per_rank * int(ranks_sharing) + checkpoint_gather_bytes(n, F, world)


def check_fpfc_memory(cfg, facts: RunFacts, available: tuple[int, str] | None = None) -> None:
    """Refuse an FPFC run whose pairwise state would not fit (ConfigError on
    ``clients`` naming the numbers and the largest client count that fits)."""
    n, P = cfg.clients, facts.layout.numel
    first = fused_columns(cfg, facts.layout)[1]
    free, where = available or facts.free_memory()
    world, sharing = facts.world, 1
    if where.startswith("host"):
        sharing = facts.ranks_per_node   # ranks on this node share its RAM
    need = fpfc_memory_need(n, P, sharing, world, P - first)
    if need <= free:
        return
    # the largest count that fits (the need is not monotonic: shards of unequal size cost a copy at checkpoints)
    fits = next((k for k in range(n - 1, 1, -1) if fpfc_memory_need(k, P, sharing, world, P - first) <= free), 1)
    gib = 2.0**30
    ranks = f", {world} ranks" + (f", {sharing} on this memory" if sharing > 1 else "") if world > 1 else ""
    raise ConfigError(
        "clients", n,
        f"FPFC keeps theta and one number per client pair, n(n-1)/2 = {n_pairs(n)} pairs split between the ranks: "
        f"{need / gib:.2f} GiB (n = {n}, P = {P} parameters, float32{ranks}) but only {free / gib:.2f} GiB are "
        f"free in {where}; use at most {fits} clients, a smaller model, more ranks or a machine with more memory")

