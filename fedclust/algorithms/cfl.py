"""CFL, Clustered Federated Learning (Sattler, Müller & Samek, IEEE TNNLS
2021, arXiv 1910.01991), as the server algorithm ``cfl``: one model per
cluster, starting with one; a cluster splits in two when its updates pass the
norm test and the bipartition test, so the number of clusters is found, not
given.  What fedclust runs, its keys and why: docs/algorithms.md, "CFL".

Paper: F. Sattler, K.-R. Müller, W. Samek, "Clustered Federated Learning: Model-Agnostic Distributed
Multitask Optimization Under Privacy Constraints", IEEE TNNLS 32(8), 2021,
https://arxiv.org/abs/1910.01991
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from fedclust.algorithms.aggregation import check_weights, cluster_average, own, participants, trainers
from fedclust.algorithms.base import Context, RoundPlan, RoundView, ServerMethod, server_result
from fedclust.algorithms.registry import register
from fedclust.data.validation import check_share
from fedclust.errors import ConfigError
from fedclust.schema import option

EPS = 1e-12  # as the CFL reference code: cos = <a,b> / (‖a‖‖b‖ + 1e-12)
DEFAULT_EPS1 = 0.4
DEFAULT_EPS2 = 1.6
DEFAULT_GAMMA_MAX = 0.5
REFERENCE_ROUND1_NORM = 3.2   # u_1 of the reference code's set-up (docs/algorithms.md, CFL, "Units")
# Share of a client's training examples it validates on: the reference code's Client(train_frac=0.8)
DEFAULT_VALIDATION = 0.2
BEST_OF_LINEAGE = "accuracy_best_of_lineage"   # the round record's key of the best-of-lineage accuracy


def update_norms(updates: torch.Tensor, weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(‖mean_i Δθ_i‖, max_i ‖Δθ_i‖)`` of one cluster's updates ``[m, P]``
    (0-dim tensors).  ``weights [m]`` weights the mean (paper); None: plain
    mean (reference code)."""
    if updates.dim() != 2 or updates.shape[0] == 0:
        raise ValueError(f"updates must be a non-empty [m, P] stack, got shape {tuple(updates.shape)}")
    if weights is None:
        mean = updates.mean(dim=0)
    else:
        w = check_weights(weights, updates.shape[0]).to(updates.dtype)
        if w.sum() <= 0:
            raise ValueError("weights sum to 0: give positive data sizes")
        mean = (w / w.sum()) @ updates
    return mean.norm(), updates.norm(dim=1).max()


def check_thresholds(eps1: float, eps2: float) -> None:
    """ε1, ε2 must be finite and > 0."""
    for name, v in (("cfl.eps1", eps1), ("cfl.eps2", eps2)):
        if not (float(v) > 0 and float(v) < float("inf")):
            raise ConfigError(name, v, f"CFL split threshold must be a finite number > 0 "
                              f"(defaults {DEFAULT_EPS1} and {DEFAULT_EPS2})")


def check_gamma_max(gamma_max: float) -> None:
    """γ_max must lie in [0, 1) (the paper's Algorithm 1)."""
    if not 0.0 <= float(gamma_max) < 1.0:
        raise ConfigError("cfl.gamma_max", gamma_max, "must lie in [0, 1): the bound on the clients' relative "
                          f"gradient error of CFL's Algorithm 1 (default {DEFAULT_GAMMA_MAX}; 0 keeps only "
                          "the norm test, as the reference code)")


def should_split(
    updates: torch.Tensor,
    eps1: float,
    eps2: float,
    min_clients: int = 3,
    weights: torch.Tensor | None = None,
) -> bool:
    """CFL's norm test for one cluster (the paper's Algorithm 1 and its
    reference code)::

        ‖mean_{i∈c} Δθ_i‖ < ε1   the cluster's objective is near a stationary point,
        max_{i∈c} ‖Δθ_i‖  > ε2   but some client's is not (incongruent risks),
        m ≥ min_clients          (default 3: "more than 2 clients").

    ``updates [m, P]`` are the cluster's client updates of this round; a
    cluster with fewer than ``min_clients`` clients never splits (returns
    False, also for m = 0)."""
    check_thresholds(eps1, eps2)
    if updates.dim() != 2:
        raise ValueError(f"updates must be [m, P], got shape {tuple(updates.shape)}")
    if updates.shape[0] < max(min_clients, 2):
        return False
    mean_norm, max_norm = update_norms(updates, weights)
    return bool(mean_norm < eps1) and bool(max_norm > eps2)


