"""DFCA, IFCA without a server, as the peer algorithm ``dfca``: every client
keeps its own k cluster models (a bank ``[C, k, P]``), trains the one of
lowest loss on its training set, and exchanges it with a few random
partners; what it receives from a partner that chose cluster c is merged
into its own copy of model c.

Round t, for client i (``a_j`` the model client j chose this round):

1. ``a_i = argmin_c L_i(θ_i^c)``, the mean loss on its whole training set
   (ties to the lowest c);
2. local training of ``θ_i^{a_i}`` (the run's local training settings);
3. i draws ``m_i`` partners uniformly in ``{1 .. λ−1}`` and that many
   distinct peers uniformly (among its graph neighbours on a graph); an
   exchange is both ways, so i receives from ``R_i``: those it drew and
   those that drew it;
4. ``θ_i^c ← (θ_i^c + Σ_{j ∈ R_i, a_j = c} θ_j^{a_j}) / (1 + |{j ∈ R_i: a_j = c}|)``
   for every c (a model nobody sent stays).

A client holds, and is evaluated with, ``θ_i^{a_i}`` after the merge; its
cluster is ``a_i`` (ARI) and its neighbour list the partners that chose its
cluster (precision, recall).  ``accuracy_best_of_k`` also reports the best
of its k models on its test set, the reference code's (oracle) figure.
Where fedclust departs from the reference code and why:
docs/algorithms.md, "DFCA".

Shapes: bank ``[C, k, P]``, losses ``[C, k]``, choices int64 ``[C]`` or
``[n]``, partners :class:`fedclust.peers.PeerIndex` ``[C, m]``.

Paper: J. Kirch, S. Becker, T. Koketsu Rodrigues, S. Harmeling, "DFCA: Decentralized Federated Clustering
Algorithm", 2025, https://arxiv.org/abs/2510.15300 (the rules here read from the thesis implementation
jonaskir6/dfca: the paper's own code was not public).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import torch

from fedclust import rng
from fedclust.algorithms.base import Context, PeerAlgorithm, RoundPlan, RoundResult, RoundView, RunFacts, client_rows
from fedclust.algorithms.cluster_models import (
    assign_clusters,
    bank_losses,
    best_of_k,
    chosen_model_result,
    cluster_inits,
    merge_copies,
)
from fedclust.algorithms.registry import register
from fedclust.errors import ConfigError
from fedclust.network import delivered, keep_peers, within
from fedclust.peers import PeerIndex, incoming, union
from fedclust.schema import option

INIT_STREAM = "dfca_init"   # rng stream of the banks' init seeds

Init = Literal["global", "local"]


@dataclass
class DfcaConfig:
    """The ``dfca`` section (docs/algorithms.md, "DFCA")."""

    clusters: int = option(2, "k, the cluster models every client keeps, in [1, clients]",
        doc=("DFCA's k, the cluster models every client keeps, in [1, `clients`] (the reference's settings: the "
             "true number of clusters)"))
    partners: int = option(0, "λ: a client draws 1 .. λ-1 partners a round, uniformly; 0: the reference's "
                              "min(clients - 1, 50 if clients > 800 else 15)")
    init: Init = option("global", "global: every client starts from the same k models (DFCA-GI); local: each "
                                  "client draws its own k (DFCA-LI)")

    def validate(self, cfg) -> None:
        n = cfg.clients
        if not 1 <= self.clusters <= n:
            raise ConfigError("dfca.clusters", self.clusters, f"must lie in [1, clients = {n}]: the models a client "
                              "keeps, e.g. the number of clusters you expect (data.num_clusters)")
        if self.partners and not 2 <= self.partners <= n - 1:
            raise ConfigError("dfca.partners", self.partners, f"must be 0 (the reference's rule) or lie in [2, "
                              f"clients - 1 = {n - 1}]: a client draws 1 .. partners - 1 partners a round")
        if partner_bound(self.partners, n) < 2:
            raise ConfigError("clients", n, "DFCA needs at least 3 clients: each draws 1 .. λ-1 partners among the "
                              "others, λ = min(clients - 1, 15)")


def partner_bound(partners: int, n: int) -> int:
    """λ of a run: ``partners``, or for 0 the reference's ``min(n − 1, 50 if n > 800 else 15)``."""
    return partners if partners > 0 else min(n - 1, 50 if n > 800 else 15)


