"""FedSPD, as the peer algorithm ``fedspd``: each client's data is a mixture
of S sources.  A client keeps S cluster models, assigns each of its training
examples to the model that fits it best, trains one cluster model a round on
that cluster's examples and averages it with its graph neighbours training
the same cluster; at the end its personal model is the data-weighted mix of
its S models, fine-tuned on all its data.

Rounds (S = ``fedspd.clusters``, F = ``fedspd.finetune_rounds``, R = ``rounds``):

- first pass, t = 1 .. S: every client trains cluster model s = t − 1 for
  ``fedspd.first_epochs`` epochs (the reference trains all S in its round 0);
- t = S + 1 .. R − F: a random disjoint split of the clients into S groups of
  ⌊n/S⌋ (keys ``uniform(seed, t, "fedspd_group", i)``; the n mod S left over
  sit the round out); a client of group s trains ``θ_i^s`` for
  ``train.local_epochs`` epochs;
- in both: a client trains on a fresh random ``fedspd.share`` of its examples
  of that cluster (keys ``uniform(seed, t, "fedspd_share", i, j)``), then
  ``θ_i^s ←`` the uniform mean of its own and its graph neighbours' fresh
  ``θ^s`` among those of the same group; after the round (from t = S on) every
  example goes to the model of lowest loss on it (ties to the lower s), and a
  cluster left with fewer than ``fedspd.min_examples`` of the client's
  examples takes the last ones of the largest;
- t = R − F + 1 .. R: the client's model is ``Σ_s π_i^s θ_i^s`` (π_i^s its
  share of examples in cluster s), trained alone on all its data for
  ``fedspd.finetune_epochs`` epochs a round (F rounds).

A client is evaluated with ``Σ_s π_i^s θ_i^s`` (its fine-tuned model in the
last F rounds); its neighbour list is the round's same-group neighbours, its
cluster ``argmax_s π_i^s`` as of the round's start.  The graph is
``network.graph``, or on the complete graph one random
``fedspd.degree``-regular graph for the run.  Where fedclust departs from the
reference code and why: docs/algorithms.md, "FedSPD".

Paper: H. Lin, O. Yağan, C. Joe-Wong, "FedSPD: A Soft-clustering Approach for Personalized Decentralized Federated
Learning", UAI 2025, https://arxiv.org/abs/2410.18862; reference code FedSPD_Anonymous_Submission.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from fedclust import rng
from fedclust.algorithms.aggregation import gossip_view
from fedclust.algorithms.base import Context, PeerAlgorithm, RoundPlan, RoundResult, RoundView, RunFacts, client_rows
from fedclust.algorithms.cluster_models import cluster_inits
from fedclust.algorithms.heads import check_degree, graph_neighbours
from fedclust.algorithms.registry import register
from fedclust.errors import ConfigError
from fedclust.network import delivered, keep_peers, within
from fedclust.peers import PeerIndex
from fedclust.schema import at_least, option

INIT_STREAM = "fedspd_init"


@dataclass
class FedspdConfig:
    """The ``fedspd`` section (docs/algorithms.md, "FedSPD")."""

    clusters: int = option(2, "S, the cluster models (sources) every client keeps, >= 1 (the reference's 2)")
    first_epochs: int = option(10, "epochs of each cluster model's first pass (rounds 1..S; the reference's 10)")
    share: float = option(0.9, "the share of its examples of a cluster a client trains on each round, a fresh "
                               "random draw, in (0, 1] (the reference's 0.9)")
    finetune_rounds: int = option(5, "the last rounds: the mixed model trained alone on all the client's data "
                                     "(the reference's 5 stages), >= 0")
    finetune_epochs: int = option(5, "epochs of each fine-tuning round (the reference's 5 a stage), >= 1")
    min_examples: int = option(10, "each cluster keeps at least this many of a client's examples (the "
                                   "reference's 10), >= 1")
    degree: int = option(6, "on network.graph=complete: the degree of one random regular graph for the run (the "
                            "reference's Erdős–Rényi 0.25 on 25 clients: about 6); a given network.graph is used as "
                            "it is")

    def validate(self, cfg) -> None:
        at_least("fedspd.clusters", self.clusters, 1, "the sources a client's data mixes, e.g. 2")
        at_least("fedspd.first_epochs", self.first_epochs, 1, "each cluster model trains at least one epoch first")
        at_least("fedspd.finetune_rounds", self.finetune_rounds, 0, "rounds of the final fine-tuning (0: none)")
        at_least("fedspd.finetune_epochs", self.finetune_epochs, 1, "each fine-tuning round trains at least one "
                 "epoch")
        at_least("fedspd.min_examples", self.min_examples, 1, "a cluster keeps at least one example")
        if not (math.isfinite(self.share) and 0 < self.share <= 1):
            raise ConfigError("fedspd.share", self.share, "must lie in (0, 1] (the reference's 0.9)")
        if cfg.rounds < self.clusters + self.finetune_rounds:
            raise ConfigError("fedspd.finetune_rounds", self.finetune_rounds, f"rounds = {cfg.rounds} must hold the "
                              f"first pass of the {self.clusters} cluster models and the {self.finetune_rounds} "
                              "rounds of fine-tuning: lower it or raise rounds")
        if self.clusters * self.min_examples > cfg.data.train_size:
            raise ConfigError("fedspd.min_examples", self.min_examples, f"{self.clusters} clusters of at least "
                              f"{self.min_examples} examples need data.train_size >= "
                              f"{self.clusters * self.min_examples}: lower it")
        check_degree("fedspd", self.degree, cfg)


def initial_split(seed: int, clients: torch.Tensor, counts: torch.Tensor, N: int, S: int) -> torch.Tensor:
    """``[C, N]`` the reference's first split of each client's examples into S clusters (main.py): with ``per =
    ⌊N_i/S⌋``, ``portion = per/(S+1)``, cluster s < S − 1 takes ``⌊(s+1)·portion⌋`` random examples of the first
    half and ``⌊(S−s)·portion⌋`` of the second, one after another; cluster S − 1 the rest.  Random here: the
    order of lowest key ``uniform(seed, 0, "fedspd_split", i, j)`` within each half."""
    C = len(clients)
    j = torch.arange(N)
    keys = rng.uniform(seed, 0, "fedspd_split", clients[:, None].cpu(), j[None, :])
    counts = counts.cpu()
    half = (counts // 2)[:, None]
    valid = j[None, :] < counts[:, None]
    first = j[None, :] < half
    out = torch.full((C, N), S - 1, dtype=torch.int64)
    portion = (counts // S).to(torch.float64) / (S + 1)
    for part, sizes in ((first & valid, [(s + 1) for s in range(S - 1)]),
                        (~first & valid, [(S - s) for s in range(S - 1)])):
        k = torch.where(part, keys, torch.full_like(keys, 2.0))
        rank = torch.argsort(torch.argsort(k, dim=1, stable=True), dim=1)   # place among the part's keys
        cum = torch.cumsum(torch.stack([torch.floor(m * portion) for m in sizes], dim=1), dim=1) if sizes else \
            torch.zeros(C, 0, dtype=torch.float64)
        cluster = (rank[:, :, None] >= cum[:, None, :]).sum(-1)   # blocks of the random order, in turn
        out = torch.where(part, torch.clamp(cluster, max=S - 1), out)
    return out


def keep_minimum(assign: torch.Tensor, valid: torch.Tensor, S: int, m: int) -> torch.Tensor:
    """The reference's rule after each assignment (train.py): for s = 0 .. S − 1 in turn, a cluster with fewer than
    ``m`` examples takes the ``m`` last (by index) of the largest cluster (the first of equals)."""
    assign = assign.clone()
    for s in range(S):
        counts = torch.stack([((assign == c) & valid).sum(1) for c in range(S)], dim=1)
        need = counts[:, s] < m
        if not bool(need.any()):
            continue
        donor = counts.argmax(1)
        theirs = (assign == donor[:, None]) & valid & (donor != s)[:, None]
        from_end = theirs.flip(1).cumsum(1).flip(1)   # the donor's examples at or after each place
        assign[need[:, None] & theirs & (from_end <= m)] = s
    return assign


def group_of(seed: int, round_: int, n: int, S: int) -> torch.Tensor:
    """``[n]``: round ``round_``'s group of every client, S disjoint groups of ⌊n/S⌋ by the order of keys
    ``uniform(seed, round, "fedspd_group", i)``; −1 for the n mod S left over (the same on every process)."""
    keys = rng.uniform(seed, round_, "fedspd_group", torch.arange(n), 0)
    rank = torch.argsort(torch.argsort(keys, stable=True), stable=True)
    size = n // S
    return torch.where(rank < S * size, rank // max(size, 1), torch.full_like(rank, -1))


@dataclass
class FedspdState:
    bank: torch.Tensor = client_rows()     # [C, S, P] every client's S cluster models
    assign: torch.Tensor = client_rows()   # [C, N] int64 the cluster of each training example


@register
@dataclass
class Fedspd(PeerAlgorithm):
    """FedSPD's round (see the module docstring)."""

    init_model: Callable[[int], torch.Tensor]
    rounds: int
    train_size: int
    fedspd: FedspdConfig = field(default_factory=FedspdConfig)

    name = "fedspd"
    report_position = 19
    choice_masks = False     # index lists: the round's same-group neighbours
    column_exchange = True   # its gossip reads the models through view.blocks
    gathers_labels = True    # every client's group (and cluster) travels with the models
    personal_layers = False  # its own models
    sections = {"fedspd": FedspdConfig}
    cluster_count_key = "fedspd.clusters"

    @classmethod
    def from_config(cls, cfg, facts: RunFacts) -> "Fedspd":  # type: ignore[override]  # takes the run's facts
        algo = cls(facts.init, cfg.rounds, cfg.data.train_size, cfg.fedspd)
        algo.kept_numbers = cfg.fedspd.clusters * facts.layout.numel   # [C, S, P], kept and made anew each round
        return algo

    @classmethod
    def phase_marks(cls, cfg) -> list[tuple[int, str]]:
        """Fine-tuning starts after round R − F (F = ``fedspd.finetune_rounds``); none where F = 0."""
        F = int(cfg.fedspd.finetune_rounds)
        if F <= 0:
            return []
        start = int(cfg.rounds) - F + 1
        return [(start - 1, f"fine-tuning from round {start}")]

    # -- which round is which ------------------------------------------------

    def stage(self, t: int) -> str:
        S, F = self.fedspd.clusters, self.fedspd.finetune_rounds
        if t > self.rounds - F:
            return "finetune"
        return "first" if t <= S else "groups"

    def groups(self, ctx: Context, t: int) -> torch.Tensor:
        """``[n]`` the cluster each client trains in round t (−1: it sits out)."""
        if self.stage(t) == "first":
            return torch.full((ctx.n,), t - 1, dtype=torch.int64)
        return group_of(ctx.seed, t, ctx.n, self.fedspd.clusters)

    def shares(self, state: FedspdState) -> torch.Tensor:
        """``[C, S]`` π_i^s, each client's share of examples in each cluster."""
        S = self.fedspd.clusters
        counts = torch.stack([(state.assign == s).sum(1) for s in range(S)], dim=1).to(state.bank.dtype)
        return counts / counts.sum(1, keepdim=True).clamp_min(1)

    def mix(self, state: FedspdState) -> torch.Tensor:
        """``[C, P]``: Σ_s π_i^s θ_i^s."""
        return torch.einsum("cs,csp->cp", self.shares(state), state.bank)

    # -- the round ----------------------------------------------------------

    def init(self, ctx: Context) -> FedspdState:
        """Every client's S models start from the same S inits (``w0``, then the model's init under seeds of
        (seed, "fedspd_init", s)), so that cluster s means the same on every client with no alignment; its
        examples split as the reference's first split."""
        S, C = self.fedspd.clusters, len(ctx.client_ids)
        shared = cluster_inits(ctx.w0, S, ctx.seed, self.init_model, stream=INIT_STREAM).to(ctx.w0)
        N = ctx.train_width or self.train_size
        counts = ctx.train_examples.cpu() if ctx.train_examples is not None else torch.full((C,), N)
        assign = initial_split(ctx.seed, ctx.client_ids, counts, N, S)
        valid = torch.arange(N)[None, :] < counts[:, None]
        assign = keep_minimum(assign, valid, S, self.fedspd.min_examples)
        assign = torch.where(valid, assign, torch.full_like(assign, -1)).to(ctx.w0.device)
        return FedspdState(bank=shared[None].expand(C, -1, -1).clone(), assign=assign)

    def plan(self, state: FedspdState, ctx: Context, round_: int, models: torch.Tensor):
        t, S = round_, self.fedspd.clusters
        C = len(ctx.client_ids)
        rows = torch.arange(C, device=models.device)
        top = self.shares(state).argmax(1)   # the client's cluster as the round starts (ARI)
        if self.stage(t) == "finetune":
            start = self.mix(state) if t == self.rounds - self.fedspd.finetune_rounds + 1 else models
            return state, RoundPlan(start=start, labels=S + (S + 1) * top,   # group S: none
                                    phases=((self.fedspd.finetune_epochs, ()),))
        group = self.groups(ctx, t)
        mine = group[ctx.own_rows].to(models.device)
        s = mine.clamp_min(0)
        ids = ctx.client_ids.cpu()
        N = state.assign.shape[1]
        keep = rng.uniform(ctx.seed, t, "fedspd_share", ids[:, None], torch.arange(N)[None, :]) < self.fedspd.share
        ours = state.assign == s[:, None]
        chosen = ours & keep.to(ours.device)
        chosen = torch.where(chosen.any(1, keepdim=True), chosen, ours)   # none drawn: the whole cluster
        epochs = self.fedspd.first_epochs if self.stage(t) == "first" else None
        labels = torch.where(mine >= 0, mine, torch.full_like(mine, S)) + (S + 1) * top
        return state, RoundPlan(start=state.bank[rows, s], trains=group >= 0, samples=chosen, labels=labels,
                                phases=None if epochs is None else ((epochs, ()),))

    def neighbours(self, ctx: Context, t: int) -> PeerIndex:
        """Every neighbour of the round's graph (one random regular graph for the run on the complete graph)."""
        return graph_neighbours(ctx, t, self.fedspd.degree, "fedspd", epoch=0)

    def select(self, state, ctx: Context, view: RoundView):
        return state, self.neighbours(ctx, view.round)

    def unseen_candidates(self, saved: dict, weights: torch.Tensor) -> torch.Tensor:
        """Every client's S cluster models, ``[n·S, P]`` (client 0's first; fedclust evaluate --unseen)."""
        bank = saved["clients"]["bank"]
        return bank.reshape(-1, bank.shape[-1])

    def aggregate(self, state: FedspdState, ctx: Context, view: RoundView) -> tuple[FedspdState, RoundResult]:
        t, S = view.round, self.fedspd.clusters
        labels = view.gathered_labels().to(ctx.device)
        group, top = labels % (S + 1), labels // (S + 1)
        mine = group[ctx.own_rows]
        C = len(mine)
        rows = torch.arange(C, device=ctx.device)
        if self.stage(t) == "finetune":   # trained alone
            none = PeerIndex(torch.zeros(C, 0, dtype=torch.int64, device=ctx.device),
                             torch.zeros(C, 0, dtype=torch.bool, device=ctx.device), ctx.n)
            return state, RoundResult(models=view.after.clone(), lists=none, averaged=none, assignment=top,
                                      received=none.counts())
        peers = within(self.neighbours(ctx, t), ctx.reach(t))
        delivery = ctx.delivery(t)
        peers = delivered(peers, delivery)
        trained = mine < S
        if delivery is not None:
            trained = trained & delivery.own_online().to(ctx.device)
        same = peers.valid & (group[peers.idx] == mine[:, None]) & trained[:, None]
        peers = keep_peers(peers, same)
        fresh = gossip_view(peers, ctx.client_ids, view)   # θ^s: the mean over the client and its group's neighbours
        bank = state.bank.clone()
        at = rows[trained]
        bank[at, mine[trained]] = fresh[trained].to(bank.dtype)
        assign = state.assign
        if t >= S:   # every example to the model of lowest loss on it, then the minimum per cluster
            losses = torch.stack([ctx.sample_loss(bank[:, s].contiguous()) for s in range(S)], dim=1)   # [C, S, N]
            valid = state.assign >= 0
            new = keep_minimum(losses.argmin(1), valid, S, self.fedspd.min_examples)
            new = torch.where(valid, new, torch.full_like(new, -1))
            if delivery is not None:   # an offline client did nothing: its examples stay where they were
                online = delivery.own_online().to(ctx.device)
                new = torch.where(online[:, None], new, state.assign)
            assign = new
        out = FedspdState(bank=bank, assign=assign)
        return out, RoundResult(models=self.mix(out).contiguous(), lists=peers, averaged=peers, assignment=top,
                                received=peers.counts())
