"""PENS, Performance-Based Neighbour Selection (Onoszko et al., papers/001
[29] and §2; SPEC §4), as the peer algorithm ``pens``.

Stage one (rounds 1..T1): each round client i draws l candidates uniformly
from the others (fresh each round, papers/001 Eq. 7), averages with the
top k by loss similarity ``1 / F_i(w_j)`` and counts how often each peer was
chosen.  After T1 the peers chosen more than ``ceil(T1·(l+k)/n)`` times
("the expected amount of times", papers/001 §4.2) form the fixed list; each
later round averages with k drawn uniformly from it (all if fewer).

What counts as "chosen" (``pens.count``):

- ``selected`` (default, SPEC §4 as written): the times j was in i's top k.
  Under random choice that is T1·k/n on average, so a threshold of
  T1·(l+k)/n is passed only by peers picked far more often than chance: with
  l = 10, k = 5, n = 100, T1 = 100 a same-cluster peer is drawn about 10
  times and picked about as often, below the threshold 15, and the lists
  come out short.
- ``drawn_and_selected``: the times j was drawn as a candidate plus the times
  it was selected; its mean under random choice is exactly T1·l/n + T1·k/n =
  T1·(l+k)/n, the threshold's formula, so "more than expected" separates
  same-cluster peers (about 20) from the others (about 10).

Fallback (not in the papers): a client whose fixed list comes out empty
keeps its last stage-one top-k as the list, so it does not fall silent;
``PensState.fell_back`` marks those clients.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.cni import draw_candidates, top_k_in_mask
from fedclust.algorithms.panm import check_peer_config, recorded_similarity, similarity_for


@dataclass
class PensState:
    """Per-rank state; rows are ``ctx.client_ids``."""

    counts: torch.Tensor           # [C, n] int64: times each peer was chosen during stage one (see pens.count)
    last_topk: torch.Tensor        # [C, n] bool: the top k of the last stage-one round
    fixed: torch.Tensor            # [C, n] bool: the stage-two list (empty until it is formed)
    formed: bool                   # whether ``fixed`` has been formed (first stage-two round)
    fell_back: torch.Tensor        # [C] bool: fixed list was empty, last top k used instead
    last_similarity: torch.Tensor  # [C, n] float32: last computed s_ij, NaN where not computed
    similarity_round: int          # round of last_similarity (0: none yet)


def pens_threshold(stage1_rounds: int, l: int, k: int, n: int) -> int:
    """``ceil(T1·(l+k)/n)``, in exact integer arithmetic (papers/001 §4.2)."""
    return -(-stage1_rounds * (l + k) // n)


def fixed_list(counts: torch.Tensor, last_topk: torch.Tensor, threshold: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(list [C, n], fell_back [C])``: peers chosen more than ``threshold``
    times; a row with none falls back to its last top k."""
    chosen = counts > threshold
    empty = ~chosen.any(1)
    return torch.where(empty[:, None], last_topk, chosen), empty


@dataclass
class PENS:
    k: int
    l: int
    stage1_rounds: int
    count: str = "selected"        # "selected" | "drawn_and_selected" (module docstring)
    name: str = "pens"
    gathers_before: bool = False

    def init(self, ctx: Context) -> PensState:
        C, n, dev = len(ctx.client_ids), ctx.n, ctx.device
        no = torch.zeros(C, n, dtype=torch.bool, device=dev)
        return PensState(
            counts=torch.zeros(C, n, dtype=torch.int64, device=dev), last_topk=no, fixed=no.clone(), formed=False,
            fell_back=torch.zeros(C, dtype=torch.bool, device=dev),
            last_similarity=torch.full((C, n), math.nan, dtype=torch.float32, device=dev), similarity_round=0)

    def select(self, state: PensState, ctx: Context, view: RoundView) -> tuple[PensState, torch.Tensor]:
        t = view.round
        if t <= self.stage1_rounds:
            cand = draw_candidates(ctx.seed, t, ctx.client_ids, ctx.self_mask, self.l)
            sim = similarity_for("loss", 0.0, ctx, view, cand)
            top = top_k_in_mask(sim, cand, self.k)
            chosen = top.to(torch.int64)
            if self.count == "drawn_and_selected":
                chosen = chosen + cand.to(torch.int64)
            new = dataclasses.replace(
                state, counts=state.counts + chosen, last_topk=top, similarity_round=t,
                last_similarity=recorded_similarity(sim, cand, ctx.self_mask, full=False))
            return new, top
        if not state.formed:
            fixed, fell_back = fixed_list(state.counts, state.last_topk,
                                          pens_threshold(self.stage1_rounds, self.l, self.k, ctx.n))
            state = dataclasses.replace(state, fixed=fixed, fell_back=fell_back, formed=True)
        return state, rng.choose_from_mask(ctx.seed, t, "pens", ctx.client_ids, state.fixed, self.k)

    def contacted(self, state: PensState, round_: int) -> torch.Tensor:
        """Stage one fetches the l candidates' models to rank them; stage two none beyond the averaged."""
        if state.similarity_round != round_:
            return torch.zeros_like(state.counts, dtype=torch.bool)
        return ~torch.isnan(state.last_similarity)

    def neighbor_list(self, state: PensState, averaged: torch.Tensor) -> torch.Tensor:
        """Stage one: this round's top k; stage two: the fixed list."""
        return state.fixed if state.formed else state.last_topk


def make_pens(cfg) -> PENS:
    """PENS with cfg.algorithm.k, .l, cfg.stage1_rounds and cfg.pens.count."""
    from fedclust.config_methods import check_pens_count

    a = cfg.algorithm
    check_peer_config("pens", a.k, a.l, cfg.stage1_rounds)
    check_pens_count(cfg.pens.count)
    return PENS(k=a.k, l=a.l, stage1_rounds=cfg.stage1_rounds, count=cfg.pens.count)
