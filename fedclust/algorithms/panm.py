"""PANM: Personalized Adaptive Neighbour Matching (PANM paper §3.2.4,
Algorithm 1; docs/algorithms.md), as the peer algorithms ``panm_loss`` and ``panm_grad``.

Rounds 1..T1 (stage one) run CNI (``cni.py``) and average with the new list
``N_i^t``.  Later rounds (stage two) start from the last stage-one list; in
rounds with ``t % τ == 0`` (Algorithm 1, line 9) HNM (``hnm.py``) first
updates ``N_i``, then every stage-two round averages with k neighbours drawn
uniformly from ``N_i`` (all if fewer).

Similarity: ``panm_loss`` uses ``1 / F_i(w_j)`` evaluated only on the pairs
a client contacts (``ctx.pair_loss``); ``panm_grad`` the cosine mix of
Eq. 6, which needs every client's model before local training
(``gathers_before``).

``panm.em_input`` (panm_loss only; docs/algorithms.md): HNM's EM runs on ``-F_i(w_j)``
(``neg_loss``, default) or on the paper's literal ``1/F_i(w_j)``
(``inverse``); CNI ranks by ``1/F`` either way (the same order).  panm_grad
ignores the key: its EM runs on the cosine mix.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.cni import draw_candidates, top_k_in_mask
from fedclust.algorithms.hnm import draw_average, hnm_draw, hnm_update
from fedclust.algorithms.similarity import grad_similarity, loss_em_input, loss_similarity
from fedclust.errors import ConfigError


@dataclass
class PanmState:
    """Per-rank state; rows are ``ctx.client_ids``."""

    neighbors: torch.Tensor        # [C, n] bool: N_i (stage one: N_i^t of the last round)
    last_similarity: torch.Tensor  # [C, n] float32: last computed s_ij, NaN where not computed
    similarity_round: int          # round of last_similarity (0: none yet)
    hnm_failed: torch.Tensor       # [C] bool: the last HNM step found no split and kept N_i
    pool: torch.Tensor | None = None  # [C, n] bool: peers whose similarity was computed in similarity_round


def similarity_for(metric: str, alpha: float, ctx: Context, view: RoundView, pool: torch.Tensor) -> torch.Tensor:
    """``[C, n]`` similarity of this rank's clients to the peers in ``pool``
    (loss: only there, ``-inf`` elsewhere; grad: everywhere)."""
    if metric == "loss":
        if ctx.pair_loss is None and ctx.pool_loss is None:
            raise ValueError("loss similarity needs ctx.pool_loss or ctx.pair_loss (the engine's loss of peer "
                             "models on own data)")
        return loss_similarity(ctx.pair_loss, view.all_after, pool, pool_loss=ctx.pool_loss)
    if view.all_before is None:
        raise ValueError("grad similarity needs view.all_before: the algorithm must set gathers_before=True")
    return grad_similarity(view.all_after, view.all_before, ctx.w0.to(view.after.device), alpha, own=ctx.own_rows)


def recorded_similarity(sim: torch.Tensor, pool: torch.Tensor, self_mask: torch.Tensor, full: bool) -> torch.Tensor:
    """What the state keeps: float32 similarities, NaN where not computed and on the diagonal."""
    keep = ~self_mask if full else pool
    return torch.where(keep, sim.to(torch.float32), torch.full_like(sim, math.nan, dtype=torch.float32))


def check_peer_config(name: str, k: int, l: int, stage1_rounds: int) -> None:
    """Refuse settings under which the two-stage algorithms cannot run."""
    if k < 1:
        raise ConfigError("algorithm.k", k, f"{name} averages with k >= 1 neighbours")
    if l < 1:
        raise ConfigError("algorithm.l", l, f"{name} draws l >= 1 candidates per round")
    if stage1_rounds < 1:
        raise ConfigError("stage1_rounds", stage1_rounds,
                          f"{name} needs at least 1 stage-one round: stage two starts from its neighbour list")


@dataclass
class PANM:
    """PANMLoss / PANMGrad (PANM paper Algorithm 1)."""

    metric: str            # "loss" | "grad"
    k: int
    l: int
    tau: int
    alpha: float
    stage1_rounds: int
    name: str = "panm_loss"
    gathers_before: bool = False
    em_input: str = "neg_loss"   # panm_loss: "neg_loss" (EM on -F) | "inverse" (EM on 1/F); grad: unused
    em_variance: str = "separate"  # HNM's Gaussians: "separate" sigma per component | "tied" (one pooled sigma)
    hnm_alpha: float = 0.0       # panm_grad: weight of the update cosine in the similarity HNM's EM runs on

    def init(self, ctx: Context) -> PanmState:
        C, n = len(ctx.client_ids), ctx.n
        return PanmState(
            neighbors=torch.zeros(C, n, dtype=torch.bool, device=ctx.device),
            last_similarity=torch.full((C, n), math.nan, dtype=torch.float32, device=ctx.device),
            similarity_round=0,
            hnm_failed=torch.zeros(C, dtype=torch.bool, device=ctx.device),
        )

    def select(self, state: PanmState, ctx: Context, view: RoundView) -> tuple[PanmState, torch.Tensor]:
        t = view.round
        if t <= self.stage1_rounds:
            return self._stage_one(state, ctx, view)
        return self._stage_two(state, ctx, view)

    def _stage_one(self, state: PanmState, ctx: Context, view: RoundView):
        """CNI: top k among ``C_i ∪ N_i^{t-1}``; average with it."""
        self_mask = ctx.self_mask
        cand = draw_candidates(ctx.seed, view.round, ctx.client_ids, self_mask, self.l)
        pool = cand | state.neighbors  # N_i^0 is empty: round 1 ranks C_i alone
        sim = similarity_for(self.metric, self.alpha, ctx, view, pool)
        neighbors = top_k_in_mask(sim, pool, self.k)
        new = dataclasses.replace(
            state, neighbors=neighbors, similarity_round=view.round, pool=pool,
            last_similarity=recorded_similarity(sim, pool, self_mask, full=self.metric == "grad"))
        return new, neighbors

    def _stage_two(self, state: PanmState, ctx: Context, view: RoundView):
        """HNM every τ rounds, then k drawn uniformly from ``N_i``."""
        t = view.round
        new = state
        if t % self.tau == 0:
            self_mask = ctx.self_mask
            cand, sample = hnm_draw(ctx.seed, t, ctx.client_ids, state.neighbors, self_mask, self.l)
            pool = cand | sample
            sim = similarity_for(self.metric, self.hnm_alpha, ctx, view, pool)
            y = loss_em_input(sim, self.em_input) if self.metric == "loss" else sim
            neighbors, failed = hnm_update(state.neighbors, cand, sample, y, variance=self.em_variance)
            new = dataclasses.replace(
                state, neighbors=neighbors, hnm_failed=failed, similarity_round=t, pool=pool,
                last_similarity=recorded_similarity(sim, pool, self_mask, full=self.metric == "grad"))
        return new, draw_average(ctx.seed, t, ctx.client_ids, new.neighbors, self.k)

    def neighbor_list(self, state: PanmState, averaged: torch.Tensor) -> torch.Tensor:
        return state.neighbors

    def contacted(self, state: PanmState, round_: int) -> torch.Tensor:
        """Peers whose models client i fetched this round to compute similarities."""
        if state.pool is None or state.similarity_round != round_:
            return torch.zeros_like(state.neighbors)
        return state.pool


def _make(cfg, metric: str) -> PANM:
    from fedclust.config_methods import check_panm_em_input, check_panm_em_variance

    a = cfg.algorithm
    name = f"panm_{metric}"
    check_peer_config(name, a.k, a.l, cfg.stage1_rounds)
    if a.tau < 1:
        raise ConfigError("algorithm.tau", a.tau, "HNM runs every tau >= 1 rounds")
    if metric == "grad" and not 0.0 <= a.alpha <= 1.0:
        raise ConfigError("algorithm.alpha", a.alpha, "must lie in [0, 1]")
    if metric == "grad" and not 0.0 <= cfg.panm.hnm_alpha <= 1.0:
        raise ConfigError("panm.hnm_alpha", cfg.panm.hnm_alpha, "must lie in [0, 1]: the weight of the update "
                          "cosine in the similarity HNM's EM runs on (0, the default: the weight cosine alone; "
                          "0.5: PANM paper's alpha in both stages)")
    check_panm_em_input(cfg.panm.em_input)
    check_panm_em_variance(cfg.panm.em_variance)
    return PANM(metric=metric, k=a.k, l=a.l, tau=a.tau, alpha=a.alpha, stage1_rounds=cfg.stage1_rounds,
                name=name, gathers_before=metric == "grad", em_input=cfg.panm.em_input,
                em_variance=cfg.panm.em_variance, hnm_alpha=cfg.panm.hnm_alpha)


def make_panm_loss(cfg) -> PANM:
    """PANMLoss: PANM with the loss similarity (PANM paper Eq. 3)."""
    return _make(cfg, "loss")


def make_panm_grad(cfg) -> PANM:
    """PANMGrad: PANM with the update/weight cosine similarity (PANM paper Eq. 6)."""
    return _make(cfg, "grad")
