"""FedAvg and FedProx server/client math (docs/algorithms.md; FedGroup paper §II-A).

- FedAvg (FedGroup paper Algorithm 1, line 8): the new global model is the
  data-size weighted average of the clients' models,
  ``w_{t+1} = w_t + Σ_i (n_i/n) Δw_i = Σ_i (n_i/n) w_i`` with ``n = Σ_i n_i``
  over the clients that took part.
- FedProx (``fedprox.py``) is FedAvg whose clients add ``μ (w − w^t)`` to
  every local gradient (the proximal term is applied by the engine's local
  SGD, :func:`fedclust.engine.train.train_round`, for every algorithm that
  plans an anchor).

Client models are stacked ``[C, P]`` (C clients, P flat parameters).

The averaging and participation math every centralized method shares is in
:mod:`fedclust.algorithms.aggregation`; :func:`fedclust.algorithms.base.server_result`
builds their round results.

Conventions of the centralized methods (docs/algorithms.md):
- Participation: the ``ceil(p·n)`` clients with the lowest counter-based
  keys ``rng.uniform(seed, t, "participation", i, 0)`` take part in round t
  (every client when p = 1), identical on every rank.  The runner trains
  every client; only participants' trained models enter the server's
  averages, the others keep the model they were sent.
- Data sizes: every client holds ``data.train_size`` samples (docs/algorithms.md), so
  the papers' ``n_i``-weighted averages are plain means.
- Communication (docs/algorithms.md, in models): a participant receives what the
  server sends it for training (1 model; IFCA: all K) and uploads one;
  non-participants receive nothing.  ``server_received``/``server_sent``
  are these totals.  Evaluating a client with its cluster's model is not
  counted as traffic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust.algorithms.aggregation import participants, weighted_average
from fedclust.algorithms.base import Algorithm, Context, RoundPlan, RoundView, server_result
from fedclust.algorithms.registry import register


@dataclass
class FedAvgState:
    model: torch.Tensor   # [P] the global model w (replicated)


@register
@dataclass
class FedAvg(Algorithm):
    """FedAvg round (FedGroup paper Algorithm 1).

    State: the global model ``w [P]`` (replicated).  Plan: every client
    trains from ``w`` (FedProx: with the proximal term ``μ/2‖·−w‖²``).
    Aggregate: ``w ← mean`` of the participants' trained models; every
    client then holds ``w`` and is evaluated with it; one cluster."""

    participation: float = 1.0
    mu: float = 0.0

    name = "fedavg"
    report_position = 7
    paper_results = {("synthetic", None, 4): (30.35, 0.05)}

    @classmethod
    def from_config(cls, cfg) -> "FedAvg":
        return cls(participation=cfg.participation)

    def init(self, ctx: Context) -> FedAvgState:
        return FedAvgState(ctx.w0.detach().clone())

    def plan(self, state: FedAvgState, ctx: Context, round_: int, models: torch.Tensor):
        start = state.model.expand(len(ctx.client_ids), -1)
        return state, RoundPlan(start=start, anchor=start if self.mu > 0 else None, mu=self.mu)

    def aggregate(self, state: FedAvgState, ctx: Context, view: RoundView):
        active = participants(ctx.seed, view.round, ctx.n, self.participation, view.all_after.device)
        w = weighted_average(view.all_after[active])
        C = len(ctx.client_ids)
        return FedAvgState(w), server_result(ctx, w.expand(C, -1).clone(),
                                             torch.zeros(ctx.n, dtype=torch.int64, device=w.device),
                                             active.to(torch.float64), int(active.sum()))
