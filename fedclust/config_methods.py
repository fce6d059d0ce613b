"""Config sections of the centralized methods (docs/algorithms.md), one per method,
named as the papers name their hyperparameters; defaults are the papers'
where a paper gives one (each line says where it comes from).

``validate_methods`` checks the section of the chosen method (and
``participation``) before any process starts; every error names the field,
the value and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class PensConfig:
    # What counts as "chosen" in stage one and how often a peer must be chosen to join the fixed list
    # (fedclust/algorithms/pens.py):
    # "reference": times a peer was in the top k, kept when above k*T1/(n-1) - 1, as the PENS reference
    #   code (Karlsson & Onoszko) counts (docs/algorithms.md);
    # "selected": the same counts against ceil(T1*(l+k)/n), the threshold PANM paper §4.2 quotes;
    # "drawn_and_selected": times drawn as a candidate plus times selected, against ceil(T1*(l+k)/n),
    #   whose expectation under random choice is exactly T1*(l+k)/n.
    count: str = "reference"
    # A fixed list that comes out empty: "last_topk" keeps the last stage-one top k (not in the papers);
    # "alone": stays empty and the client trains alone, as the reference code does.
    empty_list: str = "last_topk"
    # Peers drawn from the fixed list each stage-two round; 0 means algorithm.k (docs/algorithms.md).  The reference
    # code draws 20 (all of the list if shorter).
    stage2_neighbours: int = 0


PENS_COUNTS = ("reference", "selected", "drawn_and_selected")
PENS_EMPTY_LISTS = ("last_topk", "alone")


@dataclass
class PanmConfig:
    # What HNM's EM runs on for panm_loss (docs/algorithms.md): "neg_loss" (default) y = -F_i(w_j), the negative loss;
    # "inverse" y = 1/F_i(w_j), PANM paper's literal similarity.  CNI ranks by 1/F under either (same order).
    # panm_grad ignores it: its similarity is a cosine, not a loss.
    em_input: str = "neg_loss"
    # The variances of HNM's two Gaussians: "separate" (default, the PANM paper's Eq. 15: one sigma per
    # component) or "tied" (one pooled within-component sigma for both); see docs/algorithms.md, PANM.
    em_variance: str = "separate"
    # panm_grad: the weight of the update cosine cos(Delta_i, Delta_j) in the similarity HNM's EM runs on in
    # stage two (CNI uses algorithm.alpha).  0 (default): the weight cosine alone, since in stage two the update
    # cosine carries no cluster signal and only noise (docs/algorithms.md, PANM, departure 4); the PANM paper uses
    # its alpha = 0.5 in both stages.
    hnm_alpha: float = 0.0


PANM_EM_INPUTS = ("neg_loss", "inverse")
PANM_EM_VARIANCES = ("separate", "tied")


def check_panm_em_input(em_input) -> None:
    """Refuse a ``panm.em_input`` that is not one of :data:`PANM_EM_INPUTS`."""
    from fedclust.errors import ConfigError

    if em_input not in PANM_EM_INPUTS:
        raise ConfigError("panm.em_input", em_input, f"use one of {', '.join(PANM_EM_INPUTS)} (what PANMLoss's "
                          "HNM runs its EM on: neg_loss = -F, the default; inverse = 1/F as PANM paper writes it)")


def check_panm_em_variance(em_variance) -> None:
    """Refuse a ``panm.em_variance`` that is not one of :data:`PANM_EM_VARIANCES`."""
    from fedclust.errors import ConfigError

    if em_variance not in PANM_EM_VARIANCES:
        raise ConfigError("panm.em_variance", em_variance, f"use one of {', '.join(PANM_EM_VARIANCES)} (the "
                          "variances of HNM's two Gaussians: one per component, or one pooled for both)")


def check_pens(pens, clients: int) -> None:
    """Refuse a ``pens`` section PENS cannot run with."""
    from fedclust.errors import ConfigError

    if pens.count not in PENS_COUNTS:
        raise ConfigError("pens.count", pens.count, f"use one of {', '.join(PENS_COUNTS)} (what counts toward "
                          "PENS's threshold: reference = top-k picks above k*T1/(n-1) - 1, the default; selected "
                          "and drawn_and_selected use ceil(T1*(l+k)/n))")
    if pens.empty_list not in PENS_EMPTY_LISTS:
        raise ConfigError("pens.empty_list", pens.empty_list, f"use one of {', '.join(PENS_EMPTY_LISTS)} (what "
                          "an empty fixed list becomes: the last stage-one top k, or no peers at all)")
    if not 0 <= pens.stage2_neighbours <= clients - 1:
        raise ConfigError("pens.stage2_neighbours", pens.stage2_neighbours,
                          f"must lie in [0, clients - 1 = {clients - 1}]: peers drawn from the fixed list each "
                          "stage-two round; 0 uses algorithm.k (the reference code draws 20)")


@dataclass
class FedProxConfig:
    # FedProx's proximal weight; Li et al. (MLSys 2020) tune it over {0.001, 0.01, 0.1, 1}
    # per data set and name no single default.  Also FedGrouProx's mu (FedGroup paper §IV-A).
    mu: float = 0.01


@dataclass
class IfcaConfig:
    clusters: int = 2            # c, the number of cluster models (IFCA paper; PANM paper Table 5 sets c = true clusters)
    # IFCA paper restarts Algorithm 1 from several random inits ("a few restarts suffice"; 10 in its
    # success-rate runs).  The run tries each for restart_rounds rounds, one after the other, and goes on
    # with the one of lowest IFCA objective mean_i min_j F_i(theta_j) (fedclust/algorithms/ifca.py).
    restarts: int = 3
    restart_rounds: int = 10


@dataclass
class CflConfig:
    eps1: float = 0.4            # split when the mean update norm is below eps1 ... (CFL reference code, docs/algorithms.md)
    eps2: float = 1.6            # ... and the largest client update norm above eps2
    gamma_max: float = 0.5       # split kept only if gamma_max < sqrt((1 - max cross-half cosine)/2) (CFL Alg. 1)
    warmup: int = 20             # rounds before the first split is considered (CFL reference code: round > 20)
    scale_to_model: bool = True  # read eps1/eps2 in units of (round-1 mean update norm)/3.2, the reference's u_1 (cfl.py)


@dataclass
class FedGroupConfig:
    groups: int = 2              # m, the number of groups (FedGroup paper uses 3-5 per data set; 2 = the default number of clusters)
    pretrain_scale: int = 20     # alpha: alpha * m clients are pre-trained for the cold start (FedGroup paper §IV-A)
    inter_lr: float = 0.01       # eta_g, the inter-group aggregation rate (FedGroup paper §IV-A)
    # FedGrouProx's proximal weight is fedprox.mu (FedGroup paper: "mu as recommended by FedProx")


@dataclass
class FpfcConfig:
    # FPFC paper gives no values for lambda, xi, rho; it asks nu in [xi, 0.5] and uses SCAD's a.
    # Its Theorem 1 needs rho > max(2*lam/xi, 2/(a-1), ...), enforced (fpfc.check_theorem1).  lam/xi
    # fixes the bound: lam/xi = 4 gives rho > 8, and rho = 10 keeps the local proximal step stable at
    # the the default lr (0.08, momentum 0.9: lr*rho = 0.8; rho = 20 diverged).  nu = xi, the lower end of
    # the paper's range.  lam = 2 units of round 1's update (about 0.6 in absolute units on Synthetic):
    # on configs/synthetic_cluster4.yaml with data.synthetic_inputs=shared these find the 4 clusters
    # (ARI 1); with FedProx's per-client inputs no setting tried does (README, "FPFC's defaults").
    lam: float = 2.0             # lambda of the SCAD fusion penalty
    a: float = 3.7               # SCAD's a (Fan & Li 2001)
    xi: float = 0.5              # xi < lambda: width of the smooth surrogate
    rho: float = 10.0            # ADMM penalty, also the local proximal weight; > max(2 lam/xi, 2/(a-1))
    nu: float = 0.5              # ||theta_ij|| <= nu puts i and j in one cluster (FPFC paper: nu in [xi, 0.5])
    scale_to_model: bool = True  # read lam, xi, nu in units of round 1's mean update norm


# ----------------------------------------------------------------------------
# Model size, for FPFC's memory check


def model_spec(cfg) -> tuple[str, tuple[int, ...], int]:
    """(architecture, input shape of one sample, classes) of a run, as the
    runner builds the model (docs/algorithms.md)."""
    from fedclust.data import NUM_CLASSES
    from fedclust.data.sources import INPUT_SHAPES
    from fedclust.models import default_arch

    arch = default_arch(cfg.data.name) if cfg.model == "auto" else cfg.model
    shape = (cfg.data.synthetic_dim,) if cfg.data.name == "synthetic" else INPUT_SHAPES[cfg.data.name]
    return arch, tuple(shape), NUM_CLASSES


def parameter_count(cfg) -> int:
    """P, the flat parameter count of the run's model."""
    from fedclust.models import build_model

    arch, shape, classes = model_spec(cfg)
    return sum(p.numel() for p in build_model(arch, shape, classes).parameters())


