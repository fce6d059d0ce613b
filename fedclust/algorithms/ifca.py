"""IFCA server math (docs/algorithms.md; IFCA paper, Ghosh et al. 2020, Algorithm 1,
option II "model averaging").

Each round every participating client i evaluates the K cluster models on
its own training data and takes ``ĵ = argmin_j F_i(θ_j)`` (its cluster
identity estimate); it trains that model locally and the server averages,
per cluster, the models of the clients that chose it.  A cluster nobody
chose keeps its model (IFCA paper: for k larger than the true number of
clusters the extra clusters stay empty).

Shapes: client models ``[C, P]``, cluster models ``[K, P]``, losses
``[C, K]``, assignments int64 ``[C]``.

Round object :class:`Ifca` (``ifca``), below the math:
- Init (docs/algorithms.md "IFCA: one init per cluster model"): cluster model 0 is the
  common ``w0``; cluster model k > 0 is the architecture's default init
  under the seed ``rng.hash_ints(seed, 0, INIT_STREAM, k, 0)`` (as
  :func:`fedclust.runner.initial_weights` builds ``w0`` under ``seed``), so
  the K inits are independent draws of the same init distribution and the
  run is a function of the seed alone.
- Plan: every client evaluates the K models on its training set
  (``ctx.pair_loss``, K vectorized calls) and starts from the one with the
  lowest loss; a client is evaluated with the model it chose (docs/algorithms.md),
  i.e. that cluster's model after the round's averaging.
- Aggregate: per-cluster mean of the participants' trained models.  Every
  rank must know every client's choice; the round's all-gather carries the
  models clients started from (``gathers_before``), and a client's choice is
  the cluster model its start equals (:func:`matching_model`).
- Participation < 1: every client picks (IFCA's inference rule: the model
  of lowest loss), only participants are averaged and counted as traffic.

Restarts (``ifca.restarts`` R, ``ifca.restart_rounds`` T0).  IFCA paper
runs Algorithm 1 from several random initialisations ("random
initialization and a few restarts suffice" for linear models; its success
rate counts a trial as solved when one of 10 initialisations lands within
0.6σ of the *true* parameters -- a pick that needs the truth).  fedclust
picks without the truth, by the quantity IFCA's alternating minimisation
decreases: the restart with the lowest objective
``(1/n) Σ_i min_j F_i(θ_j)`` (:func:`ifca_objective`, :func:`pick_restart`).
Restarts run one after the other inside the run's rounds: restart r trains
in rounds ``r·T0+1 .. (r+1)·T0`` from its own K inits
(:func:`cluster_inits` keyed on (seed, r); restart 0 is the plain run's);
at the start of the next round every client evaluates the restart's K
models on its training set (the same losses it assigns with), the mean of
its row minima over all n clients is the restart's objective (summed over
ranks), and after the last restart the run goes on from the models of the
restart with the lowest objective (ties: the earliest).  Rounds of the
restarts not picked are spent (and reported as they ran); the learning
rate keeps decaying by round as in any run.  R = 1 is Algorithm 1 from one
initialisation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import torch.distributed as dist

from fedclust import rng
from fedclust.algorithms.aggregation import cluster_average, own, participants
from fedclust.algorithms.base import Algorithm, Context, RoundPlan, RoundView, server_result
from fedclust.algorithms.registry import register
from fedclust.errors import ConfigError
from fedclust.schema import option
from fedclust.models import initial_weights, model_spec

INIT_STREAM = "ifca_init"   # rng stream of the cluster models' init seeds


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


# ----------------------------------------------------------------------------
# Round object


def model_init(arch: str, input_shape, num_classes: int, seed: int) -> torch.Tensor:
    """Flat default init ``[P]`` of the architecture under ``seed`` (as the run's w0)."""
    return initial_weights(arch, input_shape, num_classes, seed)[1]


def cluster_inits(w0: torch.Tensor, K: int, seed: int, arch: str, input_shape, num_classes: int,
                  restart: int = 0) -> torch.Tensor:
    """``[K, P]`` initial cluster models of restart ``restart``: for restart 0
    ``w0``, then the default init under the seeds
    ``rng.hash_ints(seed, 0, INIT_STREAM, k, 0)``, k = 1..K-1; for restart
    r > 0 all K under ``rng.hash_ints(seed, r, INIT_STREAM, k, 0)``, k = 0..K-1
    (keyed on (seed, restart), the same on every rank)."""
    rows = [w0.detach()] if restart == 0 else []
    for k in range(1 if restart == 0 else 0, K):   # K model builds, once per restart
        s = int(rng.hash_ints(seed, restart, INIT_STREAM, torch.tensor(k), 0))
        w = model_init(arch, input_shape, num_classes, s).to(w0)
        if w.shape != w0.shape:
            raise ValueError(f"cluster init has {w.numel()} parameters but w0 has {w0.numel()}; "
                             "pass the run's architecture and input shape")
        rows.append(w)
    return torch.stack(rows)


def loss_matrix(ctx: Context, models: torch.Tensor) -> torch.Tensor:
    """``[C, K]``: mean training loss of cluster model k on this rank's
    client c (``ctx.pair_loss``, one vectorized call per cluster)."""
    if ctx.pair_loss is None:
        raise ValueError("IFCA needs ctx.pair_loss (the engine's loss of models on the clients' training sets)")
    C = len(ctx.client_ids)
    local = torch.arange(C, device=models.device)
    return torch.stack([ctx.pair_loss(models[k].expand(C, -1), local) for k in range(models.shape[0])], dim=1)


def ifca_objective(losses: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(sum over clients of ``min_j F_i(θ_j)``, number of clients) of a
    ``[C, K]`` loss matrix; a NaN counts as +inf (as in
    :func:`assign_clusters`).  The objective of a restart is the sum over all
    ranks divided by the count over all ranks (:func:`global_mean`)."""
    if losses.dim() != 2 or losses.shape[1] == 0:
        raise ValueError(f"losses must be [C, K] with K >= 1, got shape {tuple(losses.shape)}")
    clean = torch.nan_to_num(losses.to(torch.float64), nan=float("inf"))
    return clean.min(dim=1).values.sum(), losses.shape[0]


def global_mean(total: torch.Tensor, count: int) -> float:
    """``total / count`` summed over all ranks (one all-reduce of two numbers
    when a process group of several ranks is running; no-op otherwise)."""
    both = torch.stack([total.to(torch.float64), torch.tensor(float(count), dtype=torch.float64, device=total.device)])
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(both)
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


def matching_model(rows: torch.Tensor, models: torch.Tensor) -> torch.Tensor:
    """int64 ``[n]``: for each row the index of the nearest of ``models [K, P]``
    (squared distance; 0 for a row that is an exact copy, as a client's
    start is).  One pass per model, no loop over rows."""
    d = torch.stack([(rows - models[k]).pow(2).sum(dim=1) for k in range(models.shape[0])], dim=1)
    return d.argmin(dim=1)


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
                              "number of clusters)")
    # IFCA paper restarts Algorithm 1 from several random inits ("a few restarts suffice"; 10 in its
    # success-rate runs).  The run tries each for restart_rounds rounds, one after the other, and goes on
    # with the one of lowest IFCA objective mean_i min_j F_i(theta_j).
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
    """IFCA round (IFCA paper Algorithm 1, option II; module docstring)."""

    clusters: int
    arch: str
    input_shape: tuple
    num_classes: int
    participation: float = 1.0
    restarts: int = 1
    restart_rounds: int = 10

    name = "ifca"
    report_position = 9
    gathers_before = True
    sections = {"ifca": IfcaConfig}
    paper_results = {("synthetic", None, 4): (60.42, 0.17)}

    @classmethod
    def from_config(cls, cfg) -> "Ifca":
        arch, shape, classes = model_spec(cfg)
        return cls(clusters=cfg.ifca.clusters, arch=arch, input_shape=shape, num_classes=classes,
                   participation=cfg.participation, restarts=cfg.ifca.restarts,
                   restart_rounds=cfg.ifca.restart_rounds)

    def _inits(self, ctx: Context, restart: int) -> torch.Tensor:
        return cluster_inits(ctx.w0, self.clusters, ctx.seed, self.arch, self.input_shape, self.num_classes,
                             restart).to(ctx.w0)

    def init(self, ctx: Context) -> IfcaState:
        return IfcaState(models=self._inits(ctx, 0), assignment=torch.zeros(ctx.n, dtype=torch.int64, device=ctx.device))

    def plan(self, state: IfcaState, ctx: Context, round_: int, models: torch.Tensor):
        losses = loss_matrix(ctx, state.models)
        ended = restart_boundary(round_, self.restarts, self.restart_rounds)
        if ended is not None:   # restart `ended` has run its rounds: score it, start the next or pick
            objective = global_mean(*ifca_objective(losses))
            state = IfcaState(state.models, state.assignment, state.ended + [state.models],
                              state.objectives + [objective])
            if ended + 1 < self.restarts:
                state.models = self._inits(ctx, ended + 1)
            else:
                state.picked = pick_restart(state.objectives)
                state.models = state.ended[state.picked]
                state.ended = []
            losses = loss_matrix(ctx, state.models)
        choice = assign_clusters(losses)
        return state, RoundPlan(start=state.models[choice])

    def aggregate(self, state: IfcaState, ctx: Context, view: RoundView):
        K = state.models.shape[0]
        active = participants(ctx.seed, view.round, ctx.n, self.participation, view.all_after.device)
        choice = matching_model(view.all_before, state.models)
        models = cluster_average(view.all_after[active], choice[active], K, state.models)
        received = active.to(torch.float64) * K
        new = IfcaState(models, choice, state.ended, state.objectives, state.picked)
        return new, server_result(ctx, models[own(ctx, choice)], choice, received, int(active.sum()))
