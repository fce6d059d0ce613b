"""PANM, Personalized Adaptive Neighbour Matching (Li et al., arXiv
2203.12285, §3.2.4, Algorithm 1), as the peer algorithms ``panm_loss`` and
``panm_grad``: stage one (rounds 1..T1) runs CNI (``cni.py``) and averages
with the new list; stage two starts from the last stage-one list, updates it
with HNM (``hnm.py``) every τ rounds, and averages with k neighbours drawn
from it.  The two variants differ in the similarity (``similarity.py``).
What fedclust runs, its keys and its departures: docs/algorithms.md, "PANM".

Paper: Z. Li, J. Lu, S. Luo, D. Zhu, Y. Shao, Y. Li, Z. Zhang, C. Wu, "Mining Latent Relationships
among Clients: Peer-to-peer Federated Learning with Adaptive Neighbor Matching",
https://arxiv.org/abs/2203.12285
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from fedclust.algorithms.base import Choice, Context, PeerAlgorithm, RoundView, client_rows, round_only
from fedclust.algorithms.cni import cni_pool, draw_candidates, top_k_of_pool
from fedclust.algorithms.hnm import draw_average, hnm_draw, hnm_update
from fedclust.algorithms.registry import register
from fedclust.algorithms.similarity import (
    PoolScores,
    client0_similarity,
    drop_last_similarity,
    loss_em_input,
    pool_similarity,
    similarity_for,
)
from fedclust.errors import ConfigError
from fedclust.network import answering
from fedclust.peers import PeerIndex
from fedclust.schema import at_least, option

EmInput = Literal["neg_loss", "inverse"]
EmVariance = Literal["separate", "tied"]
SilentNeighbours = Literal["keep", "drop"]
EmptyList = Literal["fill", "stay"]
PANM_EM_INPUTS = typing.get_args(EmInput)
PANM_EM_VARIANCES = typing.get_args(EmVariance)


@dataclass
class PanmConfig:
    """The ``panm`` section (both variants; why the defaults: docs/algorithms.md, PANM, departures 3-5)."""

    # how runs behaved before each key: HNM left an empty list empty; CNI dropped a silent previous neighbour
    before_the_key: ClassVar[dict] = {"empty_list": "stay", "silent_neighbours": "drop"}

    tau: int = option(1, "HNM updates the neighbour list every tau rounds of stage two, >= 1",
        doc=("HNM runs every `tau` rounds of stage two, `>= 1`"))
    alpha: float = option(0.5, "panm_grad: weight of the update cosine in CNI's similarity, in [0, 1] (PANM paper: "
                               "0.5)",
        doc=("PANMGrad's weight of the update cosine in CNI's similarity, in [0, 1]"))
    em_input: EmInput = option("neg_loss", "panm_loss: what HNM's EM runs on, neg_loss (-F, the default) or inverse "
                                       "(1/F, the paper's text); panm_grad ignores it",
        doc=("what PANMLoss's HNM runs its EM on: `neg_loss` (`y = -F_i(w_j)`, docs/algorithms.md: on "
            "`1/F` the same-cluster values spread so widely that EM splits them and lists collapse) or "
            "`inverse` (`y = 1/F_i(w_j)`, PANM paper's literal text); CNI ranks by `1/F` under either "
            "(same order); `panm_grad` ignores it"))
    em_variance: EmVariance = option("separate", "HNM's two Gaussians: separate (one sigma each, PANM paper Eq. 15) or "
                                          "tied (one pooled sigma)",
        doc=("the variances of HNM's two Gaussians: `separate` (one per component, the PANM paper's Eq. "
            "15) or `tied` (one pooled within-component variance: one threshold between the means; it "
            "merges PANMLoss's clusters on 4 rotations, see `docs/algorithms.md`)"))
    hnm_alpha: float = option(0.0, "panm_grad: weight of the update cosine in the similarity HNM's EM runs on, "
                                   "in [0, 1] (CNI keeps panm.alpha)",
        doc=("PANMGrad: the weight of the update cosine in the similarity HNM's EM runs on in stage two, "
            "in [0, 1] (CNI keeps `panm.alpha`). 0: the weight cosine alone. In stage two the update "
            "cosine carries no cluster signal, only noise that grows as the learning rate decays, and "
            "with the paper's 0.5 in both stages PANMGrad's 4 clusters merge after round 170; "
            "`docs/algorithms.md` (PANM, departure 4) has the mechanism and the numbers"))

    silent_neighbours: SilentNeighbours = option(
        "keep", "stage one: a previous neighbour whose model did not arrive this round (offline, lost) gives its "
                "place to the best answering candidate (drop) or keeps it (keep, Eq. 8's carried list)",
        doc=("CNI (stage one) under `network.p_offline` or `network.p_drop`: `drop`, the list is the top k of the "
            "answers alone, so a neighbour of `N_i^{t-1}` whose model did not arrive this round loses its place; "
            "`keep`, it keeps its place in `N_i^t` (the paper's Eq. 8 carries the previous list so that a pure "
            "list stays pure) and the other places go to the best answers. `drop` lets churn bring the "
            "cluster rotated 180° into the lists: at 10-50% offline PANM's final precision is 49-74% with "
            "`drop` and 100% with `keep`, its accuracy higher (`docs/results_network.md`). A run written before "
            "the key existed reads `drop`, the behaviour it ran with. No effect without lost models"))

    empty_list: EmptyList = option(
        "fill", "stage two: a client whose list is empty (a late joiner, network.join_round after T1) takes the top "
                "k of its HNM candidates (fill) or stays without neighbours (stay)",
        doc=("HNM's EM starts its component A from the sampled neighbours, so a client with an empty `N_i` in "
            "stage two (a late joiner: `network.join_round` after `stage1_rounds`; or a list left empty by churn "
            "at the end of stage one) could never gain one and trained alone. `fill`: at each HNM step such a "
            "client puts the top k of its l candidates in its list (CNI's rule, on HNM's similarity), then HNM "
            "goes on from there; `stay`: it stays empty and averages with no one, as runs before the key "
            "did (a checkpoint without the key resumes with `stay`). Neither the PANM paper nor its code has "
            "clients that join"))

    def validate(self, cfg) -> None:
        at_least("panm.tau", self.tau, 1, "PANM's HNM runs every tau rounds of stage two")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError("panm.alpha", self.alpha, "must lie in [0, 1]: PANMGrad's weight of the update cosine "
                              "(PANM paper: 0.5)")
        if not 0.0 <= self.hnm_alpha <= 1.0:
            raise ConfigError("panm.hnm_alpha", self.hnm_alpha, "must lie in [0, 1]: the weight of the update "
                              "cosine in the similarity HNM's EM runs on (0, the default: the weight cosine alone; "
                              "0.5: PANM paper's alpha in both stages)")


@dataclass
class PanmState:
    """Rows are ``ctx.client_ids``."""

    neighbors: torch.Tensor = client_rows()        # [C, n] bool: N_i (stage one: N_i^t of the last round)
    hnm_failed: torch.Tensor = client_rows()       # [C] bool: the last HNM step found no split and kept N_i
    similarity_round: int = 0                      # round of the last similarities (0: none yet), replicated
    # The round's similarities, read in that round only (traffic and the stage-one figure):
    pool: torch.Tensor | None = round_only(default=None)           # [C, n] bool: peers whose similarity was computed
    similarity: torch.Tensor | None = round_only(default=None)     # [C, m] float32 s_ij on the pool (pool_similarity)
    similarity_client0: torch.Tensor | None = round_only(default=None)   # [n] float32 on client 0's rank (figure)


@dataclass
class PANM(PeerAlgorithm):
    """PANMLoss / PANMGrad (PANM paper Algorithm 1); the variants differ in ``metric``."""

    k: int                 # algorithm.k: neighbours averaged with per round
    l: int                 # algorithm.l: candidates drawn per round
    tau: int               # panm.tau: HNM every tau rounds of stage two
    alpha: float           # panm.alpha: weight of the update cosine in CNI's similarity (panm_grad)
    stage1_rounds: int     # T1
    panm: PanmConfig = field(default_factory=PanmConfig)

    metric: ClassVar[str] = ""   # the similarity, "loss" or "grad" (similarity_for)
    needs_k = needs_l = needs_stages = keeps_k_of_l = True
    stage_one_figures = True
    sections = {"panm": PanmConfig}

    @classmethod
    def from_config(cls, cfg) -> "PANM":
        a = cfg.algorithm
        return cls(a.k, a.l, cfg.panm.tau, cfg.panm.alpha, cfg.stage1_rounds, cfg.panm)

    def init(self, ctx: Context) -> PanmState:
        C, n = len(ctx.client_ids), ctx.n
        return PanmState(
            neighbors=torch.zeros(C, n, dtype=torch.bool, device=ctx.device),
            hnm_failed=torch.zeros(C, dtype=torch.bool, device=ctx.device),
            similarity_round=0,
        )

    def select(self, state: PanmState, ctx: Context, view: RoundView) -> tuple[PanmState, torch.Tensor | PeerIndex]:
        t = view.round
        if t <= self.stage1_rounds:
            return self._stage_one(state, ctx, view)
        return self._stage_two(state, ctx, view)

    def _stage_one(self, state: PanmState, ctx: Context, view: RoundView):
        """CNI: top k among ``C_i ∪ N_i^{t-1}``; average with it.  On a graph, both within the round's
        neighbours."""
        reach = ctx.reach(view.round)
        cand = draw_candidates(ctx.seed, view.round, ctx.client_ids.to(ctx.device), ctx.n, self.l, allowed=reach)
        previous = state.neighbors if reach is None else state.neighbors & reach.mask()
        delivery = ctx.delivery(view.round)
        pool = answering(cni_pool(cand, previous), delivery)  # N_i^0 empty: round 1: C_i alone
        scores = similarity_for(self.metric, self.alpha, ctx, view, pool)
        silent = None   # previous neighbours whose model did not arrive: they keep their places (Eq. 8)
        if self.panm.silent_neighbours == "keep" and delivery is not None:
            silent = previous & ~answering(previous, delivery)
        row_k = None if silent is None else (self.k - silent.sum(1)).clamp_min(0)
        neighbors = top_k_of_pool(scores.values, scores.idx, scores.valid, self.k, ctx.n, row_k)
        if silent is not None:
            neighbors = neighbors | silent
        new = dataclasses.replace(state, neighbors=neighbors, **self._recorded(scores, pool, ctx, view.round))
        return new, neighbors

    def _stage_two(self, state: PanmState, ctx: Context, view: RoundView):
        """HNM every τ rounds, then k drawn uniformly from ``N_i``."""
        t = view.round
        new = state
        reach = ctx.reach(t)
        if t % self.tau == 0:
            cand, sample = hnm_draw(ctx.seed, t, ctx.client_ids.to(ctx.device), state.neighbors, self.l, reach)
            delivery = ctx.delivery(t)   # an offline client, or a lost model, gives no score
            cand, sample = answering(cand, delivery), answering(sample, delivery)
            pool = cand | sample
            scores = similarity_for(self.metric, self.panm.hnm_alpha, ctx, view, pool)
            y = (scores.with_values(loss_em_input(scores.values, self.panm.em_input)) if self.metric == "loss"
                 else scores)
            neighbors, failed = hnm_update(state.neighbors, cand, sample, y, variance=self.panm.em_variance)
            if self.panm.empty_list == "fill":
                neighbors, failed = self._fill_empty(state.neighbors, neighbors, failed, scores, ctx.n)
            new = dataclasses.replace(state, neighbors=neighbors, hnm_failed=failed,
                                      **self._recorded(scores, pool, ctx, t))
        return new, draw_average(ctx.seed, t, ctx.client_ids, new.neighbors, self.k, reach)

    def _fill_empty(self, before: torch.Tensor, neighbors: torch.Tensor, failed: torch.Tensor, scores: PoolScores,
                    n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows whose list was empty before HNM (no S, so EM had nothing to start from): the top k of their
        candidates by ``scores``, CNI's rule; the other rows as HNM left them."""
        empty = ~before.any(1)
        if not bool(empty.any()):
            return neighbors, failed
        row_k = torch.where(empty, self.k, 0)
        top = top_k_of_pool(scores.values, scores.idx, scores.valid, self.k, n, row_k)
        filled = top.any(1)
        return torch.where(empty[:, None], top, neighbors), failed & ~filled

    def _recorded(self, scores: PoolScores, pool: torch.Tensor, ctx: Context, round_: int) -> dict:
        """What the state keeps of a round's similarities: on the pool, and client 0's row (PANMGrad computes
        all of it)."""
        return dict(similarity_round=round_, pool=pool, similarity=pool_similarity(scores),
                    similarity_client0=client0_similarity(scores, ctx.client_ids, ctx.n))

    def neighbor_list(self, state: PanmState, averaged: Choice) -> torch.Tensor:
        return state.neighbors

    def upgrade_state(self, clients: dict, server: dict, n: int) -> None:
        """Checkpoints that kept the last round's ``[n, n]`` similarities (:func:`drop_last_similarity`)."""
        drop_last_similarity(clients, server)

    def contacted(self, state: PanmState, round_: int) -> torch.Tensor | None:
        """Peers whose models client i fetched this round to compute similarities (None: no similarity this round)."""
        if state.pool is None or state.similarity_round != round_:
            return None
        return state.pool


@register
@dataclass
class PANMLoss(PANM):
    """PANMLoss: PANM with the loss similarity (PANM paper Eq. 3)."""

    metric = "loss"
    # column_exchange stays False: it ranks peers by the loss of their whole models on its own data
    name = "panm_loss"
    report_position = 5
    paper_results = {("fmnist", "rotation", 2): (87.33, 0.17)}


@register
@dataclass
class PANMGrad(PANM):
    """PANMGrad: PANM with the update/weight cosine similarity (PANM paper Eq. 6)."""

    metric = "grad"
    name = "panm_grad"
    report_position = 6
    gathers_before = True   # Δ_j = w_j^t − w_j^{t−1} needs every client's model before local training
    column_exchange = True  # its similarity sums over column blocks (similarity.grad_pool_scores)
    paper_results = {("fmnist", "rotation", 2): (86.88, 0.34)}
