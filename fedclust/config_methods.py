"""Config sections of the centralized methods (SPEC §5), one per method,
named as the papers name their hyperparameters; defaults are the papers'."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FedProxConfig:
    mu: float = 0.01             # proximal weight (FedProx's recommended grid {0.001, 0.01, 0.1, 1})


@dataclass
class IfcaConfig:
    clusters: int = 2            # c, the number of cluster models (papers/002)


@dataclass
class CflConfig:
    eps1: float = 0.4            # split when the mean update norm is below eps1 ...
    eps2: float = 1.6            # ... and the largest client update norm above eps2
    warmup: int = 20             # rounds before the first split is considered
    scale_to_model: bool = True  # scale eps1/eps2 by the model's update norms (see fedclust/algorithms/cfl.py)


@dataclass
class FedGroupConfig:
    groups: int = 2              # m, the number of groups (papers/003)
    pretrain_scale: int = 20     # alpha: alpha * m clients are pre-trained for the cold start
    inter_lr: float = 0.01       # eta_g, the inter-group aggregation rate
    mu: float = 0.0              # FedGrouProx's proximal weight (fedgrouprox uses fedprox.mu when this is 0)


@dataclass
class FpfcConfig:
    lam: float = 0.1             # lambda of the SCAD fusion penalty (papers/004)
    a: float = 3.7               # SCAD's a
    xi: float = 0.01             # xi < lambda: width of the smooth surrogate
    rho: float = 1.0             # ADMM penalty
    nu: float = 0.1              # ||theta_ij|| <= nu puts i and j in one cluster


def validate_methods(cfg) -> None:
    """Checks of the method sections and participation; called by config.validate."""
    from fedclust.errors import ConfigError

    if not 0.0 < cfg.participation <= 1.0:
        raise ConfigError("participation", cfg.participation, "must lie in (0, 1]: the share of clients per round")