def scaled_thresholds(round1_norm: float, eps1: float = DEFAULT_EPS1,
                      eps2: float = DEFAULT_EPS2) -> tuple[float, float]:
    """ε1, ε2 in units of the round-1 update (``cfl.scale_to_model``,
    docs/algorithms.md): ``(ε1·s, ε2·s)`` with
    ``s = round1_norm / REFERENCE_ROUND1_NORM``.

    ``round1_norm``: ``u_1``, the mean client update norm of round 1.
    """
    check_thresholds(eps1, eps2)
    if not (float(round1_norm) > 0 and float(round1_norm) < float("inf")):
        raise ConfigError("cfl.scale_to_model", True,
                          f"eps1 and eps2 are scaled by round 1's mean client update norm, round1_norm = "
                          f"{round1_norm}, not a finite number > 0: check train.lr, or set cfl.scale_to_model=false")
    s = float(round1_norm) / REFERENCE_ROUND1_NORM
    return float(eps1) * s, float(eps2) * s


def pairwise_cosine(updates: torch.Tensor) -> torch.Tensor:
    """``α_ij = <Δθ_i, Δθ_j> / (‖Δθ_i‖‖Δθ_j‖ + 1e-12)`` → ``[m, m]``
    (CFL's cosine similarity, the reference code's ``pairwise_angles``; 0 for
    a zero update)."""
    if updates.dim() != 2:
        raise ValueError(f"updates must be [m, P], got shape {tuple(updates.shape)}")
    norms = updates.norm(dim=1)
    return (updates @ updates.T) / (norms[:, None] * norms[None, :] + EPS)