def partner_draws(seed: int, round_: int, n: int, bound: int, allowed=None) -> PeerIndex:
    """``[n, ·]``: the partners every client draws in round ``round_`` (the same on every process): client i
    draws ``m_i = 1 + ⌊u_i·(λ − 1)⌋`` (``u_i = rng.uniform(seed, round, "dfca_count", i, 0)``, so m_i is uniform
    in ``{1 .. λ−1}``), the ``m_i`` lowest keys ``rng.uniform(seed, round, "dfca_partner", i, j)`` among the
    others (``allowed``: the graph neighbours, a function of a chunk of rows, or None)."""
    everyone = torch.arange(n)
    top = PeerIndex.draw(seed, round_, "dfca_partner", everyone, n, bound - 1, allowed)   # λ−1 lowest keys
    count = 1 + torch.floor(rng.uniform(seed, round_, "dfca_count", everyone, 0) * (bound - 1)).long()
    count = count.clamp(max=bound - 1)
    keys = rng.uniform(seed, round_, "dfca_partner", everyone[:, None], top.idx)
    keys = torch.where(top.valid, keys, torch.full_like(keys, 2.0))
    rank = torch.argsort(torch.argsort(keys, dim=1, stable=True), dim=1)   # each peer's place among the row's keys
    return keep_peers(top, rank < count[:, None])


def exchange_partners(draws: PeerIndex, lo: int, hi: int) -> PeerIndex:
    """Whom clients ``lo .. hi − 1`` exchange with: the partners they drew and those that drew them."""
    mine = PeerIndex(draws.idx[lo:hi], draws.valid[lo:hi], draws.n)
    return union(mine, incoming(draws, lo, hi))


def merge_bank(bank: torch.Tensor, partners: PeerIndex, labels: torch.Tensor, view: RoundView,
               inplace: bool = False) -> torch.Tensor:
    """Step 4 of the round: ``bank [C, k, P]`` with each model c the mean of itself and every model received from
    a partner whose choice ``labels[j]`` is c (:func:`fedclust.algorithms.cluster_models.merge_copies` of whole
    models).  ``inplace``: into ``bank`` itself (a round then holds two banks, not three)."""
    return merge_copies(bank, partners, labels, view, inplace=inplace)


@dataclass
class DfcaState:
    bank: torch.Tensor = client_rows()   # [C, k, P] every client's k models


