"""FedAvg (McMahan et al., AISTATS 2017), as the server algorithm ``fedavg``:
every round each participant trains the global model and the server averages
their trained models; FedProx (``fedprox.py``) adds a proximal term.  The
rules every centralized method shares (participation, data sizes, traffic):
docs/algorithms.md, "Centralized rivals: common rules"; their averaging math:
:mod:`fedclust.algorithms.aggregation`.

Paper: H. B. McMahan, E. Moore, D. Ramage, S. Hampson, B. Agüera y Arcas, "Communication-Efficient
Learning of Deep Networks from Decentralized Data", AISTATS 2017, https://arxiv.org/abs/1602.05629
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust.algorithms.aggregation import average_rows, participants, trainers
from fedclust.algorithms.base import Context, RoundPlan, RoundView, ServerMethod, server_result
from fedclust.algorithms.registry import register


@dataclass
class FedAvgState:
    model: torch.Tensor   # [P] the global model w (replicated)


@register
@dataclass
class FedAvg(ServerMethod):
    """FedAvg's round (FedGroup paper Algorithm 1, line 8: ``w_{t+1} = Σ_i (n_i/n) w_i``
    over the participants, a plain mean since every client holds as many samples).

    State: the global model ``w [P]`` (replicated).  Plan: every client
    trains from ``w`` (FedProx: with the proximal term ``μ/2‖·−w‖²``).
    Aggregate: ``w ← mean`` of the participants' trained models; every
    client then holds ``w`` and is evaluated with it; one cluster."""

    participation: float = 1.0

    name = "fedavg"
    column_exchange = True   # the average is column by column (config exchange_mb)
    report_position = 7
    paper_results = {("synthetic", None, 4): (30.35, 0.05)}

    @property
    def mu(self) -> float:
        """The proximal weight of local training: none (FedProx: ``fedprox.mu``)."""
        return 0.0

    def init(self, ctx: Context) -> FedAvgState:
        return FedAvgState(ctx.w0.detach().clone())

    def plan(self, state: FedAvgState, ctx: Context, round_: int, models: torch.Tensor):
        start = state.model.expand(len(ctx.client_ids), -1)
        return state, RoundPlan(start=start, anchor=start if self.mu > 0 else None, mu=self.mu,
                                trains=trainers(ctx.seed, round_, ctx.n, self.participation, ctx.online(round_)))

    def aggregate(self, state: FedAvgState, ctx: Context, view: RoundView):
        active = participants(ctx.seed, view.round, ctx.n, self.participation, ctx.device, ctx.online(view.round))
        w = average_rows(view, active)
        C = len(ctx.client_ids)
        return FedAvgState(w), server_result(ctx, w.expand(C, -1).clone(),
                                             torch.zeros(ctx.n, dtype=torch.int64, device=w.device),
                                             active.to(torch.float64), int(active.sum()))
