"""Facade, as the peer algorithm ``facade``: every client keeps a shared core
and k heads; it trains the core with the head that fits its data best and
gossips the core with its graph neighbours, while a head is averaged only
with the copies of the same index that neighbours trained.

Round t, for client i (``H`` the head's columns, the core the others):

0. warm-up, t <= ``facade.warmup``: plain decentralized SGD of whole models
   over the round's graph; every head is a copy of the model's head;
1. ``a_i = argmin_j L_i(core_i ∥ H_i[j])``, the mean loss over its training
   set; exact ties (the heads are copies right after the warm-up) go to the
   head of lowest key ``uniform(seed, t, "facade_tie", i, j)``;
2. local training of ``core_i ∥ H_i[a_i]`` (the run's training settings);
   ``H_i[a_i]`` becomes the trained head;
3. ``core_i ←`` the mean of the cores of ``{i} ∪ N_i(t)``; for every j,
   ``H_i[j] ← (H_i[j] + Σ_{l ∈ N_i, a_l = j} H_l) / (1 + |{l ∈ N_i: a_l = j}|)``
   (a head nobody sent stays).

``N_i(t)`` is the round's graph (``network.graph``; on the complete graph a
fresh random ``facade.degree``-regular graph from (seed, round), as the
reference runs it).  A client is evaluated with ``core_i ∥ H_i[a_i]`` after
the round (``facade.report_head=lowest_test_loss``: with the head of lowest
test loss, the reference code's report, an oracle); its cluster (ARI) is
``a_i``, its neighbour list the neighbours that trained the same head.
``accuracy_oracle_head`` also reports the best of its heads' test accuracies.
With ``facade.final_allreduce``, after the last round every client online
then takes the mean of their cores, and its heads the same merge as step 3
with every such client as a neighbour, as the reference ends.  Where
fedclust departs from the reference code: docs/algorithms.md, "Facade".

Paper: S. Biswas, M. de Vos, A.-M. Kermarrec, R. Pires, R. Sharma, M. Vujasinovic, "Fair Decentralized Learning"
(Facade), SaTML 2025, https://arxiv.org/abs/2410.02541; reference code sacs-epfl/facade ("IDCA").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import torch

from fedclust import rng
from fedclust.algorithms.aggregation import gossip_view
from fedclust.algorithms.base import Context, PeerAlgorithm, RoundPlan, RoundResult, RoundView, RunFacts, client_rows
from fedclust.algorithms.cluster_models import best_of_k, chosen_model_result, merge_copies
from fedclust.algorithms.heads import (
    check_degree,
    check_head,
    degree_option,
    final_allreduce_option,
    final_members,
    graph_neighbours,
    group_sums,
    head_option,
    head_tensors,
    received_with,
)
from fedclust.algorithms.registry import register
from fedclust.errors import ConfigError
from fedclust.network import delivered, within
from fedclust.peers import PeerIndex
from fedclust.schema import at_least, option


@dataclass
class FacadeConfig:
    """The ``facade`` section (docs/algorithms.md, "Facade")."""

    heads: int = option(2, "k, the heads every client keeps (the reference's default: the number of clusters), >= 1")
    head: list = head_option("the head's tensors: names, module prefixes or head (the model's last layer); the "
                             "rest is the shared core")
    warmup: int = option(10, "rounds of plain decentralized SGD of whole models first, every head a copy (the "
                             "reference's share_all_for, 10 on CIFAR-10), >= 0")
    degree: int = degree_option("the reference")
    report_head: Literal["current", "lowest_test_loss"] = option(
        "current", "the head a client is evaluated with: current (a_i, the head it chose and trained in the "
        "round) or lowest_test_loss (the one of lowest test loss, the reference's report: an oracle)")
    final_allreduce: bool = final_allreduce_option(
        "the cores (and each head index with the copies of it sent)",
        "sacs-epfl/facade node/DPSGDNodeIDCA.py 570-571, 947-1000")

    def validate(self, cfg) -> None:
        at_least("facade.heads", self.heads, 1, "the heads a client keeps, e.g. the clusters you expect")
        at_least("facade.warmup", self.warmup, 0, "rounds of plain decentralized SGD first (0: none)")
        check_head("facade", self.head)
        check_degree("facade", self.degree, cfg)
        if self.report_head == "lowest_test_loss" and cfg.data.validation > 0:
            raise ConfigError("facade.report_head", self.report_head,
                              "picks the head by the test set, while data.validation keeps the models it holds: "
                              "give facade.report_head=current with data.validation, or data.validation=0")


def head_mask(columns: tuple[tuple[int, int], ...], P: int, device) -> torch.Tensor:
    """bool ``[P]``: True at the head's columns."""
    out = torch.zeros(P, dtype=torch.bool, device=device)
    for a, b in columns:
        out[a:b] = True
    return out


