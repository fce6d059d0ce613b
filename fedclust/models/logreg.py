"""``model=logreg``: multinomial logistic regression (docs/algorithms.md,
Synthetic): Flatten, Linear(in, classes), as FedProx (its ``mclr`` model)
and FPFC train it.  The engine trains it as a dense net with no hidden
layer (its hand-written backward)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedclust.engine.functional import batched_linear
from fedclust.models.base import BuiltinModel
from fedclust.models.registry import register


class LogReg(nn.Module):
    """Multinomial logistic regression in-classes (docs/algorithms.md, Synthetic)."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(torch.flatten(x, 1))


def logreg_forward(p: dict, x: torch.Tensor) -> torch.Tensor:
    """One client's multinomial logistic regression: x [B, *input] -> logits [B, K]."""
    return F.linear(torch.flatten(x, 1), p["fc1.weight"], p["fc1.bias"])


def logreg_forward_batched(p: dict, x: torch.Tensor) -> torch.Tensor:
    """C clients' logistic regressions: x [C, B, *input] -> logits [C, B, K]."""
    return batched_linear(torch.flatten(x, 2), p["fc1.weight"], p["fc1.bias"])


@register
class LogRegModel(BuiltinModel):
    name = "logreg"
    aliases = ("logistic", "linear", "lr", "logistic_regression")
    # 610 parameters: chunks of 25-100 clients run alike on a CPU (about 0.5 s for 100 clients x 200 steps)
    cpu_chunk = 100
    dense_layers = ("fc1",)

    def module(self, input_shape, num_classes):
        return LogReg(math.prod(input_shape), num_classes)

    def forward(self, params, x):
        return logreg_forward(params, x)

    def batched_forward(self, params, x):
        return logreg_forward_batched(params, x)

    def activation_bytes(self, input_shape, element_size=4):
        return int((math.prod(input_shape) + 3 * 10) * element_size)