@register
@dataclass
class Dfca(PeerAlgorithm):
    """DFCA's round (see the module docstring)."""

    init_model: Callable[[int], torch.Tensor]
    dfca: DfcaConfig = field(default_factory=DfcaConfig)

    name = "dfca"
    report_position = 16
    choice_masks = False    # index lists: the round's partners
    column_exchange = True  # its merge of k models reads the partners' models through view.blocks
    gathers_labels = True   # every client's a_j travels with the models
    sections = {"dfca": DfcaConfig}
    cluster_count_key = "dfca.clusters"
    extra_accuracies = ("accuracy_best_of_k",)
    personal_layers = False   # its own merge of k models a client

    @classmethod
    def from_config(cls, cfg, facts: RunFacts) -> "Dfca":  # type: ignore[override]  # takes the run's facts
        algo = cls(facts.init, cfg.dfca)
        algo.kept_numbers = cfg.dfca.clusters * facts.layout.numel   # [C, k, P], kept and made anew each round
        return algo

    def init(self, ctx: Context) -> DfcaState:
        """DFCA-GI: every bank the same k models (``w0`` first, then the model's init under seeds of
        ``(seed, "dfca_init", c)``); DFCA-LI: client i's model c under ``rng.hash_ints(seed, i, "dfca_init", c,
        1)``, so a client's bank does not depend on the processes."""
        k, C = self.dfca.clusters, len(ctx.client_ids)
        if self.dfca.init == "global":
            shared = cluster_inits(ctx.w0, k, ctx.seed, self.init_model, stream=INIT_STREAM).to(ctx.w0)
            return DfcaState(bank=shared[None].expand(C, -1, -1).clone())
        rows = []
        for i in ctx.client_ids.tolist():   # C·k model builds, once per run (DFCA-LI)
            seeds = rng.hash_ints(ctx.seed, i, INIT_STREAM, torch.arange(k), 1)
            rows.append(torch.stack([self.init_model(int(s)).to(ctx.w0) for s in seeds]))
        return DfcaState(bank=torch.stack(rows) if rows else ctx.w0.new_zeros(0, k, ctx.w0.numel()))

    def plan(self, state: DfcaState, ctx: Context, round_: int, models: torch.Tensor):
        """Each client starts from its own model of lowest training loss (step 1); its choice travels with the
        models."""
        choice = assign_clusters(bank_losses(ctx, state.bank))
        rows = torch.arange(len(choice), device=choice.device)
        return state, RoundPlan(start=state.bank[rows, choice], labels=choice)

    def partners(self, ctx: Context, round_: int) -> PeerIndex:
        """This process's clients' partners of the round, as drawn (step 3), among the graph's neighbours."""
        g = ctx.graph(round_)
        everyone = torch.arange(ctx.n)
        allowed = None if g is None else (lambda a, b: g.rows(everyone[a:b], "cpu"))
        draws = partner_draws(ctx.seed, round_, ctx.n, partner_bound(self.dfca.partners, ctx.n), allowed)
        lo, hi = ctx.own_rows.start, ctx.own_rows.stop
        got = exchange_partners(draws, lo, hi)
        return PeerIndex(got.idx.to(ctx.device), got.valid.to(ctx.device), ctx.n)

    def select(self, state, ctx: Context, view: RoundView):
        return state, self.partners(ctx, view.round)

    def unseen_candidates(self, saved: dict, weights: torch.Tensor) -> torch.Tensor:
        """Every client's k cluster models, ``[n·k, P]`` (client 0's first; fedclust evaluate --unseen)."""
        bank = saved["clients"]["bank"]
        return bank.reshape(-1, bank.shape[-1])

    def aggregate(self, state: DfcaState, ctx: Context, view: RoundView) -> tuple[DfcaState, RoundResult]:
        t = view.round
        partners = within(self.partners(ctx, t), ctx.reach(t))
        delivery = ctx.delivery(t)
        partners = delivered(partners, delivery)   # nothing from or for a client offline, nothing lost
        labels = view.gathered_labels().to(ctx.device)   # [n] every client's a_j
        mine = labels[ctx.own_rows]
        rows = torch.arange(len(mine), device=ctx.device)
        bank = state.bank.clone()
        bank[rows, mine] = view.after.to(bank.dtype)   # the model each client trained (step 2)
        bank = merge_bank(bank, partners, labels, view, inplace=True)   # the round holds this bank and the last
        if delivery is not None:   # a client offline did nothing: its bank stays
            offline = ~delivery.own_online().to(ctx.device)
            bank[offline] = state.bank[offline]
        return DfcaState(bank=bank), chosen_model_result(bank[rows, mine].contiguous(), partners, labels, mine)

    def extra_accuracy(self, state: DfcaState, ctx: Context, data, models: torch.Tensor, accuracy: torch.Tensor,
                       score) -> dict[str, torch.Tensor]:
        """``accuracy_best_of_k``: each client's best test accuracy over its k models (the reference code's
        figure: it picks by the test set, an oracle)."""
        return {"accuracy_best_of_k": best_of_k(accuracy, state.bank, data, score, lambda j: state.bank[:, j])}
