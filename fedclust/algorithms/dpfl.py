"""DPFL, Decentralized Personalized Federated Learning, as the peer algorithm
``dpfl``: every few rounds each client chooses whom it averages with by a
randomized double greedy search over a candidate pool under a budget of B
clients (itself included), the reward of a set being the validation loss of
the set's data-size-weighted average on the client's own validation split.

Round t, after local training (every round):

- a search round is ``t >= dpfl.start`` with ``(t − start) % dpfl.period == 0``
  (the reference's t = 2, 4, 6, ... counted from 0: fedclust's 3, 5, 7, ...);
  on other rounds nothing is exchanged and every client keeps its model;
- on a search round client i searches its pool P_i (every client at the first
  search; with ``dpfl.pool=frozen_first``, the reference's, the set it chose
  at the first search ever after):

  1. the others of P_i in the order of their keys
     ``uniform(seed, t, "dpfl_order", i, j)`` (a uniform shuffle);
  2. X ← {i}, Y ← P_i; ``R(S) = (10 − L_i(x̄_S)) / 10``, x̄_S the average of
     S's models weighted by their training examples, L_i the mean
     cross-entropy on i's validation split;
  3. for each z in that order: ``a = R(X ∪ {z}) − R(X)``, ``b = R(Y ∖ {z}) −
     R(Y)``, ``p = a⁺ / (a⁺ + b⁺)`` (``a⁺ = b⁺ = 0``: 1, add; ``a⁺ = b⁺ > 0``:
     ``dpfl.tie``); z joins X when ``uniform(seed, t, "dpfl_coin", i, s) < p``
     (s the step), else leaves Y; stop when |X| = B;

- then ``x_i ← x̄_{X_i}`` for every client at once, from the models after
  training (Jacobi; the reference overwrites them one client after another).

Every client searches in lock-step: step s evaluates the two candidate sets of
every client still searching as 2·C averaged models (one matrix product) on
their owners' validation splits (one batched pass).  A client's neighbour list
is the set it chose last (the round's averaging partners on a search round).
Where fedclust departs from the reference code: docs/algorithms.md, "DPFL".

Paper: S. Kharrat, M. Canini, S. Horváth, "Decentralized Personalized Federated Learning", AISTATS 2025, PMLR
258:5086–5094, https://arxiv.org/abs/2406.06520; reference code salmakh1/DPFL.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from fedclust import rng
from fedclust.algorithms.base import (
    Choice,
    Context,
    PeerAlgorithm,
    RoundResult,
    RoundView,
    client_rows,
    keep_personal,
    round_only,
)
from fedclust.algorithms.registry import register
from fedclust.data.validation import check_share
from fedclust.errors import ConfigError
from fedclust.network import answering
from fedclust.schema import at_least, option

Pool = Literal["frozen_first", "full"]
Weights = Literal["data_size", "uniform"]
TieRule = Literal["fixed", "previous"]
Average = Literal["jacobi", "sequential"]
Search = Literal["double_greedy", "greedy"]
ORDER, COIN = "dpfl_order", "dpfl_coin"   # rng streams: a client's shuffle of its pool, its coin at each step


@dataclass
class DpflConfig:
    """The ``dpfl`` section (docs/algorithms.md, "DPFL")."""

    search: Search = option("double_greedy", "double_greedy: the randomized double greedy (the reference's "
                                             "optimized_rgl_p); greedy: add the peer of largest gain while it is "
                                             ">= 0 (its non_monotone_constrained_greedy, unused by its DPFL)")
    budget: int = option(10, "B, the most clients a collaborator set holds, the client itself included (the "
                             "reference's cardinality, 10), >= 2")
    period: int = option(2, "a search every period rounds (the reference's periodicity_of_bandit, 2), >= 1; no "
                            "exchange between searches")
    start: int = option(3, "the first round that searches (fedclust's round 3 is the reference's t = 2, its rounds "
                           "counted from 0), >= 1")
    pool: Pool = option("frozen_first", "frozen_first: the first search's pool is every client, each later one "
                                        "searches the set chosen first (the reference's); full: every client at "
                                        "every search")
    weights: Weights = option("data_size", "data_size: a set's models averaged weighted by their training examples "
                                           "(the reference's weighted_avg); uniform: equally")
    validation: float = option(0.2, "share of each client's training examples held out (never trained on) to score "
                                    "a set's average, in (0, 1) (the reference's val_split, 0.2)")
    tie: float = option(0.5, "p of adding a candidate when both gains are equal and positive, in [0, 1] "
                             "(Buchbinder et al.'s 0.5; read with dpfl.tie_rule=fixed)")
    tie_rule: TieRule = option("fixed", "fixed: such a tie adds with probability dpfl.tie; previous: with the "
                                        "previous step's p, 0 at a search's first step (the reference's)")
    average: Average = option("jacobi", "jacobi: every client averages the models after training; sequential: "
                                        "client by client in index order, each from the models of those before it "
                                        "already averaged (the reference's, Gauss-Seidel)")

    def validate(self, cfg) -> None:
        at_least("dpfl.budget", self.budget, 2, "a set holds the client and at least one peer")
        at_least("dpfl.period", self.period, 1, "rounds between two searches")
        at_least("dpfl.start", self.start, 1, "the first round that searches (rounds count from 1)")
        if self.start > cfg.rounds:
            raise ConfigError("dpfl.start", self.start, f"must be at most rounds = {cfg.rounds}, or DPFL never "
                              "searches and every client trains alone; lower dpfl.start or raise rounds")
        if not (math.isfinite(self.tie) and 0.0 <= self.tie <= 1.0):
            raise ConfigError("dpfl.tie", self.tie, "must lie in [0, 1]: a probability (0.5, Buchbinder et al.'s)")
        if float(self.validation) == 0.0:
            raise ConfigError("dpfl.validation", self.validation, "DPFL scores a set on each client's validation "
                              "split: choose a share in (0, 1), e.g. the reference's 0.2")
        check_share(self.validation, cfg.data.train_size, "dpfl.validation")


def search_round(cfg: DpflConfig, round_: int) -> bool:
    """Whether round ``round_`` (1-based) searches and averages."""
    return round_ >= cfg.start and (round_ - cfg.start) % cfg.period == 0


def set_models(sets: torch.Tensor, sizes: torch.Tensor, models: torch.Tensor) -> torch.Tensor:
    """``[M, P]``: each row of ``sets`` (bool ``[M, n]``) as the average of its members' ``models`` (``[n, P]``),
    weighted by ``sizes`` (``[n]``), one matrix product."""
    w = sets.to(torch.float64) * sizes.to(torch.float64)[None, :]
    w = w / w.sum(1, keepdim=True)
    return w.to(models.dtype) @ models


def rewards(sets: torch.Tensor, owner: torch.Tensor, sizes: torch.Tensor, models: torch.Tensor,
            loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``[M]`` float64 ``R(S) = (10 − L(x̄_S)) / 10`` of each set (bool ``[M, n]``) on its owner's validation split
    (``loss(models [M, P], owner [M])``, ``owner`` local client indices)."""
    if not len(sets):
        return torch.zeros(0, dtype=torch.float64, device=sets.device)
    return (10.0 - loss(set_models(sets, sizes, models), owner).to(torch.float64)) / 10.0


