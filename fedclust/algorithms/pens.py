"""PENS, Performance-Based Neighbour Selection (Onoszko et al., ICML 2021
FL workshop, arXiv 2107.08517; PANM paper §2 and Eq. 7), as the peer
algorithm ``pens``: in stage one each client averages with the top k of l
fresh candidates by loss similarity and counts whom it picks; after T1 the
peers picked often enough form a fixed list it draws from.  What fedclust
runs, what counts (``pens.count``), and where the reference code differs:
docs/algorithms.md, "PENS".

Paper: N. Onoszko, G. Karlsson, O. Mogren, E. Listo Zec, "Decentralized federated learning of deep
neural networks on non-iid data", ICML 2021 FL workshop, https://arxiv.org/abs/2107.08517
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Literal

import torch

from fedclust.algorithms.base import Choice, Context, PeerAlgorithm, RoundView, client_rows, round_only
from fedclust.algorithms.cni import draw_candidates, top_k_of_pool
from fedclust.algorithms.peer_counts import add_mask, counted_more_than, empty_counts, from_matrix
from fedclust.algorithms.registry import register
from fedclust.algorithms.similarity import (
    client0_similarity,
    drop_last_similarity,
    pool_similarity,
    similarity_for,
)
from fedclust.errors import ConfigError
from fedclust.network import answering, both
from fedclust.peers import PeerIndex
from fedclust.schema import option

PensCount = Literal["reference", "selected", "drawn_and_selected"]
PensEmptyList = Literal["last_topk", "alone"]
PENS_COUNTS = typing.get_args(PensCount)
PENS_EMPTY_LISTS = typing.get_args(PensEmptyList)


@dataclass
class PensConfig:
    """The ``pens`` section (what each value means and why: docs/algorithms.md, PENS)."""

    count: PensCount = option("reference", "what counts toward the fixed list: reference (top-k picks above "
                                      "k*T1/(n-1) - 1), selected or drawn_and_selected (above ceil(T1*(l+k)/n))",
        doc=("what counts toward PENS's fixed list: `reference` (top-`k` picks above `k·T1/(n−1) − 1`, "
            "as the PENS reference code), `selected` (picks above `ceil(T1·(l+k)/n)`, PANM paper's "
            "text) or `drawn_and_selected` (draws plus picks above `ceil(T1·(l+k)/n)`)"))
    empty_list: PensEmptyList = option("last_topk", "what an empty fixed list becomes: last_topk (the last "
                                                    "stage-one top k) or alone (no peers, as the reference code)",
        doc=("what an empty PENS list becomes: the last stage-one top-`k`, or `alone` (no peers, as the "
            "reference code)"))
    stage2_neighbours: int = option(0, "peers drawn from the fixed list each stage-two round, in [0, clients - 1]; "
                                       "0: algorithm.k (the reference code: 20)",
        doc=("peers PENS draws from its list each stage-two round, in [0, `clients − 1`]; 0 means "
            "`algorithm.k` (the reference code: 20)"))

    def validate(self, cfg) -> None:
        clients = cfg.clients
        if not 0 <= self.stage2_neighbours <= clients - 1:
            raise ConfigError("pens.stage2_neighbours", self.stage2_neighbours,
                              f"must lie in [0, clients - 1 = {clients - 1}]: peers drawn from the fixed list each "
                              "stage-two round; 0 uses algorithm.k (the reference code draws 20)")


@dataclass
class PensState:
    """Rows are ``ctx.client_ids``."""

    # Times each peer was chosen in stage one, as lists (fedclust.algorithms.peer_counts), count_width slots:
    count_peers: torch.Tensor = client_rows()      # [C, w] int64 peers, ascending, -1 padding
    counts: torch.Tensor = client_rows()           # [C, w] int32 their counts
    last_topk: torch.Tensor = client_rows()        # [C, n] bool: the top k of the last stage-one round
    fixed: torch.Tensor = client_rows()            # [C, n] bool: the stage-two list (empty until it is formed)
    fell_back: torch.Tensor = client_rows()        # [C] bool: the fixed list came out empty (pens.empty_list)
    formed: bool = False                           # whether ``fixed`` has been formed (first stage-two round)
    similarity_round: int = 0                      # round of the last similarities (0: none yet)
    # The round's similarities, read in that round only (traffic and the stage-one figure):
    pool: torch.Tensor | None = round_only(default=None)           # [C, n] bool: the candidates ranked
    similarity: torch.Tensor | None = round_only(default=None)     # [C, m] float32 s_ij on them (pool_similarity)
    similarity_client0: torch.Tensor | None = round_only(default=None)   # [n] float32 on client 0's rank (figure)


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


def fixed_list(chosen: torch.Tensor, last_topk: torch.Tensor,
               empty_list: str = "last_topk") -> tuple[torch.Tensor, torch.Tensor]:
    """``(list [C, n], empty [C])``: the peers ``chosen`` (bool ``[C, n]``,
    those counted more than the threshold); a row with none falls back to
    its last top k (``last_topk``, so the client does not fall silent) or
    stays empty (``alone``: the client trains alone, as the reference code)."""
    empty = ~chosen.any(1)
    if empty_list == "alone":
        return chosen, empty
    return torch.where(empty[:, None], last_topk, chosen), empty


@register
@dataclass
class PENS(PeerAlgorithm):
    """PENS's round (docs/algorithms.md, "PENS"): stage one picks and counts,
    the first stage-two round forms the fixed list, stage two draws from it."""

    k: int                 # algorithm.k: peers averaged with (stage one: the top k)
    l: int                 # algorithm.l: candidates drawn per stage-one round
    stage1_rounds: int     # T1
    pens: PensConfig = field(default_factory=PensConfig)

    # column_exchange stays False: it ranks peers by the loss of their whole models on its own data
    name = "pens"
    report_position = 4
    needs_k = needs_l = needs_stages = keeps_k_of_l = True
    stage_one_figures = True
    sections = {"pens": PensConfig}
    paper_results = {("fmnist", "rotation", 2): (86.82, 0.11)}

    @classmethod
    def from_config(cls, cfg) -> "PENS":
        a = cfg.algorithm
        return cls(a.k, a.l, cfg.stage1_rounds, cfg.pens)

    def count_width(self, n: int) -> int:
        """Slots of a client's count list: the distinct peers stage one can count (never itself)."""
        per_round = self.l if self.pens.count == "drawn_and_selected" else self.k
        return min(n - 1, self.stage1_rounds * per_round)

    def init(self, ctx: Context) -> PensState:
        C, n, dev = len(ctx.client_ids), ctx.n, ctx.device
        no = torch.zeros(C, n, dtype=torch.bool, device=dev)
        peers, counts = empty_counts(C, self.count_width(n), dev)
        return PensState(count_peers=peers, counts=counts, last_topk=no, fixed=no.clone(), formed=False,
                         fell_back=torch.zeros(C, dtype=torch.bool, device=dev), similarity_round=0)

    def select(self, state: PensState, ctx: Context, view: RoundView) -> tuple[PensState, torch.Tensor | PeerIndex]:
        t = view.round
        reach = ctx.reach(t)   # the round's graph neighbours (None: every other client)
        if t <= self.stage1_rounds:
            cand = draw_candidates(ctx.seed, t, ctx.client_ids.to(ctx.device), ctx.n, self.l, allowed=reach)
            cand = answering(cand, ctx.delivery(t))   # an offline candidate, or a lost model, gives no score
            scores = similarity_for("loss", 0.0, ctx, view, cand)
            top = top_k_of_pool(scores.values, scores.idx, scores.valid, self.k, ctx.n)
            peers, counts = add_mask(state.count_peers, state.counts, top, self.count_width(ctx.n))
            if self.pens.count == "drawn_and_selected":
                peers, counts = add_mask(peers, counts, cand, self.count_width(ctx.n))
            new = dataclasses.replace(
                state, count_peers=peers, counts=counts, last_topk=top, similarity_round=t, pool=cand,
                similarity=pool_similarity(scores),
                similarity_client0=client0_similarity(scores, ctx.client_ids, ctx.n))
            return new, top
        if not state.formed:
            threshold = count_threshold(self.pens.count, self.stage1_rounds, self.l, self.k, ctx.n)
            chosen = counted_more_than(state.count_peers, state.counts, threshold, ctx.n)
            fixed, fell_back = fixed_list(chosen, state.last_topk, self.pens.empty_list)
            state = dataclasses.replace(state, fixed=fixed, fell_back=fell_back, formed=True)
        draw = self.pens.stage2_neighbours or self.k
        return state, PeerIndex.draw(ctx.seed, t, "pens", ctx.client_ids.to(ctx.device), ctx.n, draw,
                                     both(state.fixed, reach))

    def upgrade_state(self, clients: dict, server: dict, n: int) -> None:
        """Checkpoints that kept the last round's ``[n, n]`` similarities (:func:`drop_last_similarity`), or the
        stage-one counts as an ``[n, n]`` int64 table: now count lists of :meth:`count_width` slots."""
        drop_last_similarity(clients, server)
        if "count_peers" not in clients:
            clients["count_peers"], clients["counts"] = from_matrix(clients["counts"], self.count_width(n))

    def contacted(self, state: PensState, round_: int) -> torch.Tensor | None:
        """Stage one fetches the l candidates' models to rank them; stage two none beyond the averaged."""
        if state.pool is None or state.similarity_round != round_:
            return None
        return state.pool

    def neighbor_list(self, state: PensState, averaged: Choice) -> torch.Tensor:
        """Stage one: this round's top k; stage two: the fixed list."""
        return state.fixed if state.formed else state.last_topk
