"""Two user models for the tests and the bench: one with convolutions and
GroupNorm, one without (LayerNorm, GELU, a constant buffer)."""

import math

import torch
from torch import nn


class SmallConvGN(nn.Module):
    """Conv(ch→8, 3) + GroupNorm(2, 8) + ReLU, max-pool 2, Conv(8→8, 3) +
    GroupNorm(2, 8) + ReLU, global average pool, Linear(8→classes)."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        ch = input_shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(ch, 8, 3), nn.GroupNorm(2, 8), nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3), nn.GroupNorm(2, 8), nn.ReLU(inplace=True),
        )
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


class TabularNet(nn.Module):
    """Flatten, centre by a constant buffer, Linear(in→32), LayerNorm, GELU, Linear(32→classes)."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        d = math.prod(input_shape)
        self.register_buffer("centre", torch.full((d,), 0.1))
        self.body = nn.Sequential(nn.Linear(d, 32), nn.LayerNorm(32), nn.GELU())
        self.out = nn.Linear(32, num_classes)

    def forward(self, x):
        return self.out(self.body(torch.flatten(x, 1) - self.centre))


def tabular(input_shape, num_classes):
    """A factory function (not a class) returning a module."""
    return TabularNet(input_shape, num_classes)


class WithBatchNorm(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.fc = nn.Linear(math.prod(input_shape), 16)
        self.bn = nn.BatchNorm1d(16)
        self.out = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.fc(torch.flatten(x, 1)))))


class WithDropout(TabularNet):
    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(super().forward(x))


class WrongOutput(TabularNet):
    def forward(self, x):
        return super().forward(x)[:, :3]


class RandomInForward(TabularNet):
    """Noise drawn in forward: vmap cannot batch it (randomness='error')."""

    def forward(self, x):
        return super().forward(x + 0.01 * torch.randn_like(x))


class BatchStatistics(WithBatchNorm):
    """BatchNorm without running statistics: each batch normalized by its own."""

    def __init__(self, input_shape, num_classes):
        super().__init__(input_shape, num_classes)
        self.bn = nn.BatchNorm1d(16, track_running_stats=False)


class FunctionalDropout(TabularNet):
    """Dropout through the functional form, with no Dropout module to see."""

    def forward(self, x):
        return torch.nn.functional.dropout(super().forward(x), 0.5, self.training)


class DataDependent(TabularNet):
    """Python control flow on a tensor's value: vmap cannot batch it; deterministic."""

    def forward(self, x):
        out = super().forward(x)
        return out * 2 if float(out.sum()) > 1e9 else out


class ModeDependent(TabularNet):
    """Deterministic, but its output differs between train and eval mode (as a model with dropout would)."""

    def forward(self, x):
        out = super().forward(x)
        return out * 3 if self.training else out


def not_a_module(input_shape, num_classes):
    return "a string"
