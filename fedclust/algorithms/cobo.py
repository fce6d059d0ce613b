"""CoBo, collaborator selection by bilevel optimization, as the peer
algorithm ``cobo``: every pair of clients keeps a collaboration weight
``w_ij ∈ [0, 1]`` (all 1 at the start); a client's model is pulled towards
its collaborators', ``x_i ← x_i − η ρ Σ_k w_ik (x_i − x_k)``, and a sampled
pair's weight grows with the alignment of the two clients' gradients at the
midpoint of their models, ``w_ij ← clip(w_ij + γ ⟨∇f_i(z), ∇f_j(z)⟩, 0, 1)``,
``z = (x_i + x_j)/2``.

Round t, after local training (fedclust's ``train.*``: the reference takes one
SGD step an iteration, fedclust's round is epochs of them):

1. consensus, on the gathered models after training ``X`` and the weights as
   they stood at the round's start: ``x_i ← x_i − c ρ (d_i x_i − Σ_{k≠i} w_ik
   x_k)``, ``d_i = Σ_{k≠i} w_ik``, c = ``cobo.consensus_lr`` (0: the round's
   ``train.lr``), ρ = ``cobo.rho``; only peers with ``w_ik > 0`` whose model
   arrived count;
2. pairs ``i < j`` drawn with probability ``p_t`` each (``uniform(seed, t,
   "cobo_pairs", i, j) <= p_t``; the reference's ``p_t = min(1, 2/n)`` up to
   its step ``cobo.switch``, then ``1/√(t − 1)``; ``cobo.pairs > 0`` fixes it),
   both online and, on a graph, neighbours;
3. for a drawn pair: ``g_i = ∇f_i(z)`` on a batch of ``cobo.batch_size`` of i's
   training examples (the lowest keys ``uniform(seed, t, "cobo_batch", i, j·N +
   e)``), ``g_j`` the same on j's, ``z = (x_i + x_j)/2`` of the models after
   training; ``w_ij = w_ji ← clip(w_ij + γ ⟨g_i, g_j⟩, 0, 1)``, γ =
   ``cobo.gamma``.

A client's neighbour list is the peers it averaged with (``w_ik > 0``).  W is
``[n, n]`` float32, replicated on every process: each process computes the
gradients of its own clients' side of every drawn pair, and one all-reduce of
``[2K, P]`` (K pairs, about n − 1 in expectation at ``p = 2/n``) gives every
process both sides, from which each updates W the same way.  Where fedclust
departs from the reference code: docs/algorithms.md, "CoBo".

Paper: D. Hashemi, L. He, M. Jaggi, "CoBo: Collaborative Learning via Bilevel Optimization", NeurIPS 2024,
https://arxiv.org/abs/2409.05539; reference code epfml/CoBo (personalized-vision-models/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from fedclust import rng
from fedclust.algorithms.base import Context, PeerAlgorithm, RoundResult, RoundView, keep_personal
from fedclust.algorithms.registry import register
from fedclust.errors import ConfigError
from fedclust.network import delivered, within
from fedclust.peers import peer_counts
from fedclust.schema import at_least, option

PAIRS, BATCH = "cobo_pairs", "cobo_batch"   # rng streams: the pairs drawn a round, a pair's batch of examples


@dataclass
class CoboConfig:
    """The ``cobo`` section (docs/algorithms.md, "CoBo")."""

    rho: float = option(0.01, "ρ, the pull towards collaborators: x_i -= c ρ Σ_k w_ik (x_i - x_k) after training "
                              "(the reference's default, run.py; its README's CIFAR-100 run: 0.05), >= 0")
    gamma: float = option(0.01, "γ, a drawn pair's weight step: w_ij += γ <g_i, g_j> clipped to [0, 1] (the "
                                "reference's, fixed in grouping.py), > 0")
    consensus_lr: float = option(0.0, "c, the step of the pull towards collaborators; 0: the round's train.lr (the "
                                      "reference's one lr for both), >= 0")
    pairs: float = option(0.0, "the probability a pair i < j is drawn a round, in [0, 1]; 0: the reference's "
                               "min(1, 2/clients), then 1/sqrt(t - 1) after round cobo.switch + 1")
    switch: int = option(800, "the last round (counted from 0, the reference's step) of the probability 2/clients "
                              "(the reference's 800), >= 0")
    batch_size: int = option(0, "examples of each client's gradient at a pair's midpoint; 0: train.batch_size (the "
                                "reference's one batch size), >= 0")

    def validate(self, cfg) -> None:
        for key, value, low in (("cobo.rho", self.rho, 0.0), ("cobo.consensus_lr", self.consensus_lr, 0.0)):
            if not (math.isfinite(value) and value >= low):
                raise ConfigError(key, value, "must be a finite number >= 0")
        if not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ConfigError("cobo.gamma", self.gamma, "must be a finite number > 0 (the reference's 0.01)")
        if not (math.isfinite(self.pairs) and 0.0 <= self.pairs <= 1.0):
            raise ConfigError("cobo.pairs", self.pairs, "must lie in [0, 1]: a probability (0: the reference's "
                              "schedule)")
        at_least("cobo.switch", self.switch, 0, "the reference's 800")
        at_least("cobo.batch_size", self.batch_size, 0, "examples a midpoint gradient reads (0: train.batch_size)")
        c = self.consensus_lr or cfg.train.lr
        if c * self.rho * (cfg.clients - 1) > 1:
            raise ConfigError("cobo.rho", self.rho, f"with c = {c} and {cfg.clients} clients the pull c·ρ·Σ_k w_ik "
                              f"reaches {c * self.rho * (cfg.clients - 1):.3g} > 1 (all weights start at 1), which "
                              "moves a client past its collaborators' mean; lower cobo.rho to at most "
                              f"{1 / (c * (cfg.clients - 1)):.3g} or cobo.consensus_lr")


def pair_probability(cfg: CoboConfig, n: int, round_: int) -> float:
    """p_t of round ``round_`` (1-based; the reference's step ``round_ − 1``)."""
    if cfg.pairs > 0:
        return float(cfg.pairs)
    step = round_ - 1
    return min(1.0, 2.0 / max(n, 1)) if step <= cfg.switch else 1.0 / math.sqrt(step)


def draw_pairs(seed: int, round_: int, n: int, p: float,
               allowed: Callable[[int, int], torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(I, J)`` int64 ``[K]``: the pairs ``i < j`` with ``uniform(seed, round, "cobo_pairs", i, j) <= p`` (and
    ``allowed(lo, hi)[i − lo, j]`` where given), in increasing (i, j); rows in chunks."""
    out_i, out_j = [], []
    step = max(1, rng.CHOOSE_CHUNK_ELEMENTS // max(n, 1))
    cols = torch.arange(n)
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        keys = rng.client_keys(seed, round_, PAIRS, torch.arange(lo, hi), n)
        take = (keys <= p) & (cols[None, :] > torch.arange(lo, hi)[:, None])
        if allowed is not None:
            take &= allowed(lo, hi).cpu()
        i, j = take.nonzero(as_tuple=True)
        out_i.append(i + lo)
        out_j.append(j)
    return torch.cat(out_i), torch.cat(out_j)


def pair_batches(seed: int, round_: int, clients: torch.Tensor, partners: torch.Tensor, counts: torch.Tensor,
                 width: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(examples [K, B], weights [K, B])``: for each row, the ``min(batch, counts)`` real examples of client
    ``clients[k]`` of lowest key ``uniform(seed, round, "cobo_batch", client, partner·width + e)``, each weighted
    1/their number (a padded position weighs 0); B = ``min(batch, width)``."""
    pos = torch.arange(width, dtype=torch.int64)
    index = partners.to(torch.int64).cpu()[:, None] * width + pos[None, :]
    keys = rng.uniform(seed, round_, BATCH, clients.to(torch.int64).cpu()[:, None], index)
    keys = keys.masked_fill(pos[None, :] >= counts.cpu()[:, None], 2.0)
    low, examples = torch.topk(keys, min(batch, width), dim=1, largest=False, sorted=True)
    real = low < 2.0
    weights = real.to(torch.float32) / real.sum(1, keepdim=True).clamp_min(1).to(torch.float32)
    return examples, weights


def pair_scores(ctx: Context, models: torch.Tensor, I: torch.Tensor, J: torch.Tensor, round_: int,
                batch: int) -> torch.Tensor:
    """``[K]`` ``<g_i, g_j>`` of every drawn pair: this process computes the gradients at the midpoints of its
    own clients' sides (``models [n, P]``, every client's after training), one all-reduce of ``[2K, P]`` shares
    them."""
    K, P = len(I), models.shape[1]
    lo, hi = ctx.own_rows.start, ctx.own_rows.stop
    grads = torch.zeros(2 * K, P, dtype=models.dtype, device=models.device)
    sides = torch.cat([I, J]).to(models.device)           # the client whose data a row's gradient reads
    partner = torch.cat([J, I]).to(models.device)
    mine = ((sides >= lo) & (sides < hi)).nonzero().flatten()
    if len(mine):
        pairs = mine % K
        mid = (models[I.to(models.device)[pairs]] + models[J.to(models.device)[pairs]]) / 2
        owner = sides[mine] - lo
        counts = ctx.train_examples if ctx.train_examples is not None else torch.full((hi - lo,), ctx.train_width)
        examples, weights = pair_batches(ctx.seed, round_, sides[mine], partner[mine], counts[owner.cpu()],
                                         ctx.train_width, batch)
        grads[mine] = ctx.batch_grad(mid, owner, examples.to(models.device), weights.to(models.device))
    grads = ctx.all_reduce(grads)
    return (grads[:K] * grads[K:]).sum(1)


@dataclass
class CoboState:
    w: torch.Tensor   # [n, n] float32 collaboration weights w_ij in [0, 1], symmetric, all 1 at the start (replicated)


@register
@dataclass
class Cobo(PeerAlgorithm):
    """CoBo's round (see the module docstring)."""

    train: Any   # the run's train section: the round's lr (train.round_lr), the batch size
    cobo: CoboConfig = field(default_factory=CoboConfig)

    name = "cobo"
    report_position = 20
    choice_masks = True    # its collaborators: every peer of positive weight, a bool [C, n] mask
    # column_exchange stays False: a pair's midpoint gradient reads the two whole models
    sections = {"cobo": CoboConfig}
    pair_bytes = 4         # W, float32 [n, n] on every process

    @classmethod
    def from_config(cls, cfg) -> "Cobo":
        return cls(cfg.train, cfg.cobo)

    def init(self, ctx: Context) -> CoboState:
        return CoboState(w=torch.ones(ctx.n, ctx.n, device=ctx.device))

    def allowed_pairs(self, ctx: Context, t: int) -> Callable[[int, int], torch.Tensor] | None:
        """Rows lo..hi of the pairs that may be drawn in round ``t``: both online, neighbours on a graph."""
        graph, online = ctx.graph(t), ctx.online(t)
        if graph is None and online is None:
            return None

        def rows(lo: int, hi: int) -> torch.Tensor:
            ok = torch.ones(hi - lo, ctx.n, dtype=torch.bool)
            if graph is not None:
                ok &= graph.rows(torch.arange(lo, hi), "cpu")
            if online is not None:
                ok &= online.cpu()[lo:hi, None] & online.cpu()[None, :]
            return ok
        return rows

    def consensus(self, state: CoboState, ctx: Context, view: RoundView) -> tuple[torch.Tensor, torch.Tensor]:
        """(models [C, P] after the pull towards collaborators, the peers it counted bool [C, n])."""
        t, models = view.round, view.all_after
        w = state.w[ctx.own_rows]
        links = (w > 0) & ~ctx.self_mask
        links = delivered(within(links, ctx.reach(t)), ctx.delivery(t))
        assert isinstance(links, torch.Tensor)
        wm = torch.where(links, w, torch.zeros_like(w))
        c = (self.cobo.consensus_lr or self.train.round_lr(t)) * self.cobo.rho
        own = view.after
        pulled = own - c * (wm.sum(1, keepdim=True) * own - wm.to(models.dtype) @ models)
        return keep_personal(pulled, own, ctx.personal), links

    def aggregate(self, state: CoboState, ctx: Context, view: RoundView) -> tuple[CoboState, RoundResult]:
        t, n = view.round, ctx.n
        models, links = self.consensus(state, ctx, view)
        I, J = draw_pairs(ctx.seed, t, n, pair_probability(self.cobo, n, t), self.allowed_pairs(ctx, t))
        w = state.w.clone()
        if len(I):
            s = pair_scores(ctx, view.all_after, I, J, t, self.cobo.batch_size or int(self.train.batch_size))
            w[I, J] = (w[I, J] + self.cobo.gamma * s.to(w.dtype)).clamp(0.0, 1.0)
            w[J, I] = w[I, J]
        partners = torch.zeros_like(links)   # a drawn pair's two clients fetch each other's model
        lo = ctx.own_rows.start
        for a, b in ((I, J), (J, I)):
            a, b = a.to(links.device), b.to(links.device)
            mine = (a >= lo) & (a < lo + len(links))
            partners[a[mine] - lo, b[mine]] = True
        received = peer_counts(links | partners)
        return CoboState(w=w), RoundResult(models=models.contiguous(), lists=links, averaged=links,
                                           received=received)
