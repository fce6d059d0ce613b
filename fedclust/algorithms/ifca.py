"""IFCA, the Iterative Federated Clustering Algorithm (Ghosh et al.,
NeurIPS 2020, Algorithm 1, option II "model averaging"), as the server
algorithm ``ifca``: K cluster models; every client trains the one of lowest
loss on its own data, and the server averages per cluster.  Restarts from
several initialisations, picked by IFCA's objective.  What fedclust runs,
its keys and why: docs/algorithms.md, "IFCA".

Shapes: client models ``[C, P]``, cluster models ``[K, P]``, losses
``[C, K]``, assignments int64 ``[C]``.

Paper: A. Ghosh, J. Chung, D. Yin, K. Ramchandran, "An Efficient Framework for Clustered Federated
Learning", NeurIPS 2020, https://arxiv.org/abs/2006.04088
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from fedclust.algorithms.aggregation import cluster_average_rows, own, participants, trainers
from fedclust.algorithms.base import Algorithm, Context, RoundPlan, RoundView, RunFacts, server_result
from fedclust.algorithms.cluster_models import assign_clusters, cluster_inits, loss_matrix
from fedclust.algorithms.registry import register
from fedclust.errors import ConfigError
from fedclust.schema import option

# ----------------------------------------------------------------------------
# Round object


def ifca_objective(losses: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(sum over clients of ``min_j F_i(θ_j)``, number of clients) of a
    ``[C, K]`` loss matrix; a NaN counts as +inf (as in
    :func:`assign_clusters`).  The objective of a restart is the sum over all
    ranks divided by the count over all ranks (:func:`global_mean`)."""
    if losses.dim() != 2 or losses.shape[1] == 0:
        raise ValueError(f"losses must be [C, K] with K >= 1, got shape {tuple(losses.shape)}")
    clean = torch.nan_to_num(losses.to(torch.float64), nan=float("inf"))
    return clean.min(dim=1).values.sum(), losses.shape[0]


def global_mean(total: torch.Tensor, count: int, all_reduce=lambda x: x) -> float:
    """``total / count`` summed over all ranks (``all_reduce``: the context's,
    one all-reduce of two numbers; the default, one process, none)."""
    both = torch.stack([total.to(torch.float64), torch.tensor(float(count), dtype=torch.float64, device=total.device)])
    both = all_reduce(both)
    return float(both[0] / both[1]) if float(both[1]) > 0 else float("inf")


def pick_restart(objectives: list[float]) -> int:
    """Index of the restart with the lowest objective; NaN counts as +inf,
    ties go to the earliest restart."""
    if not objectives:
        raise ValueError("pick_restart needs at least one objective")
    clean = [float("inf") if v != v else float(v) for v in objectives]
    return min(range(len(clean)), key=lambda r: (clean[r], r))


def restart_boundary(round_: int, restarts: int, restart_rounds: int) -> int | None:
    """The restart whose trial ends just before round ``round_`` (rounds are
    1-based; restart r trains in rounds ``r·T0+1 .. (r+1)·T0``), or None:
    ``r = (round_ − 1)/T0 − 1`` when ``round_ − 1`` is a positive multiple of
    T0 and r < R; never with a single restart."""
    if restarts <= 1 or round_ <= 1 or (round_ - 1) % restart_rounds:
        return None
    r = (round_ - 1) // restart_rounds - 1
    return r if r < restarts else None


@dataclass
class IfcaState:
    models: torch.Tensor        # [K, P] cluster models (replicated)
    assignment: torch.Tensor    # [n] int64: each client's latest choice (replicated)
    ended: list = field(default_factory=list)        # [K, P] models of each restart that has ended
    objectives: list = field(default_factory=list)   # its objective (ifca_objective, over all clients)
    picked: int | None = None                        # the restart the run went on with


@dataclass
class IfcaConfig:
    """The ``ifca`` section."""

    clusters: int = option(2, "c, the number of cluster models, in [1, clients] (PANM paper Table 5: the true "
                              "number of clusters)",
        doc=("IFCA's number of cluster models, in [1, `clients`] (PANM paper Table 5: the true number of "
            "clusters)"))
    # restarts tried one after the other, the lowest IFCA objective goes on (docs/algorithms.md, IFCA)
    restarts: int = option(3, "initialisations tried one after the other; the lowest IFCA objective goes on (1: "
                              "a single one)")
    restart_rounds: int = option(10, "rounds each restart runs before they are compared; restarts * "
                                     "restart_rounds < rounds")

    def validate(self, cfg) -> None:
        c, n = self.clusters, cfg.clients
        if not 1 <= c <= n:
            raise ConfigError("ifca.clusters", c, f"must lie in [1, clients = {n}]: one model per cluster, "
                              "e.g. the number of clusters you expect (data.num_clusters)")
        r, t0 = self.restarts, self.restart_rounds
        if r < 1:
            raise ConfigError("ifca.restarts", r, "must be >= 1 (1: one initialisation, IFCA paper Algorithm 1 as is)")
        if r > 1 and t0 < 1:
            raise ConfigError("ifca.restart_rounds", t0, "must be >= 1: the rounds each restart runs before "
                              "they are compared")
        if r > 1 and r * t0 >= cfg.rounds:
            raise ConfigError("ifca.restarts", r, f"{r} restarts x ifca.restart_rounds = {t0} take {r * t0} rounds, "
                              f"not fewer than rounds = {cfg.rounds}; lower ifca.restarts (1: no restarts) or "
                              "ifca.restart_rounds, or raise rounds")


