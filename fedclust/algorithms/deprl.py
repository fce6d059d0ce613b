"""DePRL, Decentralized Personalized Representation Learning, as the peer
algorithm ``deprl``: decentralized SGD on the shared body (the
representation) only; each client's head stays its own, and local training
updates the head with the body frozen, then the body with the head frozen.

Round t, for client i:

1. local training in two phases, one momentum buffer throughout:
   ``deprl.head_epochs`` epochs of the head with the body frozen, then
   ``deprl.body_epochs`` epochs of the body with the head frozen
   (:attr:`fedclust.algorithms.base.RoundPlan.phases`);
2. ``φ_i ←`` the uniform mean of the bodies of ``{i} ∪ N_i(t)``, ``N_i(t)``
   its neighbours in the round's graph (``network.graph``; on the complete
   graph, a fresh random ``deprl.degree``-regular graph drawn each round from
   (seed, round), as the Facade benchmark runs it); the head ``h_i`` stays
   as trained.

With ``deprl.final_allreduce`` (default false), after the gossip of the last
round every client online then takes the mean of their bodies, its head
kept, as the Facade benchmark's DePRL ends.

A client is evaluated with its body and its own head; its neighbour list is
the round's graph neighbours; it has no cluster assignment.  Where fedclust
departs from the reference code and why: docs/algorithms.md, "DePRL".

Paper: G. Xiong, G. Yan, S. Wang, J. Li, "DePRL: Achieving Linear Convergence Speedup in Personalized
Decentralized Learning with Shared Representations", AAAI 2024, https://arxiv.org/abs/2312.10815; reference code
GYan58/AAAI24-DePRL.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from fedclust.algorithms.base import (
    Context,
    PeerAlgorithm,
    RoundPlan,
    RoundResult,
    RoundView,
    RunFacts,
    keep_personal,
)
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
from fedclust.peers import PeerIndex
from fedclust.schema import at_least, option


@dataclass
class DeprlConfig:
    """The ``deprl`` section (docs/algorithms.md, "DePRL")."""

    head: list = head_option("the personal head: tensor names, module prefixes or head (the model's last layer); "
                             "the rest is the shared body")
    head_epochs: int = option(3, "epochs of the head a round, the body frozen (the reference's E_h = 3), >= 1")
    body_epochs: int = option(1, "epochs of the body a round after the head's, the head frozen (the reference's "
                                 "1), >= 1")
    degree: int = degree_option("the Facade benchmark")
    final_allreduce: bool = final_allreduce_option(
        "the bodies", "sacs-epfl/facade node/DPSGDWithPeerSamplerNIID.py 333-334, 581-627")

    def validate(self, cfg) -> None:
        at_least("deprl.head_epochs", self.head_epochs, 1, "the head trains at least one epoch a round")
        at_least("deprl.body_epochs", self.body_epochs, 1, "the body trains at least one epoch a round")
        check_head("deprl", self.head)
        check_degree("deprl", self.degree, cfg)


@register
@dataclass
class Deprl(PeerAlgorithm):
    """DePRL's round (see the module docstring)."""

    head: tuple[str, ...]       # the head's tensor names
    body: tuple[str, ...]       # the others
    head_columns: tuple[tuple[int, int], ...]
    deprl: DeprlConfig = field(default_factory=DeprlConfig)
    rounds: int = 0             # the run's last round (deprl.final_allreduce)

    name = "deprl"
    report_position = 17
    choice_masks = False   # index lists: the round's graph neighbours
    column_exchange = True   # the gossip of the body reads the models through view.blocks
    sections = {"deprl": DeprlConfig}

    @classmethod
    def from_config(cls, cfg, facts: RunFacts) -> "Deprl":  # type: ignore[override]  # takes the run's facts
        layout = facts.layout
        picked = head_tensors("deprl.head", cfg.deprl.head, layout)
        return cls(head=tuple(layout.names[k] for k in picked),
                   body=tuple(name for k, name in enumerate(layout.names) if k not in picked),
                   head_columns=layout.column_ranges(picked), deprl=cfg.deprl, rounds=cfg.rounds)

    @classmethod
    def check_run(cls, cfg, facts: RunFacts) -> None:
        head_tensors("deprl.head", cfg.deprl.head, facts.layout)

    def plan(self, state, ctx: Context, round_: int, models: torch.Tensor):
        """The head with the body frozen, then the body with the head frozen (step 1)."""
        return state, RoundPlan(start=models, phases=((self.deprl.head_epochs, self.body),
                                                      (self.deprl.body_epochs, self.head)))

    def select(self, state, ctx: Context, view: RoundView) -> tuple[None, PeerIndex]:
        """Every neighbour of the round's graph (step 2)."""
        return state, graph_neighbours(ctx, view.round, self.deprl.degree, "deprl")

    def aggregate(self, state, ctx: Context, view: RoundView) -> tuple[Any, RoundResult]:
        """The gossip of the body; the head (and share.personal's tensors) as each client trained it; after the
        last round with ``deprl.final_allreduce``, the final all-reduce of the bodies."""
        own = dataclasses.replace(ctx, personal=tuple(sorted(set(ctx.personal) | set(self.head_columns))))
        state, result = super().aggregate(state, own, view)
        if self.deprl.final_allreduce and view.round == self.rounds:
            result = final_body_mean(own, view.round, result)
        return state, result


def final_body_mean(ctx: Context, t: int, result: RoundResult) -> RoundResult:
    """The final all-reduce after round ``t``: every member's (:func:`final_members`) model the mean of the
    members' models, its ``ctx.personal`` columns (the head, share.personal's) kept; each member receives the
    others' models.  Plain sums in client order: the same bits on any number of processes."""
    members = final_members(ctx, t)
    sums, counts = group_sums(ctx, result.models, torch.where(members, 0, -1), 1)
    mine = members[ctx.client_ids.cpu()].to(result.models.device)
    if not int(counts[0]):
        return result
    models = result.models.clone()
    models[mine] = (sums[0] / float(counts[0])).to(models.dtype)
    models = keep_personal(models, result.models, ctx.personal)
    return received_with(dataclasses.replace(result, models=models), mine, int(counts[0]))