def available_memory(device: str) -> tuple[int, str]:
    """(bytes free, where) on the device a run would use: the CUDA device's
    free memory, else /proc/meminfo's MemAvailable."""
    import torch

    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        import os

        index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()   # this rank's GPU
        free, _ = torch.cuda.mem_get_info(index)
        return int(free), f"GPU {index} ({torch.cuda.get_device_name(index)})"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "host memory (MemAvailable)"
    raise OSError("/proc/meminfo has no MemAvailable line")


def fpfc_memory_need(n: int, P: int, ranks_sharing: int = 1) -> int:
    """Bytes FPFC holds per run on one memory: θ and v ``[E, P]``
    (:func:`fedclust.algorithms.fpfc.pairwise_state_bytes`) plus ω and ζ
    ``[n, P]`` and a few chunk buffers, float32, once per rank that shares
    the memory (the server state is replicated on every rank)."""
    from fedclust.algorithms.fpfc import CHUNK_ELEMENTS, pairwise_state_bytes

    per_rank = pairwise_state_bytes(n, P) + 3 * n * P * 4 + 6 * min(CHUNK_ELEMENTS, max(n * (n - 1) // 2, 1) * P) * 4
    return per_rank * ranks_sharing


def check_fpfc_memory(cfg, available: tuple[int, str] | None = None) -> None:
    """Refuse an FPFC run whose pairwise state would not fit (ConfigError on
    ``clients`` naming the numbers and the largest client count that fits)."""
    from fedclust.errors import ConfigError

    n, P = cfg.clients, parameter_count(cfg)
    free, where = available or available_memory(cfg.device)
    sharing = 1
    if where.startswith("host"):
        from fedclust.dist import world_from_env

        sharing = world_from_env()[0]   # ranks on this node share its RAM
    need = fpfc_memory_need(n, P, sharing)
    if need <= free:
        return
    fits = 1
    while fits < n and fpfc_memory_need(fits + 1, P, sharing) <= free:
        fits += 1
    gib = 2.0**30
    raise ConfigError(
        "clients", n,
        f"FPFC keeps theta and v for all n(n-1)/2 = {n * (n - 1) // 2} client pairs: {need / gib:.2f} GiB "
        f"(n = {n}, P = {P} parameters, float32{f', x{sharing} ranks' if sharing > 1 else ''}) but only "
        f"{free / gib:.2f} GiB are free in {where}; use at most {fits} clients, a smaller model, "
        "or a machine with more memory")


# ----------------------------------------------------------------------------
# Validation


def _finite(field: str, value, fix: str, low: float = 0.0, strict: bool = True) -> None:
    from fedclust.errors import ConfigError

    v = float(value)
    if not math.isfinite(v) or v < low or (strict and v == low):
        raise ConfigError(field, value, fix)


def validate_methods(cfg) -> None:
    """Checks of participation and of the chosen method's section; called by
    config.validate."""
    from fedclust.errors import ConfigError

    if not 0.0 < cfg.participation <= 1.0:
        raise ConfigError("participation", cfg.participation, "must lie in (0, 1]: the share of clients per round")
    name, n = cfg.algorithm.name, cfg.clients
    if name == "pens":
        check_pens(cfg.pens, n)
    if name in ("panm_loss", "panm_grad"):
        check_panm_em_input(cfg.panm.em_input)
    if name in ("fedprox", "fedgrouprox"):
        _finite("fedprox.mu", cfg.fedprox.mu, "the proximal weight must be a finite number >= 0 "
                "(FedProx's grid: 0.001, 0.01, 0.1, 1; 0 is FedAvg)", strict=False)
    if name == "ifca":
        c = cfg.ifca.clusters
        if not 1 <= c <= n:
            raise ConfigError("ifca.clusters", c, f"must lie in [1, clients = {n}]: one model per cluster, "
                              "e.g. the number of clusters you expect (data.num_clusters)")
        r, t0 = cfg.ifca.restarts, cfg.ifca.restart_rounds
        if r < 1:
            raise ConfigError("ifca.restarts", r, "must be >= 1 (1: one initialisation, IFCA paper Algorithm 1 as is)")
        if r > 1 and t0 < 1:
            raise ConfigError("ifca.restart_rounds", t0, "must be >= 1: the rounds each restart runs before "
                              "they are compared")
        if r > 1 and r * t0 >= cfg.rounds:
            raise ConfigError("ifca.restarts", r, f"{r} restarts x ifca.restart_rounds = {t0} take {r * t0} rounds, "
                              f"not fewer than rounds = {cfg.rounds}; lower ifca.restarts (1: no restarts) or "
                              "ifca.restart_rounds, or raise rounds")
    if name == "cfl":
        c = cfg.cfl
        for field in ("eps1", "eps2"):
            _finite(f"cfl.{field}", getattr(c, field), "CFL split threshold must be a finite number > 0 "
                    "(defaults eps1 = 0.4, eps2 = 1.6)")
        if not c.eps1 < c.eps2:
            raise ConfigError("cfl.eps1", c.eps1, f"must be below cfl.eps2 = {c.eps2}: a cluster splits when its "
                              "mean update is small (< eps1) while some client's is large (> eps2)")
        if not 0.0 <= c.gamma_max < 1.0:
            raise ConfigError("cfl.gamma_max", c.gamma_max, "must lie in [0, 1): the bound on the clients' relative "
                              "gradient error of CFL's Algorithm 1 (default 0.5; 0 keeps only the norm test, as the "
                              "reference code)")
        if c.warmup < 0:
            raise ConfigError("cfl.warmup", c.warmup, "must be >= 0 rounds (CFL's reference code: 20)")
        if c.warmup >= cfg.rounds:
            raise ConfigError("cfl.warmup", c.warmup, f"must be below rounds = {cfg.rounds}, or CFL never splits; "
                              "lower cfl.warmup or raise rounds")
    if name in ("fedgroup", "fedgrouprox"):
        g = cfg.fedgroup
        if not 1 <= g.groups <= n:
            raise ConfigError("fedgroup.groups", g.groups, f"must lie in [1, clients = {n}]")
        if g.pretrain_scale < 1:
            raise ConfigError("fedgroup.pretrain_scale", g.pretrain_scale,
                              "must be >= 1: alpha * groups clients are pre-trained (paper: 20)")
        pre = min(g.pretrain_scale * g.groups, n)
        if pre < max(3, g.groups):
            raise ConfigError("fedgroup.pretrain_scale", g.pretrain_scale,
                              f"pre-trains min(alpha * groups, clients) = {pre} clients but the ternary similarity "
                              f"needs at least 3 and K-means at least groups = {g.groups}; raise it (or clients)")
        _finite("fedgroup.inter_lr", g.inter_lr, "eta_g must be a finite number >= 0 (paper: 0.01)", strict=False)
    if name == "fpfc":
        f = cfg.fpfc
        _finite("fpfc.lam", f.lam, "the SCAD fusion weight lambda must be a finite number > 0")
        _finite("fpfc.a", f.a, "SCAD's a must be a finite number > 1 (Fan & Li: 3.7)", low=1.0)
        if not 0 < f.xi < f.lam:
            raise ConfigError("fpfc.xi", f.xi, f"the surrogate width must lie in (0, fpfc.lam = {f.lam})")
        from fedclust.algorithms.fpfc import check_theorem1

        check_theorem1(f.lam, f.a, f.xi, f.rho)   # rho > max(2 lam/xi, 2/(a-1)), FPFC paper Theorem 1
        _finite("fpfc.nu", f.nu, "the cluster threshold must be a finite number >= 0 (paper: in [xi, 0.5])",
                strict=False)
        check_fpfc_memory(cfg)