def add_probability(a: torch.Tensor, b: torch.Tensor, tie: float | torch.Tensor) -> torch.Tensor:
    """p of adding the candidate from the gains ``a`` (adding it to X) and ``b`` (removing it from Y):
    ``a⁺ / (a⁺ + b⁺)``, 1 when both are 0 (add), ``tie`` (a number, or one a row) when both are equal and
    positive."""
    ap, bp = a.clamp_min(0), b.clamp_min(0)
    p = ap / (ap + bp).where(ap + bp > 0, torch.ones_like(ap))
    tied = torch.as_tensor(tie, dtype=p.dtype, device=p.device).expand_as(p)
    return torch.where(ap == bp, torch.where(ap == 0, torch.ones_like(p), tied), p)


def search_order(seed: int, round_: int, ids: torch.Tensor, pool: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order [C, m], valid [C, m])``: each client's pool but itself (bool ``pool [C, n]``) in increasing key
    ``uniform(seed, round, "dpfl_order", i, j)`` (a uniform shuffle), m the largest such pool."""
    C, n = pool.shape
    keys = rng.client_keys(seed, round_, ORDER, ids.cpu(), n).to(pool.device)
    rows = torch.arange(C, device=pool.device)
    others = pool.clone()
    others[rows, ids.to(pool.device)] = False
    keys = torch.where(others, keys, torch.full_like(keys, 2.0))
    m = int(others.sum(1).max()) if C else 0
    low, order = torch.sort(keys, dim=1, stable=True)
    return order[:, :m], low[:, :m] < 2.0


def double_greedy(pool: torch.Tensor, ids: torch.Tensor, sizes: torch.Tensor, models: torch.Tensor,
                  loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], seed: int, round_: int,
                  budget: int, tie: float, previous: bool = False) -> torch.Tensor:
    """The randomized double greedy of every own client at once: bool ``[C, n]`` X_i (the client itself
    included) from its ``pool`` (bool ``[C, n]``, itself included), ``ids`` ``[C]`` the clients' global ids,
    ``models [n, P]`` every client's after training, ``sizes [n]`` the weights of an average, ``loss`` the
    validation loss (models, local owner).  Step s scores the two sets of every client still searching.
    ``previous``: a tie of positive gains takes the row's p of the step before (0 at the first), not ``tie``."""
    C, n = pool.shape
    dev = pool.device
    rows = torch.arange(C, device=dev)
    X = torch.zeros(C, n, dtype=torch.bool, device=dev)
    X[rows, ids.to(dev)] = True
    Y = pool.clone() | X
    both = rewards(torch.cat([X, Y]), torch.cat([rows, rows]), sizes, models, loss)
    rX, rY = both[:C], both[C:]
    order, valid = search_order(seed, round_, ids, Y)
    done = torch.zeros(C, dtype=torch.bool, device=dev)
    last = torch.zeros(C, dtype=torch.float64, device=dev)   # each row's p of its step before
    for s in range(order.shape[1]):
        act = (valid[:, s] & ~done).nonzero().flatten()
        if not len(act):
            break
        z = order[act, s]
        Xz, Yz = X[act].clone(), Y[act].clone()
        Xz[torch.arange(len(act), device=dev), z] = True
        Yz[torch.arange(len(act), device=dev), z] = False
        r = rewards(torch.cat([Xz, Yz]), torch.cat([act, act]), sizes, models, loss)
        rXz, rYz = r[:len(act)], r[len(act):]
        p = add_probability(rXz - rX[act], rYz - rY[act], last[act] if previous else tie)
        last[act] = p
        add = rng.uniform(seed, round_, COIN, ids[act].cpu(), s).to(dev) < p
        X[act] = torch.where(add[:, None], Xz, X[act])
        Y[act] = torch.where(add[:, None], Y[act], Yz)
        rX[act] = torch.where(add, rXz, rX[act])
        rY[act] = torch.where(add, rY[act], rYz)
        done |= X.sum(1) >= budget
    return X


