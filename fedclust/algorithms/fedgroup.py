"""FedGroup and FedGrouProx (Duan et al., "FedGroup: Efficient Clustered
Federated Learning via Decomposed Data-Driven Measure", arXiv 2010.06870), as
the server algorithms ``fedgroup`` and ``fedgrouprox``: a cold start groups
pre-trained clients by K-means++ on the ternary cosine similarity of their
updates (Algorithms 3-4, Eq. 7-9), newcomers join the nearest group (Eq. 10),
and groups train as FedAvg/FedProx inside, then pull on each other
(Algorithm 2).  What fedclust runs, its keys, and where it follows the authors'
code (GrouProx) rather than the paper's text: docs/algorithms.md, "FedGroup".

Paper: M. Duan, D. Liu, X. Ji, R. Liu, L. Liang, X. Chen, Y. Tan, "FedGroup: Efficient Clustered
Federated Learning via Decomposed Data-Driven Measure", https://arxiv.org/abs/2010.06870
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedclust import rng
from fedclust.algorithms.aggregation import cluster_average, own, participants, trainers
from fedclust.algorithms.base import Context, RoundPlan, RoundView, ServerMethod, server_result
from fedclust.algorithms.fedprox import FedProxConfig
from fedclust.algorithms.registry import register
from fedclust.errors import ConfigError
from fedclust.schema import option

EPS = 1e-12
KMEANS_STREAM = "kmeans"         # rng stream of the K-means++ seeding draws
COLD_START_STREAM = "cold_start"  # rng stream of the cold-start subset S (Alg. 3 l. 2)
N_DIRECTIONS = 3             # "ternary": three base directions (Alg. 3 l. 7)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[A, B]`` cosines between rows of ``a`` and ``b``; 0 where a row is zero."""
    an = a / a.norm(dim=1, keepdim=True).clamp_min(EPS)
    bn = b / b.norm(dim=1, keepdim=True).clamp_min(EPS)
    return an @ bn.T


def base_directions(updates: torch.Tensor, n_directions: int = N_DIRECTIONS) -> torch.Tensor:
    """Base direction vectors ``V = [v_1, v_2, v_3]`` (FedGroup paper Alg. 3 l. 7:
    ``SVD(ΔWᵀ, 3)``) → ``[n_directions, P]``, unit rows, ordered by singular
    value, each signed so that ``Σ_i <Δw_i, v_k> ≥ 0``.

    ``updates = ΔW [αm, P]``, the pre-training updates of the ``α·m``
    pre-trained clients.  V are the top left singular vectors of ``ΔWᵀ``, i.e.
    the top right singular vectors of ``ΔW``: the thin SVD of the wide
    ``[αm, P]`` matrix (memory ~ (αm)·P, no ``P×P`` matrix), without
    mean-centering (the authors' code uses TruncatedSVD).  SVD signs are
    arbitrary; flipping v_k maps ζ_k to 1 − ζ_k, a reflection that leaves every
    K-means distance unchanged, so the sign rule only makes runs reproducible.
    """
    if updates.dim() != 2:
        raise ValueError(f"updates must be [alpha*m, P], got shape {tuple(updates.shape)}")
    m, P = updates.shape
    if m < n_directions or P < n_directions:
        raise ConfigError("fedgroup.pretrain_scale", m,
                          f"FedGroup pre-trains min(fedgroup.pretrain_scale * fedgroup.groups, clients) = {m} clients "
                          f"with P = {P} parameters; the ternary similarity needs at least {n_directions} of each: "
                          "raise fedgroup.pretrain_scale or fedgroup.groups")
    _, _, vh = torch.linalg.svd(updates.to(torch.float64), full_matrices=False)
    v = vh[:n_directions]                                  # right singular vectors of ΔW
    sign = torch.where((updates.to(torch.float64) @ v.T).sum(dim=0) < 0, -1.0, 1.0)
    return (v * sign[:, None]).to(updates.dtype)