def bipartition(similarity: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CFL split: complete-linkage bipartition of ``similarity [m, m]`` →
    ``(idx_a, idx_b)``, sorted int64 index tensors into the cluster's
    clients; ``idx_a`` holds client 0.

    scipy's ``linkage(squareform(1 − S), "complete")`` cut at 2 clusters
    (``S`` symmetrised, distances clipped at 0, the diagonal 0); it orders
    every merge as the reference code's ``AgglomerativeClustering(
    linkage="complete")`` on ``−S``.
    """
    from scipy.cluster.hierarchy import fcluster, linkage  # here: 0.09 s of every process's start otherwise
    from scipy.spatial.distance import squareform

    m = similarity.shape[0]
    if similarity.dim() != 2 or similarity.shape != (m, m) or m < 2:
        raise ValueError(f"similarity must be square [m, m] with m >= 2, got {tuple(similarity.shape)}")
    s = similarity.detach().to(torch.float64).cpu().numpy()
    d = np.clip(1.0 - (s + s.T) / 2.0, 0.0, None)
    np.fill_diagonal(d, 0.0)
    labels = fcluster(linkage(squareform(d, checks=False), method="complete"), 2, criterion="maxclust")
    second = torch.from_numpy(labels != labels[0]).to(similarity.device)
    idx = torch.arange(m, device=similarity.device)
    return idx[~second], idx[second]


def cross_similarity(similarity: torch.Tensor, idx_a: torch.Tensor, idx_b: torch.Tensor) -> float:
    """``α_max^cross = max_{i∈a, j∈b} α_ij``, the largest similarity across
    the bipartition (CFL Algorithm 1)."""
    if idx_a.numel() == 0 or idx_b.numel() == 0:
        raise ValueError("both halves of the bipartition must be non-empty")
    return float(similarity[idx_a][:, idx_b].max())


def separation_bound(alpha_cross: float) -> float:
    """``sqrt((1 − α_max^cross) / 2)``: the largest relative gradient error
    ``γ`` at which two congruent clients could still have cosine similarity
    as low as ``α_max^cross``.

    ``γ_i = ‖∇r_i(θ*) − ∇R_{I(i)}(θ*)‖ / ‖∇R_{I(i)}(θ*)‖`` is client i's
    relative error against its cluster's true gradient.  Two congruent
    clients whose updates are each within ``arcsin γ`` of their common true
    gradient have cosine at least ``cos(2·arcsin γ) = 1 − 2γ²``, so a
    bipartition whose ``α_max^cross < 1 − 2γ²`` (this bound above γ) puts
    no congruent pair on opposite sides."""
    a = float(alpha_cross)
    if not -1.0 - 1e-6 <= a <= 1.0 + 1e-6:
        raise ValueError(f"alpha_cross is a cosine similarity in [-1, 1], got {a}")
    return math.sqrt(max(0.0, 1.0 - a) / 2.0)


def split_is_separated(alpha_cross: float, gamma_max: float) -> bool:
    """CFL Algorithm 1's test of a bipartition:
    ``γ_max < sqrt((1 − α_max^cross) / 2)`` (:func:`separation_bound`);
    ``γ_max = 0`` leaves the norm test alone, as the reference code (only
    ``α_max^cross = 1`` fails it)."""
    check_gamma_max(gamma_max)
    return float(gamma_max) < separation_bound(alpha_cross)


# ----------------------------------------------------------------------------
# Round object


@dataclass
class CflState:
    models: torch.Tensor          # [K, P] cluster models (K grows with splits), replicated
    labels: torch.Tensor          # [n] int64 cluster of every client
    pending: torch.Tensor         # [n] int64 sibling cluster a client still chooses against (-1: none)
    reference_norm: float | None  # u_1, mean participant update norm of round 1
    splits: list                  # (round, parent, new cluster) of every split, for the record
    checks: list = field(default_factory=list)  # (round, cluster, α_max^cross, accepted) of every norm-test pass
    # [S, P] the tree: row s is the model of splits[s]'s parent cluster as it was when it split (the reference
    # code's server.cache_model), replicated; a client's lineage is :func:`lineage` of its cluster
    cache: torch.Tensor | None = None

    def tree(self) -> torch.Tensor:
        """``cache``, the tree of models (a state from :meth:`Cfl.init` always holds one, ``[0, P]`` at first)."""
        if self.cache is None:
            raise ValueError("CFL state without its tree of models (CflState.cache): Cfl.init starts one, [0, P]")
        return self.cache


def split_cluster(updates: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Bool ``[m]``: the members of the bipartition's second half (the half
    without the cluster's first participant), :func:`bipartition` of the
    pairwise cosines of ``updates [m, P]``; and the bipartition's
    ``α_max^cross``."""
    sim = pairwise_cosine(updates)
    idx_a, idx_b = bipartition(sim)
    side = torch.zeros(updates.shape[0], dtype=torch.bool, device=updates.device)
    side[idx_b] = True
    return side, cross_similarity(sim, idx_a, idx_b)


def lineage(splits: list, clusters: int) -> torch.Tensor:
    """Bool ``[clusters, S]``: row k marks the cached models (rows of
    ``CflState.cache``, one per split, in order) of cluster k's ancestors,
    from the root down (the clusters k's clients belonged to, each as it
    was when it split).

    ``splits``: ``(round, parent, new)`` of every split in order; a split
    keeps the parent's number for one half and gives the other the next
    number, so the new cluster's lineage is its parent's up to that split."""
    S = len(splits)
    member = torch.zeros(clusters, S, dtype=torch.bool)
    for s, (_, parent, new) in enumerate(splits):   # splits, not clients
        if not (0 <= parent < clusters and 0 <= new < clusters):
            raise ValueError(f"split {s} {(parent, new)} names a cluster outside 0..{clusters - 1}")
        member[new] = member[parent]
        member[[parent, new], s] = True
    return member