def greedy(pool: torch.Tensor, ids: torch.Tensor, sizes: torch.Tensor, models: torch.Tensor,
           loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], budget: int) -> torch.Tensor:
    """The plain constrained greedy of every own client at once (the reference's
    non_monotone_constrained_greedy): from X = {i}, up to B − 1 times, the candidate z of ``pool`` of largest
    ``R(X ∪ {z}) − R(X)`` (ties to the lower index) joins X while that gain is >= 0.  Bool ``[C, n]``; the
    arguments as :func:`double_greedy`'s.  A step scores every candidate of every client still adding, in
    chunks of 2·C sets."""
    C, n = pool.shape
    dev = pool.device
    rows = torch.arange(C, device=dev)
    X = torch.zeros(C, n, dtype=torch.bool, device=dev)
    X[rows, ids.to(dev)] = True
    r = rewards(X, rows, sizes, models, loss)
    done = torch.zeros(C, dtype=torch.bool, device=dev)
    for _ in range(budget - 1):
        cand = pool & ~X & ~done[:, None]
        row, col = cand.nonzero(as_tuple=True)   # by row, then by increasing index
        if not len(row):
            break
        sets = X[row]
        sets[torch.arange(len(row), device=dev), col] = True
        got = torch.cat([rewards(sets[a:a + 2 * C], row[a:a + 2 * C], sizes, models, loss)
                         for a in range(0, len(row), 2 * C)])
        gain = got - r[row]
        best = torch.full((C,), -math.inf, dtype=gain.dtype, device=dev).scatter_reduce(0, row, gain, "amax")
        top = gain == best[row]
        pick = torch.full((C,), n, dtype=torch.int64, device=dev).scatter_reduce(0, row[top], col[top], "amin")
        add = (pick < n) & (best >= 0)
        chosen = col == pick[row]   # one (row, pick) a row that adds
        reward = r.clone()
        reward[row[chosen]] = got[chosen]
        X[rows[add], pick[add]] = True
        r = torch.where(add, reward, r)
        done |= ~add
    return X


