"""PENS, Performance-Based Neighbour Selection (Onoszko et al., PANM paper
[29] and §2; docs/algorithms.md), as the peer algorithm ``pens``.

Stage one (rounds 1..T1): each round client i draws l candidates uniformly
from the others (fresh each round, PANM paper Eq. 7), averages with the
top k by loss similarity ``1 / F_i(w_j)`` and counts how often each peer was
chosen.  After T1 the peers chosen more than a threshold number of times
form the fixed list; each later round averages with k drawn uniformly from
it (all if fewer; ``pens.stage2_neighbours`` changes that k).

What counts and the threshold (``pens.count``):

- ``reference`` (default, docs/algorithms.md): as the PENS reference code counts
  (``train_edu`` in its ``train_functions.py``, client_clustering_method
  "above_average"): the times j was in i's top k (its ``neighbours_history``
  of stage one), and j is kept when that count is strictly above
  ``k·T1/(n−1) − 1``, k and T1 those of stage one, n all clients: the
  expected count of a peer under random choice, less one.  With k = 5,
  T1 = 100, n = 100 that is 4.05, so 5 picks keep a peer.  No list comes
  out empty: the most-picked peer has at least the mean count k·T1/(n−1).
  The reference looks only at peers picked at least once (its ``Counter``),
  so when k·T1 < n−1 every peer ever picked is kept.
- ``selected``: the same counts against ``ceil(T1·(l+k)/n)``, the
  threshold PANM paper §4.2 quotes for "the expected amount of times".
  Under random choice a peer is picked T1·k/n times on average, so with
  l = 10, k = 5, n = 100, T1 = 100 a same-cluster peer (drawn about 10
  times, picked about as often) stays below 15 and lists come out short or
  empty.
- ``drawn_and_selected``: the times j was drawn as a candidate plus the
  times it was selected, against ``ceil(T1·(l+k)/n)``: its mean under random
  choice is exactly T1·(l+k)/n, the quoted formula.

A list that comes out empty (``pens.empty_list``): ``last_topk`` (default,
not in the papers) keeps the last stage-one top k as the list, so the client
does not fall silent; ``alone`` leaves it empty and the client trains alone,
as the reference code does (it draws min(20, |list|) = 0 peers).
``PensState.fell_back`` marks the clients whose list came out empty.

Where the reference code differs otherwise (not options here): it ranks by
client i's *own* model on candidate j's training data (``F_j(w_i)``; fedclust:
``F_i(w_j)``), its metric defaults to accuracy (``1/(loss + 1e-5)`` when
asked for loss), and within a round its clients, one after another, average
with the others' current models and then train (fedclust: all train, then all
average, synchronously).  Stage two there averages with 20 list members
(``pens.stage2_neighbours=20``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from fedclust import rng
from fedclust.algorithms.base import Context, PeerAlgorithm, RoundView, client_rows
from fedclust.algorithms.cni import draw_candidates, top_k_in_mask
from fedclust.algorithms.registry import register
from fedclust.algorithms.similarity import recorded_similarity, similarity_for
from fedclust.errors import ConfigError
from fedclust.schema import one_of, option

PENS_COUNTS = ("reference", "selected", "drawn_and_selected")
PENS_EMPTY_LISTS = ("last_topk", "alone")


@dataclass
class PensConfig:
    """The ``pens`` section."""

    # What counts as "chosen" in stage one and how often a peer must be chosen to join the fixed list:
    # "reference": times a peer was in the top k, kept when above k*T1/(n-1) - 1, as the PENS reference
    #   code (Karlsson & Onoszko) counts (docs/algorithms.md);
    # "selected": the same counts against ceil(T1*(l+k)/n), the threshold PANM paper §4.2 quotes;
    # "drawn_and_selected": times drawn as a candidate plus times selected, against ceil(T1*(l+k)/n),
    #   whose expectation under random choice is exactly T1*(l+k)/n.
    count: str = option("reference", "what counts toward the fixed list: reference (top-k picks above "
                                      "k*T1/(n-1) - 1), selected or drawn_and_selected (above ceil(T1*(l+k)/n))")
    # A fixed list that comes out empty: "last_topk" keeps the last stage-one top k (not in the papers);
    # "alone": stays empty and the client trains alone, as the reference code does.
    empty_list: str = option("last_topk", "what an empty fixed list becomes: last_topk (the last stage-one top "
                                          "k) or alone (no peers, as the reference code)")
    # Peers drawn from the fixed list each stage-two round; 0 means algorithm.k (docs/algorithms.md).  The reference
    # code draws 20 (all of the list if shorter).
    stage2_neighbours: int = option(0, "peers drawn from the fixed list each stage-two round, in [0, clients - 1]; "
                                       "0: algorithm.k (the reference code: 20)")

    def validate(self, cfg) -> None:
        clients = cfg.clients
        one_of("pens.count", self.count, PENS_COUNTS, "what counts toward PENS's threshold: reference = top-k "
               "picks above k*T1/(n-1) - 1, the default; selected and drawn_and_selected use ceil(T1*(l+k)/n)")
        one_of("pens.empty_list", self.empty_list, PENS_EMPTY_LISTS, "what an empty fixed list becomes: the last "
               "stage-one top k, or no peers at all")
        if not 0 <= self.stage2_neighbours <= clients - 1:
            raise ConfigError("pens.stage2_neighbours", self.stage2_neighbours,
                              f"must lie in [0, clients - 1 = {clients - 1}]: peers drawn from the fixed list each "
                              "stage-two round; 0 uses algorithm.k (the reference code draws 20)")


@dataclass
class PensState:
    """Rows are ``ctx.client_ids``."""

    counts: torch.Tensor = client_rows()           # [C, n] int64: times each peer was chosen in stage one
    last_topk: torch.Tensor = client_rows()        # [C, n] bool: the top k of the last stage-one round
    fixed: torch.Tensor = client_rows()            # [C, n] bool: the stage-two list (empty until it is formed)
    fell_back: torch.Tensor = client_rows()        # [C] bool: fixed list came out empty
    last_similarity: torch.Tensor = client_rows()  # [C, n] float32: last computed s_ij, NaN where not computed
    formed: bool = False                           # whether ``fixed`` has been formed (first stage-two round)
    similarity_round: int = 0                      # round of last_similarity (0: none yet)


def pens_threshold(stage1_rounds: int, l: int, k: int, n: int) -> int:
    """``ceil(T1·(l+k)/n)``, in exact integer arithmetic (PANM paper §4.2)."""
    return -(-stage1_rounds * (l + k) // n)


def pens_reference_threshold(stage1_rounds: int, k: int, n: int) -> int:
    """The reference code's cut-off ``k·T1/(n−1) − 1`` as an integer threshold:
    for a whole count c, ``c > k·T1/(n−1) − 1`` exactly when
    ``c > floor(k·T1/(n−1)) − 1``, computed here without floating point.  The
    reference only looks at peers picked at least once (the keys of its
    ``Counter``), so the threshold is at least 0 (when k·T1 < n−1 every peer
    ever picked is kept, never one that was not)."""
    return max(stage1_rounds * k // (n - 1) - 1, 0)


def count_threshold(count: str, stage1_rounds: int, l: int, k: int, n: int) -> int:
    """The integer a peer's stage-one count must exceed under ``pens.count``."""
    if count == "reference":
        return pens_reference_threshold(stage1_rounds, k, n)
    return pens_threshold(stage1_rounds, l, k, n)