@register
@dataclass
class Ifca(Algorithm):
    """IFCA's round (IFCA paper Algorithm 1, option II; docs/algorithms.md, "IFCA").

    Every rank must know every client's choice: the round's all-gather
    carries it, one number a client (``gathers_labels``).  The cluster
    average is column by column, so the models may come in column blocks
    (``exchange_mb``).  ``init`` (the model's default init under a seed,
    :attr:`RunFacts.init`) gives the further cluster inits (:func:`cluster_inits`)."""

    init_model: Callable[[int], torch.Tensor]
    ifca: IfcaConfig = field(default_factory=IfcaConfig)
    participation: float = 1.0

    name = "ifca"
    report_position = 9
    gathers_labels = True
    column_exchange = True
    sections = {"ifca": IfcaConfig}
    cluster_count_key = "ifca.clusters"
    paper_results = {("synthetic", None, 4): (60.42, 0.17)}

    @classmethod
    def from_config(cls, cfg, facts: RunFacts) -> "Ifca":  # type: ignore[override]  # takes the run's facts (registry.build passes them to a from_config that names them)
        return cls(facts.init, cfg.ifca, cfg.participation)

    def _inits(self, ctx: Context, restart: int) -> torch.Tensor:
        return cluster_inits(ctx.w0, self.ifca.clusters, ctx.seed, self.init_model, restart).to(ctx.w0)

    def init(self, ctx: Context) -> IfcaState:
        return IfcaState(models=self._inits(ctx, 0),
                         assignment=torch.zeros(ctx.n, dtype=torch.int64, device=ctx.device))

    def plan(self, state: IfcaState, ctx: Context, round_: int, models: torch.Tensor):
        """Every client (participant or not: IFCA's inference rule) starts from
        the cluster model of lowest loss on its training set.  At the end of a
        restart's rounds, those same losses score it (:func:`ifca_objective`,
        over all ranks), and the next restart's inits, or the best restart's
        models, take over."""
        restarts, restart_rounds = self.ifca.restarts, self.ifca.restart_rounds
        losses = loss_matrix(ctx, state.models)
        finished = restart_boundary(round_, restarts, restart_rounds)
        if finished is not None:
            objective = global_mean(*ifca_objective(losses), ctx.all_reduce)
            state = IfcaState(state.models, state.assignment, state.ended + [state.models],
                              state.objectives + [objective])
            if finished + 1 < restarts:
                state.models = self._inits(ctx, finished + 1)
            else:
                state.picked = pick_restart(state.objectives)
                state.models = state.ended[state.picked]
                state.ended = []
            losses = loss_matrix(ctx, state.models)
        choice = assign_clusters(losses)
        # only participants' training is read
        trains = trainers(ctx.seed, round_, ctx.n, self.participation, ctx.online(round_))
        return state, RoundPlan(start=state.models[choice], trains=trains, labels=choice)

    def unseen_candidates(self, saved: dict, weights: torch.Tensor) -> torch.Tensor:
        """The K cluster models (fedclust evaluate --unseen: a new client estimates its cluster as IFCA's do)."""
        return saved["server"]["models"]

    def aggregate(self, state: IfcaState, ctx: Context, view: RoundView):
        """Per-cluster mean of the participants' trained models; a client holds,
        and is evaluated with, the model of the cluster it chose."""
        K = state.models.shape[0]
        active = participants(ctx.seed, view.round, ctx.n, self.participation, ctx.device, ctx.online(view.round))
        choice = view.gathered_labels().to(ctx.device)   # every client's choice, from the gather
        models = cluster_average_rows(view, active, choice, K, state.models)
        received = active.to(torch.float64) * K
        new = IfcaState(models, choice, state.ended, state.objectives, state.picked)
        return new, server_result(ctx, models[own(ctx, choice)], choice, received, int(active.sum()))