def ternary_similarity(updates: torch.Tensor, directions: torch.Tensor) -> torch.Tensor:
    """Ternary cosine similarity ``ℳ_i = ζ(i, V) = (1 − cos(Δw_i, v_k))/2``
    (FedGroup paper Eq. 7-9: ``ζ'_k = <Δw_i, v_k> / (‖Δw_i‖ ‖v_k‖)``, ``ζ = (1 − ζ')/2``)
    → ``[c, n_directions]`` with entries in ``[0, 1]``.

    ``updates [c, P]`` (pre-training updates, any clients); ``directions``
    ``[n_directions, P]`` from :func:`base_directions`.  A zero update gets 0.5.
    """
    if updates.dim() != 2 or directions.dim() != 2 or updates.shape[1] != directions.shape[1]:
        raise ValueError(f"updates [c, P] and directions [k, P] must share P, got "
                         f"{tuple(updates.shape)} and {tuple(directions.shape)}")
    return (1.0 - _cosine(updates, directions)) / 2.0


def kmeans_pp(points: torch.Tensor, k: int, seed: int, restart: int = 0) -> torch.Tensor:
    """K-means++ seeding (Arthur & Vassilvitskii 2007, FedGroup paper ref. [20]) →
    ``[k]`` int64 indices of the chosen points.

    First centre uniform; each next one drawn with probability ∝ ``D(x)²``,
    the squared distance to the nearest chosen centre (uniform over all
    points if every distance is 0).  Draws come from
    ``rng.uniform(seed, 0, KMEANS_STREAM, restart, j)``: a pure function of
    (seed, restart, draw j).  Loops over the k centres only.
    """
    m = points.shape[0]
    u = rng.uniform(seed, 0, KMEANS_STREAM, torch.tensor(restart), torch.arange(k)).tolist()
    x = points.to(torch.float64)
    chosen = [min(int(u[0] * m), m - 1)]
    d2 = (x - x[chosen[0]]).pow(2).sum(dim=1)
    for j in range(1, k):
        total = d2.sum()
        if total <= 0:
            idx = min(int(u[j] * m), m - 1)
        else:
            cdf = torch.cumsum(d2, dim=0)
            idx = int(torch.searchsorted(cdf, u[j] * total, right=True).clamp_max(m - 1))
            while d2[idx] <= 0:       # a point already at distance 0 has probability 0
                idx -= 1
        chosen.append(idx)
        d2 = torch.minimum(d2, (x - x[idx]).pow(2).sum(dim=1))
    return torch.tensor(chosen, dtype=torch.int64, device=points.device)


def decomposed_cosine(updates: torch.Tensor, n_directions: int = N_DIRECTIONS) -> torch.Tensor:
    """ℳ of FedGroup paper Algorithm 3 in one call: ``ternary_similarity(ΔW,
    base_directions(ΔW))`` → ``[αm, 3]``.  The paper always uses three
    directions, whatever the number of groups."""
    return ternary_similarity(updates, base_directions(updates, n_directions))


def _nearest(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centre (squared Euclidean), ties to the lowest index."""
    return (x[:, None, :] - c[None]).pow(2).sum(-1).argmin(dim=1)


def lloyd(points: torch.Tensor, centers: torch.Tensor, max_iter: int = 300) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Lloyd iterations from ``centers [k, d]`` until no assignment changes
    (or ``max_iter``) → ``(labels [m], centers [k, d], inertia)``.

    Assignment: nearest centre in squared Euclidean distance, ties to the
    lowest index.  Update: the mean of the assigned points; an empty cluster
    keeps its centre.  ``inertia = Σ_i ‖x_i − c_{label_i}‖²`` at the end.
    """
    x = points.to(torch.float64)
    c = centers.to(torch.float64).clone()
    k = c.shape[0]
    labels = _nearest(x, c)
    for _ in range(max_iter):
        sums = torch.zeros_like(c).index_add_(0, labels, x)
        counts = torch.zeros(k, dtype=x.dtype, device=x.device).index_add_(0, labels, torch.ones_like(x[:, 0]))
        c = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c)
        new = _nearest(x, c)
        if torch.equal(new, labels):
            break
        labels = new
    inertia = float((x - c[labels]).pow(2).sum())
    return labels, c, inertia