def best_of_lineage(accuracy: torch.Tensor, loss: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """int64 ``[C]``: for each client, the column of ``accuracy [C, M]``
    (validation accuracy of M candidate models) it takes among ``allowed
    [C, M]`` (its lineage: cached ancestors, then its own cluster's model
    last): the highest validation accuracy, as the reference code picks
    (its notebook marks each client's best cached accuracy); ties go to the
    lower validation ``loss``, then to the later (more specialised) model,
    so a client keeps its own cluster's model unless validation says
    otherwise."""
    if not (accuracy.shape == loss.shape == allowed.shape and accuracy.dim() == 2):
        raise ValueError(f"accuracy, loss and allowed must be [C, M] alike, got {tuple(accuracy.shape)}, "
                         f"{tuple(loss.shape)}, {tuple(allowed.shape)}")
    if accuracy.shape[0] and not bool(allowed.any(1).all()):
        raise ValueError("every client needs at least one allowed model (its own cluster's)")
    acc = accuracy.masked_fill(~allowed, float("-inf"))
    top = allowed & (acc == acc.max(1, keepdim=True).values)
    low = loss.masked_fill(~top, float("inf"))
    top &= low == low.min(1, keepdim=True).values
    order = torch.arange(1, accuracy.shape[1] + 1, device=accuracy.device)
    return (top * order).argmax(1)


@dataclass
class CflConfig:
    """The ``cfl`` section."""

    before_the_key: ClassVar[dict] = {"validation": 0.0}   # CFL trained on every example before cfl.validation

    eps1: float = option(DEFAULT_EPS1, "a cluster splits when its mean update norm is below eps1 (> 0) ...")
    eps2: float = option(DEFAULT_EPS2, "... and some client's update norm is above eps2 (> eps1)")
    gamma_max: float = option(DEFAULT_GAMMA_MAX, "a split is kept only if gamma_max < sqrt((1 - max cross-half "
                                                 "cosine)/2); in [0, 1), 0: the norm test alone",
        doc=("a CFL split is kept only if `gamma_max < sqrt((1 − max cross-half cosine)/2)`; in [0, 1), "
            "0: the norm test alone"))
    warmup: int = option(20, "rounds before the first split is considered, below rounds (CFL reference code: 20)",
        doc=("rounds before CFL's first split is considered, `>= 0` and below `rounds` (CFL reference "
            "code: 20)"))
    scale_to_model: bool = option(True, "read eps1 and eps2 in units of the round-1 mean update norm / 3.2 (the "
                                        "reference's)",
        doc=("read `eps1`, `eps2` in units of the round-1 mean update norm / 3.2 (the reference code's)"))
    validation: float = option(DEFAULT_VALIDATION, "share of each client's training images held out (never trained "
                                                   "on) to pick its best model of its lineage, in [0, 1) (reference "
                                                   "code: 0.2); 0: none, accuracy_best_of_lineage is null",
        doc=("share of each client's training images held out (never trained on) to pick its best model "
            "of its lineage; 0: none"))

    def validate(self, cfg) -> None:
        check_thresholds(self.eps1, self.eps2)
        if not self.eps1 < self.eps2:
            raise ConfigError("cfl.eps1", self.eps1, f"must be below cfl.eps2 = {self.eps2}: a cluster splits when "
                              "its mean update is small (< eps1) while some client's is large (> eps2)")
        check_gamma_max(self.gamma_max)
        if self.warmup < 0:
            raise ConfigError("cfl.warmup", self.warmup, "must be >= 0 rounds (CFL's reference code: 20)")
        if self.warmup >= cfg.rounds:
            raise ConfigError("cfl.warmup", self.warmup, f"must be below rounds = {cfg.rounds}, or CFL never "
                              "splits; lower cfl.warmup or raise rounds")
        # the share, and (clients of data.train_size examples) both parts non-empty; a file's clients of their own
        # sizes are checked when the split is carved
        check_share(self.validation, cfg.data.train_size, "cfl.validation")


@register
@dataclass
class Cfl(ServerMethod):
    """CFL's round, as the authors' reference code runs it (docs/algorithms.md, "CFL")."""

    cfl: CflConfig = field(default_factory=CflConfig)
    participation: float = 1.0

    name = "cfl"
    gathers_labels = True   # each client's cluster this round (a pending client picks a half in plan)
    report_position = 10
    sections = {"cfl": CflConfig}
    paper_results = {("synthetic", None, 4): (86.60, 0.05)}
    extra_accuracies = (BEST_OF_LINEAGE,)
    validation_key = "cfl.validation"

    @property
    def validation_share(self) -> float:
        """``cfl.validation``: each client's validation split for the
        best-of-lineage choice (:meth:`extra_accuracy`)."""
        return float(self.cfl.validation)

    def init(self, ctx: Context) -> CflState:
        n, device = ctx.n, ctx.device
        return CflState(models=ctx.w0.detach().clone()[None], labels=torch.zeros(n, dtype=torch.int64, device=device),
                        pending=torch.full((n,), -1, dtype=torch.int64, device=device), reference_norm=None, splits=[],
                        cache=ctx.w0.new_zeros(0, ctx.w0.shape[-1]))

    def plan(self, state: CflState, ctx: Context, round_: int, models: torch.Tensor):
        """Every client trains from its cluster's model; a pending client (absent
        when its cluster split) first takes the half whose model has the lower
        loss on its training data (IFCA's rule)."""
        labels, sibling = own(ctx, state.labels), own(ctx, state.pending)
        rows = (sibling >= 0).nonzero().flatten()        # this rank's pending clients
        if rows.numel():
            loss_a = ctx.pair_loss(state.models[labels[rows]], rows)
            loss_b = ctx.pair_loss(state.models[sibling[rows]], rows)
            labels = labels.clone()
            labels[rows] = torch.where(loss_b < loss_a, sibling[rows], labels[rows])
        return state, RoundPlan(start=state.models[labels], labels=labels,   # the server reads each one's cluster
                                trains=trainers(ctx.seed, round_, ctx.n, self.participation, ctx.online(round_)))

    def thresholds(self, reference_norm: float) -> tuple[float, float]:
        """This run's (ε1, ε2): the absolute values, or
        :func:`scaled_thresholds` of ``u_1 = reference_norm``."""
        if not self.cfl.scale_to_model:
            return self.cfl.eps1, self.cfl.eps2
        return scaled_thresholds(reference_norm, self.cfl.eps1, self.cfl.eps2)

    def unseen_candidates(self, saved: dict, weights: torch.Tensor) -> torch.Tensor:
        """The K cluster models (the leaves; fedclust evaluate --unseen)."""
        return saved["server"]["models"]

    def aggregate(self, state: CflState, ctx: Context, view: RoundView):
        """Δθ_i of every participant against the model it was sent; after the
        warm-up (rounds t > cfl.warmup) the splits (:meth:`split`); then each
        cluster model becomes the mean of its participants' trained models (a
        cluster none of whose clients took part keeps its model)."""
        t, after = view.round, view.whole_after()
        waiting = state.pending >= 0
        # every client's cluster this round (a pending one's pick)
        labels = view.gathered_labels().to(state.labels.device)
        active = participants(ctx.seed, t, ctx.n, self.participation, after.device, ctx.online(t))
        # a participant receives its cluster model; a pending client both halves
        received = torch.where(waiting, 2.0, active.to(torch.float64))
        updates = after - state.models[labels]
        reference = state.reference_norm
        if reference is None:                                # round 1: u_1
            reference = float(updates[active].norm(dim=1).mean())
        models, pending, splits, checks = state.models, torch.full_like(state.pending, -1), [], []
        cache = state.cache
        # scaled thresholds with u_1 = 0 (nobody moved in round 1): nothing to split
        if t > self.cfl.warmup and (not self.cfl.scale_to_model or reference > 0):
            models, labels, pending, splits, checks = self.split(t, models, labels, updates, active, reference)
            cache = torch.cat([state.tree(), state.models[[c for _, c, _ in splits]]])   # each parent as it split
        models = cluster_average(after[active], labels[active], models.shape[0], models)
        state = CflState(models=models, labels=labels, pending=pending, reference_norm=reference,
                         splits=[*state.splits, *splits], checks=[*state.checks, *checks], cache=cache)
        return state, server_result(ctx, models[own(ctx, labels)], labels, received, int(active.sum()))

    def split(self, t: int, models: torch.Tensor, labels: torch.Tensor, updates: torch.Tensor,
              active: torch.Tensor, reference: float):
        """Round t's splits: every cluster (as it was when the round began) whose
        participants pass :func:`should_split` is bipartitioned, and the
        bipartition kept if :func:`split_is_separated`.  A split partitions
        the cluster's participants; its absent members become pending between
        the two halves.  Returns the new ``(models, labels, pending)`` and this
        round's records for ``CflState.splits`` and ``CflState.checks``."""
        labels, pending = labels.clone(), torch.full_like(labels, -1)
        splits, checks = [], []
        eps1, eps2 = self.thresholds(reference)
        for c in range(models.shape[0]):                     # clusters, not clients
            members = (labels == c) & active
            if not should_split(updates[members], eps1, eps2):
                continue
            idx = members.nonzero().flatten()
            side, alpha_cross = split_cluster(updates[idx])
            accepted = split_is_separated(alpha_cross, self.cfl.gamma_max)
            checks.append((t, c, alpha_cross, accepted))
            if not accepted:
                continue
            new = models.shape[0]
            labels[idx[side]] = new
            absent = (labels == c) & ~active
            pending = torch.where(absent, torch.full_like(pending, new), pending)
            models = torch.cat([models, models[c:c + 1]])
            splits.append((t, c, new))
        return models, labels, pending, splits, checks

    # -- the tree at evaluation (the reference code's last cells) ----------

    def extra_accuracy(self, state: CflState, ctx: Context, data, models: torch.Tensor, accuracy: torch.Tensor,
                       score) -> dict[str, torch.Tensor]:
        """``accuracy_best_of_lineage``: each of this rank's clients' test
        accuracy with the model of its lineage (the cached models of its
        cluster's ancestors, then its own cluster's model ``models``) that
        :func:`best_of_lineage` picks on its validation split; none without
        a validation split (``cfl.validation=0``)."""
        if data.val_x is None:
            return {}
        labels = own(ctx, state.labels)
        tree = lineage(state.splits, state.models.shape[0]).to(labels.device)[labels]
        allowed = torch.cat([tree, torch.ones(len(labels), 1, dtype=torch.bool, device=labels.device)], dim=1)
        cache = state.tree()
        val_acc, val_loss = lineage_scores(cache, models, allowed, data.val_x, data.val_y, data.val_counts, score)
        choice = best_of_lineage(val_acc, val_loss, allowed)
        return {BEST_OF_LINEAGE: chosen_accuracy(cache, choice, accuracy, data, score)}


def _rows(x, rows: torch.Tensor):
    """``x[rows]`` of a per-client tensor or None."""
    return None if x is None else x[rows]


def lineage_scores(cache: torch.Tensor, models: torch.Tensor, allowed: torch.Tensor, x, y, counts, score):
    """``(accuracy, loss)``, float ``[C, S + 1]``: column s < S the cached
    model ``cache[s]`` on the validation split (``x``, ``y``, ``counts``) of
    each client whose lineage holds it (``allowed[:, s]``; 0 elsewhere), the
    last column each client's own model ``models [C, P]``.  One evaluation
    per cached model, of its descendants only (a loop over splits, not
    clients)."""
    C, S = models.shape[0], cache.shape[0]
    acc = models.new_zeros(C, S + 1)
    loss = models.new_zeros(C, S + 1)
    acc[:, S], loss[:, S] = score(models, x, y, counts)
    for s in range(S):
        rows = allowed[:, s].nonzero().flatten()
        if rows.numel():
            a, l = score(cache[s].expand(len(rows), -1).contiguous(), x[rows], y[rows], _rows(counts, rows))
            acc[rows, s], loss[rows, s] = a, l
    return acc, loss


def chosen_accuracy(cache: torch.Tensor, choice: torch.Tensor, accuracy: torch.Tensor, data, score) -> torch.Tensor:
    """Test accuracy ``[C]`` of each client's chosen model (``choice``: a
    cache row, or ``S`` for its own model, whose test ``accuracy`` is
    already known): only the clients that chose a cached model are
    evaluated again."""
    out = accuracy.clone()
    moved = (choice < cache.shape[0]).nonzero().flatten()
    if moved.numel():
        out[moved] = score(cache[choice[moved]], data.test_x[moved], data.test_y[moved],
                           _rows(data.test_counts, moved))[0].to(out.dtype)
    return out
