"""DAC, Decentralized Adaptive Clustering, as the peer algorithm ``dac``:
each client pulls k peer models sampled by ``softmax(τ·s_i)``, where
``s_i[j] = 1/L_i(w_j)`` is the inverse loss of peer j's model on client i's
training set (0: not yet known), averages them with its own, and learns of
peers it never asked from the tables of those it pulled.

Round t, for client i, on the tables ``S`` as they stood at the round's start
(the reference runs clients one after another; fedclust's round is
synchronous):

1. draw k distinct peers, successively with probability
   ``p_i[j] ∝ exp(τ_t · s_i[j])`` (j ≠ i; on a graph among its neighbours;
   uniform in round 1, when every s_i[j] is 0), as the k lowest keys
   ``log(−log u_ij) − τ_t·s_i[j]``, ``u_ij = uniform(seed, t, "dac", i, j)``
   (Gumbel-top-k: the same law as sampling one after another without
   replacement);
2. for each pulled j: ``s_i[j] = 1/L_i(w_j)`` and j is asked;
3. (``dac.propagate``, the default) for each j ≠ i never asked with
   ``S_k[j] > 0`` for some pulled k: ``s_i[j] = S_{k*}[j]``, k* the pulled
   peer with the largest ``s_i[k]`` (ties: the later in index order); the
   DAC of ``sacs-epfl/facade`` has no such step (``dac.propagate=false``);
4. ``w_i ←`` the mean of ``w_i`` and the pulled models.

``τ_t = τ`` (``dac.schedule=constant``) or ``2τ/(1 + e^{−0.2(t−1)}) − τ + 1``
(``sigmoid``: the paper's DAC_var, from 1 to τ + 1).  A client's neighbour
list is the peers it pulled (precision, recall); its cluster (ARI) the
connected component of the symmetrised graph of every client's top k by
``s_i``.  Where fedclust departs from the reference code and why:
docs/algorithms.md, "DAC".

The tables ``s`` (float32) and ``asked`` (bool) are ``[n, n]``, replicated on
every process: step 3 reads the rows of any pulled peer.  Each process scores
its own clients' pulls and one all-reduce of ``[n, 2k]`` numbers shares them,
then every process updates every row the same way.

Paper: E. Listo Zec, E. Ekblom, M. Willbo, O. Mogren, S. Girdzijauskas, "Decentralized adaptive clustering of deep
nets is beneficial for client collaboration", International Workshop on Trustworthy Federated Learning at IJCAI
2022 (FL-IJCAI'22), https://arxiv.org/abs/2206.08839; reference code edvinli/DAC.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from fedclust import rng
from fedclust.algorithms.base import Context, PeerAlgorithm, RoundResult, RoundView
from fedclust.algorithms.registry import register
from fedclust.algorithms.similarity import similarity_for
from fedclust.errors import ConfigError
from fedclust.lists import graph_components
from fedclust.network import answering
from fedclust.peers import PeerIndex
from fedclust.schema import option

Schedule = Literal["constant", "sigmoid"]
STREAM = "dac"


@dataclass
class DacConfig:
    """The ``dac`` section (docs/algorithms.md, "DAC")."""

    tau: float = option(30.0, "τ: a peer is pulled with probability proportional to exp(τ_t / its loss on the "
                              "client's data), > 0 (the reference's 30)")
    schedule: Schedule = option("constant", "constant: τ_t = τ; sigmoid: τ_t = 2τ/(1 + exp(-0.2 (t - 1))) - τ + 1, "
                                            "from 1 to τ + 1 (the paper's DAC_var)")
    propagate: bool = option(True, "step 3: a client takes the scores its pulled peers hold of peers it never "
                                   "asked (edvinli/DAC, the DAC paper's code); false: only its own pulls' scores "
                                   "(sacs-epfl/facade's DAC, Facade's baseline)",
                             doc="step 3: a client takes the scores its pulled peers hold of peers it never asked, "
                                 "as `edvinli/DAC` (the DAC paper's code) does; `false`: it knows only the peers it "
                                 "pulled, as the DAC of `sacs-epfl/facade` (the baseline of Facade's paper) does. "
                                 "That fork also reseeds its draws with the node's id at every draw, so a node "
                                 "pulls the same peers each round; fedclust does not reproduce that. See "
                                 "[DAC](algorithms.md#dac-dac)")

    def validate(self, cfg) -> None:
        if not (math.isfinite(self.tau) and self.tau > 0):
            raise ConfigError("dac.tau", self.tau, "must be a finite number > 0 (the reference's 30)")


def tau_at(tau: float, schedule: str, round_: int) -> float:
    """τ_t of round ``round_`` (1-based; the reference's round ``t − 1``)."""
    if schedule == "sigmoid":
        return 2 * tau / (1 + math.exp(-0.2 * (round_ - 1))) - tau + 1
    return tau


def draw_pulls(seed: int, round_: int, scores: torch.Tensor, clients: torch.Tensor, k: int, tau: float,
               allowed=None) -> PeerIndex:
    """Step 1 for the rows ``clients`` (``scores [C, n]``, their rows of s): each row's k peers drawn successively
    with probability ∝ ``exp(τ·s)`` among the others (``allowed``: the round's graph neighbours, a function of a
    chunk of rows, or None), each row's in increasing order.  The k lowest of ``log(−log u) − τ·s``, float64."""
    C, n = scores.shape
    kk = min(k, n)
    idx = torch.zeros(C, kk, dtype=torch.int64, device=scores.device)
    valid = torch.zeros(C, kk, dtype=torch.bool, device=scores.device)
    clients = clients.to(scores.device)
    step = max(1, rng.CHOOSE_CHUNK_ELEMENTS // max(n, 1))
    for lo in range(0, C, step):   # chunks of rows: [rows, n] float64 keys at a time
        hi = min(C, lo + step)
        u = rng.client_keys(seed, round_, STREAM, clients[lo:hi], n) + 2.0**-33   # in (0, 1)
        keys = torch.log(-torch.log(u)) - tau * scores[lo:hi].to(torch.float64)
        if allowed is not None:
            keys = torch.where(allowed(lo, hi).to(keys.device), keys, torch.full_like(keys, math.inf))
        keys[torch.arange(hi - lo, device=keys.device), clients[lo:hi]] = math.inf   # never the client itself
        low, top = torch.topk(keys, kk, dim=1, largest=False)
        top = torch.where(torch.isfinite(low), top, torch.full_like(top, n))
        top = torch.sort(top, dim=1).values
        valid[lo:hi] = top < n
        idx[lo:hi] = torch.where(top < n, top, torch.zeros_like(top))
    return PeerIndex(idx, valid, n)


def update_tables(scores: torch.Tensor, asked: torch.Tensor, idx: torch.Tensor, valid: torch.Tensor,
                  values: torch.Tensor, propagate: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 2 and 3 for every client: ``scores [n, n]`` and ``asked [n, n]`` after each client i scored the peers
    ``idx[i][valid[i]]`` with ``values[i]`` (``[n, k]``, 1/loss).  Propagation (step 3, unless ``propagate`` is
    False) reads the tables as they were (``scores``); a row with no valid pull is unchanged.  Rows go in chunks
    ([rows, n] at a time)."""
    n, k = idx.shape
    new, seen = scores.clone(), asked.clone()
    prio = torch.where(valid, values.to(scores.dtype), torch.full_like(values, -math.inf, dtype=scores.dtype))
    order = torch.argsort(prio, dim=1, stable=True)   # ascending: the largest s_i[k] is written last
    step = max(1, rng.CHOOSE_CHUNK_ELEMENTS // max(n, 1))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        rows = torch.arange(hi - lo, device=scores.device)
        i, v = idx[lo:hi], valid[lo:hi]
        r = rows[:, None].expand_as(i)[v]
        new[lo:hi][r, i[v]] = values[lo:hi][v].to(scores.dtype)                    # step 2
        seen[lo:hi][r, i[v]] = True
        if not propagate:
            continue
        heard = torch.zeros(hi - lo, n, dtype=scores.dtype, device=scores.device)
        has = torch.zeros(hi - lo, n, dtype=torch.bool, device=scores.device)
        for q in range(k):                                                        # step 3
            at = order[lo:hi, q:q + 1]
            peer, ok = i.gather(1, at)[:, 0], v.gather(1, at)[:, 0]
            theirs = scores[peer]
            hit = (theirs > 0) & ok[:, None]
            heard = torch.where(hit, theirs, heard)
            has |= hit
        has &= ~seen[lo:hi]
        has[rows, rows + lo] = False
        new[lo:hi] = torch.where(has, heard, new[lo:hi])
    return new, seen


def top_k_components(scores: torch.Tensor, k: int) -> torch.Tensor:
    """``[n]`` int64: the connected components of the symmetrised graph of every client's k peers of highest
    ``s_i`` among those known (> 0), DAC's clusters."""
    n = scores.shape[0]
    kk = min(k, n)
    lists = np.full((n, kk), -1, dtype=np.int32)
    step = max(1, rng.CHOOSE_CHUNK_ELEMENTS // max(n, 1))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        val, top = torch.topk(scores[lo:hi], kk, dim=1)
        lists[lo:hi] = torch.where(val > 0, top, torch.full_like(top, -1)).cpu().numpy()
    return torch.from_numpy(graph_components(lists).astype(np.int64))


@dataclass
class DacState:
    scores: torch.Tensor   # [n, n] float32 s_i[j] = 1/loss, 0 unknown (replicated)
    asked: torch.Tensor    # [n, n] bool: i has pulled j (replicated)


@register
@dataclass
class Dac(PeerAlgorithm):
    """DAC's round (see the module docstring)."""

    k: int
    dac: DacConfig = field(default_factory=DacConfig)

    name = "dac"
    report_position = 15
    needs_k = True
    choice_masks = False      # index lists of k pulls a client
    # column_exchange stays False: it scores its pulls by their whole models' loss on its own data
    sections = {"dac": DacConfig}
    pair_bytes = 5            # s float32 and asked bool, [n, n] on every process

    @classmethod
    def from_config(cls, cfg) -> "Dac":
        return cls(cfg.algorithm.k, cfg.dac)

    def init(self, ctx: Context) -> DacState:
        n = ctx.n
        return DacState(scores=torch.zeros(n, n, device=ctx.device),
                        asked=torch.zeros(n, n, dtype=torch.bool, device=ctx.device))

    def pulls(self, state: DacState, ctx: Context, view: RoundView) -> torch.Tensor:
        """Steps 1 and 2 for this process's clients: ``[n, 2k]`` float64, zero but in their rows, which hold each
        scored pull as ``j + 1`` (0: none) in the first k columns and its ``1/L_i(w_j)`` in the next k (summed
        over the processes, every client's)."""
        t, k, n = view.round, self.k, ctx.n
        own = ctx.own_rows
        ids = ctx.client_ids.to(ctx.device)
        tau = tau_at(self.dac.tau, self.dac.schedule, t)
        drawn = draw_pulls(ctx.seed, t, state.scores[own], ids, k, tau, ctx.reach(t))
        delivery = ctx.delivery(t)
        pool = answering(drawn.mask(), delivery)   # an offline peer, or a lost model, gives no score
        if delivery is not None:                   # an offline client pulls nothing
            pool &= delivery.own_online().to(pool.device)[:, None]
        got = similarity_for("loss", 0.0, ctx, view, pool)   # 1/L_i(w_j), float32, columns ascending
        m = got.idx.shape[1]
        share = torch.zeros(n, 2 * k, dtype=torch.float64, device=ctx.device)
        share[own, :m] = torch.where(got.valid, got.idx + 1, 0).to(torch.float64)
        share[own, k:k + m] = torch.where(got.valid, got.values, 0).to(torch.float64)
        return share

    def select(self, state: DacState, ctx: Context, view: RoundView) -> tuple[DacState, PeerIndex]:
        k = self.k
        share = ctx.all_reduce(self.pulls(state, ctx, view))   # every client's scored pulls, on every process
        idx = share[:, :k].to(torch.int64) - 1
        valid = idx >= 0
        scores, asked = update_tables(state.scores, state.asked, idx.clamp_min(0), valid,
                                      share[:, k:].to(torch.float32), self.dac.propagate)
        own = ctx.own_rows
        return DacState(scores=scores, asked=asked), PeerIndex(idx[own].clamp_min(0), valid[own], ctx.n)

    def aggregate(self, state: DacState, ctx: Context, view: RoundView) -> tuple[DacState, RoundResult]:
        state, result = super().aggregate(state, ctx, view)
        return state, dataclasses.replace(result, assignment=top_k_components(state.scores, self.k))
