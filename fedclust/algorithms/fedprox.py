"""FedProx (Li et al., MLSys 2020; FedGroup paper Eq. 3): FedAvg whose
clients minimise ``F_k(w) + μ/2 ‖w − w^t‖²``, so ``μ (w − w^t)`` is added to
every local gradient (by the engine's local SGD); ``μ = 0`` is FedAvg.

Paper: T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020, https://arxiv.org/abs/1812.06127
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedclust.algorithms.fedavg import FedAvg
from fedclust.algorithms.registry import register
from fedclust.schema import finite, option


@dataclass
class FedProxConfig:
    """The ``fedprox`` section (also FedGrouProx's μ: FedGroup paper, "μ as recommended by FedProx")."""

    # Li et al. tune it over {0.001, 0.01, 0.1, 1} per data set and name no single default.
    mu: float = option(0.01, "FedProx's proximal weight mu >= 0 (0: FedAvg); also FedGrouProx's",
        doc=("FedProx's proximal weight, finite `>= 0` (0: FedAvg); also FedGrouProx's"))

    def validate(self, cfg) -> None:
        finite("fedprox.mu", self.mu, "the proximal weight must be a finite number >= 0 "
               "(FedProx's grid: 0.001, 0.01, 0.1, 1; 0 is FedAvg)", strict=False)


@register
@dataclass
class FedProx(FedAvg):
    fedprox: FedProxConfig = field(default_factory=FedProxConfig)

    name = "fedprox"
    report_position = 8
    sections = {"fedprox": FedProxConfig}
    paper_results = {}

    @property
    def mu(self) -> float:
        return self.fedprox.mu
