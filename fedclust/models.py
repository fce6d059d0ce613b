"""The models of docs/algorithms.md, as plain ``nn.Module``s.

These modules are the reference: the vectorized engine
(:mod:`fedclust.engine.functional`) reproduces their forward pass on a flat
parameter buffer, and :mod:`fedclust.bench.reference` trains them one
client at a time with ``torch.optim.SGD``.

- ``logreg`` (Synthetic): multinomial logistic regression, Flatten,
  Linear(in, classes), as FedProx (its ``mclr`` model) and FPFC train it;
  the engine treats it as an MLP with no hidden layer.
- ``mlp`` (MNIST, Fashion-MNIST): Flatten, Linear(in, 200), ReLU,
  Linear(200, 200), ReLU, Linear(200, classes).
- ``cnn`` (CIFAR-10): Conv(3→32, 3), ReLU, MaxPool 2, Conv(32→64, 3), ReLU,
  MaxPool 2, Conv(64→64, 3), ReLU, Flatten, FC(1024→64), ReLU, FC(64→classes).
  On 32x32 inputs the sides go 30→15→13→6→4, so FC1 has 64·4·4 = 1024 inputs.

Parameter names (``fc1.weight``, ``conv2.bias``, ...) are the keys of the
functional forward's parameter dict.
"""

from __future__ import annotations

import math

import torch
from torch import nn
import torch.nn.functional as F

from fedclust.data import registry as data_registry
from fedclust.engine.layout import ParamLayout
from fedclust.errors import ConfigError

ARCHS = ("logreg", "mlp", "cnn")


class MLP(nn.Module):
    """MLP in-200-200-classes with ReLU (docs/algorithms.md)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 200):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.flatten(x, 1)
        h = F.relu(self.fc1(h))
        h = F.relu(self.fc2(h))
        return self.fc3(h)


class LogReg(nn.Module):
    """Multinomial logistic regression in-classes (docs/algorithms.md, Synthetic)."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(torch.flatten(x, 1))


class CNN(nn.Module):
    """CIFAR-10 CNN of PANM paper §4.2 (docs/algorithms.md)."""

    def __init__(self, in_channels: int, height: int, width: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.conv3 = nn.Conv2d(64, 64, 3)
        self.fc1 = nn.Linear(64 * cnn_side(height) * cnn_side(width), 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        h = F.relu(self.conv3(h))
        h = F.relu(self.fc1(torch.flatten(h, 1)))
        return self.fc2(h)


def cnn_side(side: int) -> int:
    """Side length after conv3-pool2-conv3-pool2-conv3 (32 -> 4)."""
    return ((side - 2) // 2 - 2) // 2 - 2


def build_model(arch: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The reference module of ``arch`` for inputs of ``input_shape`` (one
    sample, no batch dimension): (1, 28, 28), (3, 32, 32) or (d,)."""
    input_shape = tuple(int(s) for s in input_shape)
    if num_classes < 2:
        raise ValueError(f"num_classes = {num_classes}: a classifier needs at least 2 classes")
    if arch == "logreg":
        return LogReg(math.prod(input_shape), num_classes)
    if arch == "mlp":
        return MLP(math.prod(input_shape), num_classes)
    if arch == "cnn":
        if len(input_shape) != 3 or min(cnn_side(s) for s in input_shape[1:]) < 1:
            raise ConfigError(
                "model", arch,
                f"the cnn needs image inputs (channels, height, width) of at least 18x18, got {input_shape}; "
                "use model: mlp for this data set")
        c, h, w = input_shape
        return CNN(c, h, w, num_classes)
    raise ConfigError("model", arch, f"choose one of {', '.join(ARCHS)} (or 'auto')")


def default_arch(data_name: str) -> str:
    """The model a data set declares for model=auto (docs/algorithms.md: cnn for cifar10, logreg for
    synthetic, mlp for the others); mlp for a name no registered data set has (a report of a plugin's runs)."""
    ds = data_registry.find(data_name)
    return ds.default_model if ds is not None else "mlp"


def model_spec(cfg) -> tuple[str, tuple[int, ...], int]:
    """(architecture, input shape of one sample, classes) of a run's model, as its data set declares them."""
    ds = data_registry.get(cfg.data.name)
    arch = ds.default_model if cfg.model == "auto" else cfg.model
    return arch, tuple(ds.input_shape(cfg.data)), int(ds.num_classes(cfg.data))


def parameter_count(cfg) -> int:
    """P, the flat parameter count of the run's model."""
    arch, shape, classes = model_spec(cfg)
    return sum(p.numel() for p in build_model(arch, shape, classes).parameters())


def initial_weights(arch: str, input_shape, num_classes: int, seed: int):
    """``(layout, w [P])``: the model's default init under ``seed`` (CPU
    generator, identical on every rank), flat.  The common w0 of all clients
    (seed = run seed) and IFCA's further cluster inits."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build_model(arch, input_shape, num_classes)
    layout = ParamLayout.from_module(module)
    return layout, layout.flatten(module).detach().clone()