def sequential_average(sets: torch.Tensor, sizes: torch.Tensor, models: torch.Tensor) -> torch.Tensor:
    """``[n, P]``: every client's set average (bool ``sets [n, n]``, each with itself) taken client by client in
    index order, each from the models of the clients before it as already averaged and of the others as they are
    (the reference's loop): ``(I − L) X' = (A − L) X``, A the rows' weights, L its part below the diagonal, one
    triangular solve of the whole system (the same numbers on every process)."""
    w = sets.to(torch.float64) * sizes.to(torch.float64)[None, :]
    a = (w / w.sum(1, keepdim=True)).to(models.dtype)
    lower = torch.tril(a, diagonal=-1)
    eye = torch.eye(len(a), dtype=models.dtype, device=models.device)
    return torch.linalg.solve_triangular(eye - lower, (a - lower) @ models, upper=False, unitriangular=True)


@dataclass
class DpflState:
    pool: torch.Tensor = client_rows()     # [C, n] bool: whom a client's next search considers (itself included)
    chosen: torch.Tensor = client_rows()   # [C, n] bool: the set it chose last, itself left out (none yet: empty)
    fetched: torch.Tensor | None = round_only(default=None)   # [C, n] bool: the models its search read this round


@register
@dataclass
class Dpfl(PeerAlgorithm):
    """DPFL's round (see the module docstring)."""

    dpfl: DpflConfig = field(default_factory=DpflConfig)

    name = "dpfl"
    report_position = 19
    # column_exchange stays False: a search scores averages of whole models on the client's validation split
    sections = {"dpfl": DpflConfig}
    validation_key = "dpfl.validation"

    @classmethod
    def from_config(cls, cfg) -> "Dpfl":
        return cls(cfg.dpfl)

    @property
    def validation_share(self) -> float:
        """``dpfl.validation``: each client's validation split, on which its search scores a set."""
        return float(self.dpfl.validation)

    def init(self, ctx: Context) -> DpflState:
        C, n = len(ctx.client_ids), ctx.n
        return DpflState(pool=torch.ones(C, n, dtype=torch.bool, device=ctx.device),
                         chosen=torch.zeros(C, n, dtype=torch.bool, device=ctx.device))

    def sizes(self, ctx: Context) -> torch.Tensor:
        """``[n]`` float64 every client's weight in an average: its training examples (``data_size``; summed over
        the processes) or 1 (``uniform``)."""
        if self.dpfl.weights == "uniform":
            return torch.ones(ctx.n, dtype=torch.float64, device=ctx.device)
        share = torch.zeros(ctx.n, dtype=torch.float64, device=ctx.device)
        if ctx.train_examples is None:
            raise ValueError("dpfl.weights=data_size needs ctx.train_examples (the runner gives it)")
        share[ctx.own_rows] = ctx.train_examples.to(device=ctx.device, dtype=torch.float64)
        return ctx.all_reduce(share)

    def candidates(self, state: DpflState, ctx: Context, t: int) -> torch.Tensor:
        """Bool ``[C, n]``: the pool each own client searches in round ``t``: its pool, kept to its graph
        neighbours and the models that arrived (an offline client searches nothing: itself alone)."""
        pool = state.pool.clone()
        reach = ctx.reach(t)
        if reach is not None:
            pool &= reach.mask().to(pool.device)
        delivery = ctx.delivery(t)
        pool = answering(pool, delivery)
        if delivery is not None:
            pool &= delivery.own_online().to(pool.device)[:, None]
        pool[torch.arange(len(pool), device=pool.device), ctx.client_ids.to(pool.device)] = True
        return pool

    def select(self, state: DpflState, ctx: Context, view: RoundView) -> tuple[DpflState, torch.Tensor]:
        t = view.round
        nobody = torch.zeros_like(state.chosen)
        if not search_round(self.dpfl, t):
            return dataclasses.replace(state, fetched=nobody), nobody
        sizes = self.sizes(ctx)
        pool = self.candidates(state, ctx, t)
        ids = ctx.client_ids.to(ctx.device)
        if self.dpfl.search == "greedy":
            X = greedy(pool, ids, sizes, view.all_after, ctx.val_loss, self.dpfl.budget)
        else:
            X = double_greedy(pool, ids, sizes, view.all_after, ctx.val_loss, ctx.seed, t, self.dpfl.budget,
                              self.dpfl.tie, self.dpfl.tie_rule == "previous")
        own = torch.arange(len(X), device=X.device), ctx.client_ids.to(X.device)
        chosen = X.clone()
        chosen[own] = False
        fetched = pool.clone()
        fetched[own] = False
        new_pool = X if self.dpfl.pool == "frozen_first" and t == self.dpfl.start else state.pool
        return DpflState(pool=new_pool, chosen=chosen, fetched=fetched), chosen

    def contacted(self, state: DpflState, round_: int) -> torch.Tensor | None:
        return state.fetched

    def neighbor_list(self, state: DpflState, averaged: Choice) -> Choice:
        """The set a client chose last (its averaging partners in a search round, kept between searches)."""
        return state.chosen

    def aggregate(self, state: DpflState, ctx: Context, view: RoundView) -> tuple[DpflState, RoundResult]:
        whole = view.all_after   # held before the base's gossip lets the view go
        state, result = super().aggregate(state, ctx, view)
        jacobi = self.dpfl.average == "jacobi"
        if not search_round(self.dpfl, view.round) or (jacobi and self.dpfl.weights == "uniform"):
            return state, result   # the base's equally weighted mean (a client alone keeps its model)
        assert isinstance(result.averaged, torch.Tensor)   # select's bool [C, n] mask, kept to what arrived
        sets = result.averaged.clone()
        sets[torch.arange(len(sets), device=sets.device), ctx.client_ids.to(sets.device)] = True
        sizes = self.sizes(ctx)
        if jacobi:
            models = set_models(sets, sizes, whole)
        else:   # every client's set, on every process, for the whole system
            every = torch.zeros(ctx.n, ctx.n, dtype=torch.float32, device=sets.device)
            every[ctx.own_rows] = sets.to(torch.float32)
            models = sequential_average(ctx.all_reduce(every) > 0, sizes, whole)[ctx.own_rows]
        models = keep_personal(models, view.after, ctx.personal)
        return state, dataclasses.replace(result, models=models)