def choose_heads(losses: torch.Tensor, seed: int, round_: int, clients: torch.Tensor) -> torch.Tensor:
    """Step 1: ``[C]`` the head of lowest loss (``losses [C, k]``), exact ties to the lowest key
    ``uniform(seed, round, "facade_tie", i, j)`` among the tied."""
    k = losses.shape[1]
    keys = rng.uniform(seed, round_, "facade_tie", clients[:, None].cpu(), torch.arange(k)[None, :])
    tied = losses == losses.min(dim=1, keepdim=True).values
    keys = torch.where(tied.cpu(), keys, torch.full_like(keys, 2.0))
    return keys.argmin(dim=1).to(losses.device)


@dataclass
class FacadeState:
    heads: torch.Tensor = client_rows()    # [C, k, H] every client's k heads
    choice: torch.Tensor = client_rows()   # [C] int64 the head it trained last (a_i)


@register
@dataclass
class Facade(PeerAlgorithm):
    """Facade's round (see the module docstring)."""

    columns: tuple[tuple[int, int], ...]   # the head's flat columns
    facade: FacadeConfig = field(default_factory=FacadeConfig)
    rounds: int = 0   # the run's last round (facade.final_allreduce)

    name = "facade"
    report_position = 18
    choice_masks = False     # index lists: the round's graph neighbours
    column_exchange = True   # the core's gossip and the heads' merge read the models through view.blocks
    gathers_labels = True    # every client's a_j travels with the models
    personal_layers = False  # its heads are merged by index, its core gossiped
    sections = {"facade": FacadeConfig}
    cluster_count_key = "facade.heads"
    extra_accuracies = ("accuracy_oracle_head",)

    @classmethod
    def from_config(cls, cfg, facts: RunFacts) -> "Facade":  # type: ignore[override]  # takes the run's facts
        algo = cls(facts.layout.column_ranges(head_tensors("facade.head", cfg.facade.head, facts.layout)), cfg.facade,
                   cfg.rounds)
        algo.kept_numbers = cfg.facade.heads * algo._width()   # [C, k, H] heads, kept and made anew each round
        return algo

    @classmethod
    def check_run(cls, cfg, facts: RunFacts) -> None:
        head_tensors("facade.head", cfg.facade.head, facts.layout)

    def _width(self) -> int:
        return sum(b - a for a, b in self.columns)

    def _models(self, core: torch.Tensor, heads: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        """``[C, P]``: ``core`` with its head columns replaced by ``heads [C, H]`` (``inplace``: in ``core``)."""
        out = core if inplace else core.clone()
        at = 0
        for a, b in self.columns:
            out[:, a:b] = heads[:, at:at + b - a]
            at += b - a
        return out

    def _head_of(self, models: torch.Tensor) -> torch.Tensor:
        """``[C, H]``: the head columns of ``models [C, P]``."""
        return torch.cat([models[:, a:b] for a, b in self.columns], dim=1)

    def init(self, ctx: Context) -> FacadeState:
        C, k = len(ctx.client_ids), self.facade.heads
        head = self._head_of(ctx.w0[None])   # every head starts as the model's
        return FacadeState(heads=head[:, None].expand(C, k, -1).clone(),
                           choice=torch.zeros(C, dtype=torch.int64, device=ctx.w0.device))

    def warm(self, round_: int) -> bool:
        return round_ <= self.facade.warmup

    def plan(self, state: FacadeState, ctx: Context, round_: int, models: torch.Tensor):
        """Each client trains its core with the head of lowest training loss (step 1; head 0 in the warm-up)."""
        C = models.shape[0]
        if self.warm(round_):
            choice = torch.zeros(C, dtype=torch.int64, device=models.device)
            return state, RoundPlan(start=models, labels=choice)
        local = torch.arange(C, device=models.device)
        scratch = models.clone()   # one [C, P]: each head in turn, then the start
        losses = torch.stack([ctx.pair_loss(self._models(scratch, state.heads[:, j], inplace=True), local)
                              for j in range(self.facade.heads)], dim=1)   # k passes
        choice = choose_heads(losses, ctx.seed, round_, ctx.client_ids)
        rows = torch.arange(C, device=models.device)
        return state, RoundPlan(start=self._models(scratch, state.heads[rows, choice], inplace=True), labels=choice)

    def select(self, state, ctx: Context, view: RoundView) -> tuple[FacadeState, PeerIndex]:
        """Every neighbour of the round's graph."""
        return state, graph_neighbours(ctx, view.round, self.facade.degree, "facade")

    def unseen_candidates(self, saved: dict, weights: torch.Tensor) -> torch.Tensor:
        """Every client's core with each of its k heads, ``[n·k, P]`` (client 0's first; fedclust evaluate
        --unseen)."""
        heads = saved["clients"]["heads"]
        n, k = heads.shape[:2]
        core = weights.repeat_interleave(k, dim=0)
        return self._models(core, heads.reshape(n * k, -1).to(weights.dtype), inplace=True)

    def aggregate(self, state: FacadeState, ctx: Context, view: RoundView) -> tuple[FacadeState, RoundResult]:
        t = view.round
        _, neighbours = self.select(state, ctx, view)
        neighbours = within(neighbours, ctx.reach(t))
        delivery = ctx.delivery(t)
        neighbours = delivered(neighbours, delivery)   # nothing from or for a client offline, nothing lost
        labels = view.gathered_labels().to(ctx.device)   # [n] every client's a_j
        mine = labels[ctx.own_rows]
        rows = torch.arange(len(mine), device=ctx.device)
        models = gossip_view(neighbours, ctx.client_ids, view)   # the core's mean (step 3); heads below
        heads = state.heads.clone()
        if self.warm(t):   # whole models averaged; every head a copy of the averaged one
            heads[:] = self._head_of(models)[:, None]
        else:
            heads[rows, mine] = self._head_of(view.after).to(heads.dtype)   # the head it trained (step 2)
            heads = merge_copies(heads, neighbours, labels, view, self.columns, inplace=True)
            models = self._models(models, heads[rows, mine], inplace=True)
        choice = mine
        if delivery is not None:   # a client offline did nothing: its heads and choice stay
            offline = ~delivery.own_online().to(ctx.device)
            heads[offline] = state.heads[offline]
            choice = torch.where(offline, state.choice, mine)
        result = chosen_model_result(models.contiguous(), neighbours, labels, mine)
        if self.facade.final_allreduce and t == self.rounds:
            return self._final_allreduce(ctx, t, FacadeState(heads=heads, choice=choice), labels, result)
        return FacadeState(heads=heads, choice=choice), result

    def _final_allreduce(self, ctx: Context, t: int, state: FacadeState, labels: torch.Tensor,
                         result: RoundResult) -> tuple[FacadeState, RoundResult]:
        """After the last round, among the clients online then (the members): each member's core the members'
        mean; in the warm-up every head a copy of the mean model's, else for each index j a member's ``H_i[j] ←
        (H_i[j] + Σ_{l ≠ i member, a_l = j} H_l[j]) / (1 + their count)`` (``S_j / c_j`` where ``a_i = j``: its own
        copy is one of the ``c_j`` sent), a head nobody sent unchanged.  A member receives the others' models."""
        members = final_members(ctx, t)
        mine = members[ctx.client_ids.cpu()].to(ctx.device)
        count = int(members.sum())
        if not count:
            return state, result
        models, heads = result.models.clone(), state.heads.clone()
        core, _ = group_sums(ctx, models, torch.where(members, 0, -1), 1)
        models[mine] = (core[0] / count).to(models.dtype)
        if self.warm(t):
            heads[mine] = self._head_of(models[mine])[:, None].to(heads.dtype)
        else:
            rows = torch.arange(len(mine), device=ctx.device)
            groups = torch.where(members, labels.cpu(), -1)
            sums, counts = group_sums(ctx, heads[rows, state.choice], groups, self.facade.heads)
            for j in range(self.facade.heads):
                c = int(counts[j])
                if c:
                    merged = torch.where((state.choice == j)[:, None], sums[j] / c, (heads[:, j] + sums[j]) / (1 + c))
                    heads[:, j] = torch.where(mine[:, None], merged, heads[:, j])
            models[mine] = self._models(models[mine], heads[rows, state.choice][mine], inplace=True)
        return (FacadeState(heads=heads, choice=state.choice),
                received_with(dataclasses.replace(result, models=models), mine, count))

    def report_models(self, state: FacadeState, ctx: Context, data, models: torch.Tensor, score) -> torch.Tensor:
        """``facade.report_head``: current, the held ``core_i ∥ H_i[a_i]``; lowest_test_loss, ``core_i ∥ H_i[b_i]``,
        ``b_i`` the head of lowest mean test loss (the first of ties, as the reference's ``list.index(min)``)."""
        if self.facade.report_head == "current":
            return models
        C = models.shape[0]
        losses = torch.stack([score(self._models(models, state.heads[:, j]), data.test_x, data.test_y,
                                    data.test_counts)[1][:C] for j in range(self.facade.heads)], dim=1)
        best = torch.nan_to_num(losses, nan=float("inf")).argmin(dim=1).to(state.heads.device)
        return self._models(models, state.heads[torch.arange(C, device=best.device), best])

    def extra_accuracy(self, state: FacadeState, ctx: Context, data, models: torch.Tensor, accuracy: torch.Tensor,
                       score) -> dict[str, torch.Tensor]:
        """``accuracy_oracle_head``: each client's best test accuracy over its core with each of its heads (the
        reference code's figure: it picks by the test set, an oracle)."""
        return {"accuracy_oracle_head": best_of_k(accuracy, state.heads, data, score,
                                                  lambda j: self._models(models, state.heads[:, j]))}
