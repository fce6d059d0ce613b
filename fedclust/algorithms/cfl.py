"""CFL server math: Sattler, Müller & Samek, "Clustered Federated Learning:
Model-Agnostic Distributed Multitask Optimization Under Privacy
Constraints", IEEE TNNLS 2021 (named in papers/003 and papers/004), as SPEC §5
fixes it.

One model per cluster, starting with one cluster.  After the warm-up, a
cluster c splits in two when (CFL Algorithm 1 / Eq. for the stopping
criterion, and the authors' reference code)

    ‖ mean_{i∈c} Δθ_i ‖ < ε1    (the cluster's federated objective is near a
                                  stationary point)
    max_{i∈c} ‖Δθ_i‖   > ε2    (but some client is not: incongruent risks)
    |c| > 2                     (a split needs at least 3 clients),

and the split is the complete-linkage bipartition of the clients' pairwise
cosine similarities ``α_ij = <Δθ_i, Δθ_j> / (‖Δθ_i‖‖Δθ_j‖)`` (distance
``−α``; complete linkage only compares distances, so ``1 − α`` gives the same
tree).  Splits recurse over rounds, so the number of clusters is found.

The mean update is unweighted, as in the reference code; pass ``weights``
(data sizes) for the paper's ``|D_i|/|D_c|`` weighting.

Scaling ε1 = 0.4, ε2 = 1.6 "to the model" (SPEC §5 leaves the rule open).
Update norms grow with the parameter count and the learning rate, so the
absolute defaults only suit the model they were tuned on.  Rule adopted
here (:func:`scaled_thresholds`): read ε1 and ε2 in units in which the
default ε2 = 1.6 is the model's own update scale, measured once — ``u_w``,
the mean client update norm ``mean_i ‖Δθ_i‖`` over all clients in the last
warm-up round (one cluster, so every client trains the same model) — and
let both thresholds follow the learning-rate schedule, since update norms
scale with it:

    s_t  = (u_w / 1.6) · (lr_t / lr_w),     ε1_t = ε1 · s_t,     ε2_t = ε2 · s_t.

With the defaults: split when some client still moves at least as far as a
typical client did at the end of warm-up (lr-corrected), while the
cluster's mean update has shrunk below a quarter of that.  A larger
``cfl.eps2`` asks for a client that moves further (ε2 = 3.2: twice the
typical update) before a cluster splits.  Passing ``reference_norm = 1.6``
and ``lr_ratio = 1`` gives back the absolute values.

Round object :class:`Cfl` (``cfl``), below the math, as the authors'
reference code runs a round: every cluster's clients train from the
cluster model; the server computes each participant's update
``Δθ_i = θ_i^after − θ_{c(i)}`` (it knows what it sent); after the warm-up
(rounds ``t > warmup``) each cluster meeting :func:`should_split` on its
participants' updates is bipartitioned; then every (new) cluster model
becomes the mean of its participants' trained models (a cluster nobody of
which took part keeps its model).  ``u_w`` for :func:`scaled_thresholds` is
measured in round ``max(warmup, 1)``; ``lr_t/lr_w = lr_decay^(t − max(warmup, 1))``.

Participation < 1 (the reference code has full participation): a split
partitions the cluster's participants; its absent members become
*pending* between the two halves and, in their next round, take the half
whose model has the lower loss on their training data (the IFCA rule,
``ctx.pair_loss``).  The server learns that choice from the model they
started from, so with p < 1 the round gathers the start models too
(``gathers_before``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedclust.algorithms.base import Context, RoundPlan, RoundView
from fedclust.algorithms.fedavg import check_weights, own, participants, server_result
from fedclust.algorithms.ifca import cluster_average
from fedclust.errors import ConfigError

EPS = 1e-12  # as the CFL reference code: cos = <a,b> / (‖a‖‖b‖ + 1e-12)


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
    for name, v in (("algorithm.eps1", eps1), ("algorithm.eps2", eps2)):
        if not (float(v) > 0 and float(v) < float("inf")):
            raise ConfigError(name, v, "CFL split threshold must be a finite number > 0 (defaults 0.4 and 1.6)")


def should_split(
    updates: torch.Tensor,
    eps1: float,
    eps2: float,
    min_clients: int = 3,
    weights: torch.Tensor | None = None,
) -> bool:
    """CFL split criterion for one cluster (SPEC §5): ``‖mean Δθ‖ < ε1`` and
    ``max ‖Δθ_i‖ > ε2`` and ``m ≥ min_clients`` (default 3: "more than 2
    clients").  ``updates [m, P]`` are the cluster's client updates of this
    round; a cluster with fewer than ``min_clients`` clients never splits
    (returns False, also for m = 0)."""
    check_thresholds(eps1, eps2)
    if updates.dim() != 2:
        raise ValueError(f"updates must be [m, P], got shape {tuple(updates.shape)}")
    if updates.shape[0] < max(min_clients, 2):
        return False
    mean_norm, max_norm = update_norms(updates, weights)
    return bool(mean_norm < eps1) and bool(max_norm > eps2)


DEFAULT_EPS2 = 1.6   # the unit of the scaled thresholds: the warm-up update norm


def scaled_thresholds(
    reference_norm: float, eps1: float = 0.4, eps2: float = DEFAULT_EPS2, lr_ratio: float = 1.0
) -> tuple[float, float]:
    """ε1, ε2 scaled to the model (module docstring):
    ``s = reference_norm / 1.6 · lr_ratio``; returns ``(ε1·s, ε2·s)``.

    ``reference_norm``: mean client update norm of the last warm-up round;
    ``lr_ratio``: ``lr_t / lr_w``, this round's learning rate over the one
    of that warm-up round.
    """
    check_thresholds(eps1, eps2)
    if not (float(reference_norm) > 0 and float(reference_norm) < float("inf")):
        raise ConfigError("reference_norm", reference_norm,
                          "needs the (finite, > 0) mean client update norm of the last warm-up round")
    if not float(lr_ratio) > 0:
        raise ConfigError("lr_ratio", lr_ratio, "must be > 0 (learning rate now / at the end of warm-up)")
    s = float(reference_norm) / DEFAULT_EPS2 * float(lr_ratio)
    return float(eps1) * s, float(eps2) * s


def pairwise_cosine(updates: torch.Tensor) -> torch.Tensor:
    """``α_ij = <Δθ_i, Δθ_j> / (‖Δθ_i‖‖Δθ_j‖ + 1e-12)`` → ``[m, m]``
    (CFL Eq. for the cosine similarity; 0 for a zero update)."""
    if updates.dim() != 2:
        raise ValueError(f"updates must be [m, P], got shape {tuple(updates.shape)}")
    norms = updates.norm(dim=1)
    return (updates @ updates.T) / (norms[:, None] * norms[None, :] + EPS)


def complete_linkage_labels(distance: torch.Tensor, n_clusters: int) -> torch.Tensor:
    """Agglomerative complete-linkage clustering of ``m`` items stopped at
    ``n_clusters`` clusters → int64 ``[m]`` labels numbered by smallest member
    (the item 0's cluster is 0).

    ``distance [m, m]`` symmetric (it is symmetrised as ``(D + Dᵀ)/2``).  Each
    of the ``m − n_clusters`` merges joins the two clusters with the smallest
    complete-linkage distance ``max_{a∈A, b∈B} D_ab``; ties go to the pair
    that comes first in row-major order.  Distances between clusters follow
    the Lance-Williams rule ``d(A∪B, C) = max(d(A,C), d(B,C))``.  O(m³) work
    in ``m`` vectorized steps — a split happens a few times per run.
    """
    m = distance.shape[0]
    if distance.shape != (m, m):
        raise ValueError(f"distance must be square [m, m], got {tuple(distance.shape)}")
    if not 1 <= n_clusters <= max(m, 1):
        raise ValueError(f"n_clusters must lie in [1, {m}], got {n_clusters}")
    d = ((distance + distance.T) / 2).to(torch.float64).clone()
    inf = torch.tensor(float("inf"), dtype=d.dtype, device=d.device)
    upper = torch.ones(m, m, dtype=torch.bool, device=d.device).triu(1)
    labels = torch.arange(m, device=d.device)
    active = torch.ones(m, dtype=torch.bool, device=d.device)
    for _ in range(m - n_clusters):
        pair_ok = upper & active[:, None] & active[None, :]
        flat = torch.where(pair_ok, d, inf).flatten().argmin()
        a, b = int(flat // m), int(flat % m)            # a < b
        merged = torch.maximum(d[a], d[b])
        d[a], d[:, a] = merged, merged
        active[b] = False
        labels[labels == b] = a
    _, canon = torch.unique(labels, return_inverse=True)  # representatives are the smallest members
    return canon


def bipartition(similarity: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """CFL split: complete-linkage bipartition of ``similarity [m, m]``
    (distance ``−similarity``) → ``(idx_a, idx_b)``, sorted int64 index
    tensors into the cluster's clients; ``idx_a`` holds client 0.

    Equal to ``scipy.cluster.hierarchy.linkage(squareform(1 − S),
    "complete")`` cut at 2 clusters when no distances tie.
    """
    m = similarity.shape[0]
    if similarity.dim() != 2 or similarity.shape != (m, m) or m < 2:
        raise ValueError(f"similarity must be square [m, m] with m >= 2, got {tuple(similarity.shape)}")
    labels = complete_linkage_labels(-similarity, 2)
    idx = torch.arange(m, device=similarity.device)
    return idx[labels == 0], idx[labels == 1]


# ----------------------------------------------------------------------------
# Round object


@dataclass
class CflState:
    models: torch.Tensor          # [K, P] cluster models (K grows with splits), replicated
    labels: torch.Tensor          # [n] int64 cluster of every client
    pending: torch.Tensor         # [n] int64 sibling cluster a client still chooses against (-1: none)
    reference_norm: float | None  # u_w, mean participant update norm of round max(warmup, 1)
    splits: list                  # (round, parent, new cluster) of every split, for the record


def split_cluster(updates: torch.Tensor) -> torch.Tensor:
    """Bool ``[m]``: the members of the bipartition's second half (the half
    without the cluster's first participant), :func:`bipartition` of the
    pairwise cosines of ``updates [m, P]``."""
    _, idx_b = bipartition(pairwise_cosine(updates))
    side = torch.zeros(updates.shape[0], dtype=torch.bool, device=updates.device)
    side[idx_b] = True
    return side


@dataclass
class Cfl:
    """CFL round (module docstring)."""

    eps1: float = 0.4
    eps2: float = 1.6
    warmup: int = 20
    scale_to_model: bool = True
    lr_decay: float = 1.0
    participation: float = 1.0
    name: str = "cfl"

    def __post_init__(self):
        check_thresholds(self.eps1, self.eps2)

    @property
    def gathers_before(self) -> bool:
        return self.participation < 1.0

    @property
    def reference_round(self) -> int:
        return max(self.warmup, 1)

    def init(self, ctx: Context) -> CflState:
        n, device = ctx.n, ctx.device
        return CflState(models=ctx.w0.detach().clone()[None], labels=torch.zeros(n, dtype=torch.int64, device=device),
                        pending=torch.full((n,), -1, dtype=torch.int64, device=device), reference_norm=None, splits=[])

    def plan(self, state: CflState, ctx: Context, round_: int, models: torch.Tensor):
        labels, sibling = own(ctx, state.labels), own(ctx, state.pending)
        waiting = (sibling >= 0).nonzero().flatten()
        if waiting.numel():   # pending clients pick the half of lower training loss (module docstring)
            if ctx.pair_loss is None:
                raise ValueError("CFL with participation < 1 needs ctx.pair_loss to place absent clients after a split")
            loss_a = ctx.pair_loss(state.models[labels[waiting]], waiting)
            loss_b = ctx.pair_loss(state.models[sibling[waiting]], waiting)
            labels = labels.clone()
            labels[waiting] = torch.where(loss_b < loss_a, sibling[waiting], labels[waiting])
        return state, RoundPlan(start=state.models[labels])

    def thresholds(self, reference_norm: float, round_: int) -> tuple[float, float]:
        """This round's (ε1, ε2): the absolute values, or
        :func:`scaled_thresholds` of ``u_w = reference_norm``."""
        if not self.scale_to_model:
            return self.eps1, self.eps2
        ratio = self.lr_decay ** (round_ - self.reference_round)
        return scaled_thresholds(reference_norm, self.eps1, self.eps2, ratio)

    def aggregate(self, state: CflState, ctx: Context, view: RoundView):
        t, after = view.round, view.all_after
        labels, pending = state.labels.clone(), state.pending
        waiting = pending >= 0
        if bool(waiting.any()):   # the half each pending client started from
            rows = view.all_before[waiting]
            d_a = (rows - state.models[labels[waiting]]).pow(2).sum(dim=1)
            d_b = (rows - state.models[pending[waiting]]).pow(2).sum(dim=1)
            labels[waiting] = torch.where(d_b < d_a, pending[waiting], labels[waiting])
        active = participants(ctx.seed, t, ctx.n, self.participation, after.device)
        # a participant receives its cluster model; a pending client both halves
        received = torch.where(waiting, 2.0, active.to(torch.float64))
        pending = torch.full_like(pending, -1)
        updates = after - state.models[labels]               # Δθ_i against the model the client was sent
        reference = state.reference_norm
        if reference is None and t >= self.reference_round:
            reference = float(updates[active].norm(dim=1).mean())
        models, splits = state.models, list(state.splits)
        # scaled thresholds with u_w = 0 (nobody moved in warm-up): nothing to split
        if t > self.warmup and (not self.scale_to_model or reference > 0):
            eps1, eps2 = self.thresholds(reference, t)
            for c in range(models.shape[0]):                 # clusters, not clients
                members = (labels == c) & active
                if not should_split(updates[members], eps1, eps2):
                    continue
                new = models.shape[0]
                idx = members.nonzero().flatten()
                labels[idx[split_cluster(updates[idx])]] = new
                absent = (labels == c) & ~active
                pending = torch.where(absent, torch.full_like(pending, new), pending)
                models = torch.cat([models, models[c:c + 1]])
                splits.append((t, c, new))
        models = cluster_average(after[active], labels[active], models.shape[0], models)
        state = CflState(models=models, labels=labels, pending=pending, reference_norm=reference, splits=splits)
        return state, server_result(ctx, models[own(ctx, labels)], labels, received, int(active.sum()))


def make_cfl(cfg) -> Cfl:
    c = cfg.cfl
    return Cfl(eps1=c.eps1, eps2=c.eps2, warmup=c.warmup, scale_to_model=c.scale_to_model,
               lr_decay=cfg.train.lr_decay, participation=cfg.participation)