def kmeans(points: torch.Tensor, k: int, seed: int, n_init: int = 10,
           max_iter: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    """K-means with K-means++ seeding, best of ``n_init`` restarts by inertia
    (first restart wins ties) → ``(labels int64 [m], centers [k, d])``
    (FedGroup paper Alg. 4 l. 3, as sklearn ``KMeans`` in the authors' code)."""
    if points.dim() != 2 or points.shape[0] < k or k < 1:
        raise ConfigError("fedgroup.groups", k,
                          f"K-means needs 1 <= groups <= points ({points.shape[0]}); lower fedgroup.groups")
    best = None
    for r in range(n_init):
        init = points.to(torch.float64)[kmeans_pp(points, k, seed, r)]
        labels, centers, inertia = lloyd(points, init, max_iter)
        if best is None or inertia < best[2]:
            best = (labels, centers, inertia)
    if best is None:
        raise ValueError(f"kmeans: n_init = {n_init}: K-means needs at least one restart")
    return best[0], best[1].to(points.dtype)


def group_cold_start(
    updates: torch.Tensor, w0: torch.Tensor, groups: int, seed: int, n_init: int = 10
) -> dict[str, torch.Tensor]:
    """Group cold start, FedGroup paper Algorithm 4, on the pre-training updates
    ``ΔW [αm, P]`` of the pre-trained clients (from the common ``w0 [P]``).

    Returns a dict (the keys name what they hold, m = ``groups``):
      ``assign`` int64 [αm]: group of each pre-trained client (K-means++ on ℳ);
      ``similarity`` [αm, 3]: ℳ;  ``directions`` [3, P]: V;
      ``centroids`` [K, 3]: ``g_j.cm`` (Alg. 4 l. 6);
      ``models`` [K, P]: ``w_0^(g_j) = w0 + mean_{c∈g_j} Δw_0^(c)`` (l. 7, as the code);
      ``updates`` [K, P]: ``Δw_0^(g_j) = w_0^(g_j) − w0`` (l. 8).
    A group K-means leaves empty (possible only with duplicate points) gets
    ``w0`` and a zero update.
    """
    directions = base_directions(updates)
    sim = ternary_similarity(updates, directions)
    assign, centroids = kmeans(sim, groups, seed, n_init=n_init)
    P = updates.shape[1]
    mean_upd = cluster_average(updates, assign, groups,
                               torch.zeros(groups, P, dtype=updates.dtype, device=updates.device))
    return {
        "assign": assign,
        "similarity": sim,
        "directions": directions,
        "centroids": centroids,
        "models": w0[None, :] + mean_upd,
        "updates": mean_upd,
    }


def newcomer_distance(pre_updates: torch.Tensor, group_updates: torch.Tensor) -> torch.Tensor:
    """Eq. 10's score ``(1 − cos∠(Δw_t^(g_j), Δw_pre^(i)))/2`` → ``[c, K]`` in ``[0, 1]``.

    ``pre_updates [c, P]``: newcomers' pre-training updates from the current
    global model; ``group_updates [K, P]``: each group's latest update.  A
    zero vector has cosine 0 (score 0.5).
    """
    if pre_updates.dim() != 2 or group_updates.dim() != 2 or pre_updates.shape[1] != group_updates.shape[1]:
        raise ValueError(f"pre_updates [c, P] and group_updates [K, P] must share P, got "
                         f"{tuple(pre_updates.shape)} and {tuple(group_updates.shape)}")
    return (1.0 - _cosine(pre_updates, group_updates)) / 2.0


def place_newcomers(pre_updates: torch.Tensor, group_updates: torch.Tensor) -> torch.Tensor:
    """Client cold start, FedGroup paper Eq. 10: ``g* = argmin_j`` of
    :func:`newcomer_distance` → int64 ``[c]`` (ties to the lowest group)."""
    return newcomer_distance(pre_updates, group_updates).argmin(dim=1)


def check_eta_g(eta_g: float) -> float:
    """η_g as a float, refused unless finite and >= 0 (``fedgroup.inter_lr``)."""
    eta_g = float(eta_g)
    if not (eta_g >= 0 and eta_g < float("inf")):
        raise ConfigError("fedgroup.inter_lr", eta_g, "FedGroup's inter-group learning rate eta_g must be finite "
                          "and >= 0 (paper: 0.01)")
    return eta_g


def inter_group_aggregate(group_models: torch.Tensor, eta_g: float, normalized: bool = True) -> torch.Tensor:
    """Inter-group aggregation, FedGroup paper Alg. 2 l. 20-25 → ``[K, P]``.

    With ``u_l = w̃_l/‖w̃_l‖`` and ``S = Σ_l u_l``:
    literal (``normalized=False``): ``w_j = w̃_j + η_g (S − u_j)``, which adds
    unit vectors to a model (identical groups would grow every round);
    default, the authors' code, a convex combination: ``w_j = (w̃_j + η_g (S − u_j)) /
    (1 + η_g Σ_{l≠j} 1/‖w̃_l‖)``.  A zero model contributes nothing.
    ``η_g = 0`` or K = 1 returns the models unchanged.
    """
    eta_g = check_eta_g(eta_g)
    if group_models.dim() != 2:
        raise ValueError(f"group_models must be [K, P], got shape {tuple(group_models.shape)}")
    x = group_models.to(torch.float64)
    norms = x.norm(dim=1)
    inv = torch.where(norms > 0, 1.0 / norms.clamp_min(EPS), torch.zeros_like(norms))
    units = x * inv[:, None]
    others = units.sum(dim=0, keepdim=True) - units              # Σ_{l≠j} u_l
    pulled = x + eta_g * others
    if normalized:
        pulled = pulled / (1.0 + eta_g * (inv.sum() - inv))[:, None]
    return pulled.to(group_models.dtype)


def global_aggregate(group_models: torch.Tensor) -> torch.Tensor:
    """Global model = unweighted mean of the group models (FedGroup paper Alg. 2
    l. 11); kept only for newcomers' cold start → ``[P]``."""
    return group_models.mean(dim=0)


# ----------------------------------------------------------------------------
# Round object


def cold_start_clients(seed: int, n: int, count: int, device=None) -> torch.Tensor:
    """Bool ``[n]``: Alg. 3's random subset S of ``min(count, n)`` clients,
    the lowest keys ``rng.uniform(seed, 0, COLD_START_STREAM, i, 0)``."""
    keys = rng.uniform(seed, 0, COLD_START_STREAM, torch.arange(n), 0)
    mask = torch.zeros(n, dtype=torch.bool)
    mask[torch.argsort(keys, stable=True)[:min(count, n)]] = True
    return mask.to(device)


@dataclass
class FedGroupConfig:
    """The ``fedgroup`` section (FedGrouProx's proximal weight is ``fedprox.mu``:
    FedGroup paper, "mu as recommended by FedProx")."""

    groups: int = option(2, "m, the number of groups, in [1, clients] (FedGroup paper: 3-5 per data set; 2: the "
                            "default data.num_clusters)")
    pretrain_scale: int = option(20, "FedGroup's alpha: alpha * groups clients are pre-trained for the cold start "
                                     "(paper: 20)")
    inter_lr: float = option(0.01, "eta_g, the inter-group aggregation rate, >= 0 (paper: 0.01)")

    def validate(self, cfg) -> None:
        n = cfg.clients
        if not 1 <= self.groups <= n:
            raise ConfigError("fedgroup.groups", self.groups, f"must lie in [1, clients = {n}]")
        if self.pretrain_scale < 1:
            raise ConfigError("fedgroup.pretrain_scale", self.pretrain_scale,
                              "must be >= 1: alpha * groups clients are pre-trained (paper: 20)")
        pre = min(self.pretrain_scale * self.groups, n)
        if pre < max(N_DIRECTIONS, self.groups):
            raise ConfigError("fedgroup.pretrain_scale", self.pretrain_scale,
                              f"pre-trains min(alpha * groups, clients) = {pre} clients but the ternary similarity "
                              f"needs at least {N_DIRECTIONS} and K-means at least groups = {self.groups}; raise it "
                              "(or clients)")
        check_eta_g(self.inter_lr)


@dataclass
class FedGroupState:
    groups: torch.Tensor          # [m, P] group models w^(g_j) (replicated; m is fedgroup.groups)
    group_updates: torch.Tensor   # [m, P] each group's latest update (Eq. 10)
    global_model: torch.Tensor    # [P] w_t, for newcomers (Alg. 2 l. 11)
    assignment: torch.Tensor      # [n] int64 group of every client, -1: not yet in a group


@register
@dataclass
class FedGroup(ServerMethod):
    """FedGroup's round (FedGroup paper Algorithms 2-4, Eq. 10; docs/algorithms.md, "FedGroup")."""

    fedgroup: FedGroupConfig = field(default_factory=FedGroupConfig)
    participation: float = 1.0

    name = "fedgroup"
    report_position = 11
    sections = {"fedgroup": FedGroupConfig}
    cluster_count_key = "fedgroup.groups"

    @property
    def mu(self) -> float:
        """The proximal weight of local training: none (FedGrouProx: ``fedprox.mu``)."""
        return 0.0

    def init(self, ctx: Context) -> FedGroupState:
        models = ctx.w0.detach().expand(self.fedgroup.groups, -1).clone()
        return FedGroupState(groups=models, group_updates=torch.zeros_like(models), global_model=models[0].clone(),
                             assignment=torch.full((ctx.n,), -1, dtype=torch.int64, device=ctx.device))

    def starts(self, state: FedGroupState, assignment: torch.Tensor) -> torch.Tensor:
        """``[rows, P]``: what each client trains from and is evaluated with
        (FedGroup paper §IV-A, Metrics): its group's model, or the global
        model while it is in no group (assignment -1)."""
        grouped = (assignment >= 0)[:, None]
        return torch.where(grouped, state.groups[assignment.clamp_min(0)], state.global_model[None])

    def plan(self, state: FedGroupState, ctx: Context, round_: int, models: torch.Tensor):
        start = self.starts(state, own(ctx, state.assignment))
        trains = trainers(ctx.seed, round_, ctx.n, self.participation, ctx.online(round_))
        if trains is not None and round_ == 1:   # the cold start's subset S trains too (its pre-training)
            trains = trains | cold_start_clients(ctx.seed, ctx.n, self.fedgroup.pretrain_scale * self.fedgroup.groups)
        return state, RoundPlan(start=start, anchor=start if self.mu > 0 else None, mu=self.mu, trains=trains)

    def unseen_candidates(self, saved: dict, weights: torch.Tensor) -> torch.Tensor:
        """The m group models (fedclust evaluate --unseen)."""
        return saved["server"]["groups"]

    def aggregate(self, state: FedGroupState, ctx: Context, view: RoundView):
        """Round 1: the group cold start (Alg. 3-4) on the subset S, whose
        round-1 updates from w0 are their pre-training updates; the other
        round-1 participants trained from w0 too and are placed by Eq. 10.
        Later rounds: newcomers (possible when participation < 1) are placed by
        Eq. 10 against the groups' latest updates as they were when the round
        began, and are not averaged into a group; members are averaged per
        group (Alg. 2 l. 12-19, FedAvg/FedProx inside the group; an empty group
        keeps its model), then the groups pull on each other
        (:func:`inter_group_aggregate`).  The global model is the mean of the
        group models (l. 11); a group's latest update is its model's change
        over the round."""
        g, after, t = self.fedgroup, view.whole_after(), view.round
        active = participants(ctx.seed, t, ctx.n, self.participation, after.device, ctx.online(t))
        assignment = state.assignment.clone()
        if t == 1:
            cold = cold_start_clients(ctx.seed, ctx.n, g.pretrain_scale * g.groups, after.device)
            active = active | cold
            w0 = state.global_model
            grouping = group_cold_start(after[cold] - w0, w0, g.groups, ctx.seed)
            assignment[cold] = grouping["assign"]
            newcomers = active & ~cold
            assignment[newcomers] = place_newcomers(after[newcomers] - w0, grouping["updates"])
            models, group_updates = grouping["models"], grouping["updates"]
        else:
            newcomers = active & (assignment < 0)
            members = active & (assignment >= 0)
            assignment[newcomers] = place_newcomers(after[newcomers] - state.global_model, state.group_updates)
            intra = cluster_average(after[members], assignment[members], g.groups, state.groups)
            models = inter_group_aggregate(intra, g.inter_lr)
            group_updates = models - state.groups
        state = FedGroupState(groups=models, group_updates=group_updates, global_model=global_aggregate(models),
                              assignment=assignment)
        return state, server_result(ctx, self.starts(state, own(ctx, assignment)), assignment,
                                    active.to(torch.float64), int(active.sum()))


@register
@dataclass
class FedGrouProx(FedGroup):
    """FedGrouProx: FedGroup whose clients add FedProx's proximal term (weight
    ``fedprox.mu``, FedGroup paper Alg. 2 l. 17-18: "mu as recommended by FedProx")."""

    fedprox: FedProxConfig = field(default_factory=FedProxConfig)

    name = "fedgrouprox"
    report_position = 12
    sections = {"fedgroup": FedGroupConfig, "fedprox": FedProxConfig}

    @property
    def mu(self) -> float:
        return self.fedprox.mu