def fixed_list(counts: torch.Tensor, last_topk: torch.Tensor, threshold: int,
               empty_list: str = "last_topk") -> tuple[torch.Tensor, torch.Tensor]:
    """``(list [C, n], empty [C])``: peers chosen more than ``threshold``
    times; a row with none falls back to its last top k (``last_topk``) or
    stays empty (``alone``)."""
    chosen = counts > threshold
    empty = ~chosen.any(1)
    if empty_list == "alone":
        return chosen, empty
    return torch.where(empty[:, None], last_topk, chosen), empty


@register
@dataclass
class PENS(PeerAlgorithm):
    k: int
    l: int
    stage1_rounds: int
    count: str = "reference"       # "reference" | "selected" | "drawn_and_selected" (module docstring)
    empty_list: str = "last_topk"  # "last_topk" | "alone": what an empty fixed list becomes
    stage2_neighbours: int = 0     # peers drawn from the list each stage-two round; 0: k

    name = "pens"
    report_position = 4
    needs_k = needs_l = needs_stages = keeps_k_of_l = True
    stage_one_figures = True
    sections = {"pens": PensConfig}
    paper_results = {("fmnist", "rotation", 2): (86.82, 0.11)}

    @classmethod
    def from_config(cls, cfg) -> "PENS":
        """PENS with cfg.algorithm.k, .l, cfg.stage1_rounds and the cfg.pens section."""
        a, p = cfg.algorithm, cfg.pens
        return cls(k=a.k, l=a.l, stage1_rounds=cfg.stage1_rounds, count=p.count, empty_list=p.empty_list,
                   stage2_neighbours=p.stage2_neighbours)

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
            threshold = count_threshold(self.count, self.stage1_rounds, self.l, self.k, ctx.n)
            fixed, fell_back = fixed_list(state.counts, state.last_topk, threshold, self.empty_list)
            state = dataclasses.replace(state, fixed=fixed, fell_back=fell_back, formed=True)
        draw = self.stage2_neighbours or self.k
        return state, rng.choose_from_mask(ctx.seed, t, "pens", ctx.client_ids, state.fixed, draw)

    def contacted(self, state: PensState, round_: int) -> torch.Tensor:
        """Stage one fetches the l candidates' models to rank them; stage two none beyond the averaged."""
        if state.similarity_round != round_:
            return torch.zeros_like(state.counts, dtype=torch.bool)
        return ~torch.isnan(state.last_similarity)

    def neighbor_list(self, state: PensState, averaged: torch.Tensor) -> torch.Tensor:
        """Stage one: this round's top k; stage two: the fixed list."""
        return state.fixed if state.formed else state.last_topk
