"""Two models of your own, as fedclust trains them (examples/own_model/README.md):

    fedclust run configs/fmnist_rotation2.yaml model=examples/own_model/model.py:TinyResNet

fedclust calls NAME(input_shape, num_classes) once per process and trains a
copy of the module on every client. ``input_shape`` is one example's shape
without the batch dimension, as the data set gives it: (1, 28, 28) for
Fashion-MNIST, (3, 32, 32) for CIFAR-10, (60,) for Synthetic; ``num_classes``
is the number of labels. The module's forward takes a batch [B, *input_shape]
and returns logits [B, num_classes]; fedclust adds the cross-entropy loss.

What fedclust refuses, and what to write instead (each client would need state
of its own that the engine does not keep, or draws it cannot repeat):
- BatchNorm (running statistics): use nn.GroupNorm or nn.LayerNorm, as here;
- dropout with p > 0: leave it out;
- parameters with requires_grad=False: register a fixed tensor as a buffer;
- a forward that changes a buffer (a running mean, a counter).
"""

from __future__ import annotations

import math

from torch import nn


class ResidualBlock(nn.Module):
    """x + GN(Conv(ReLU(GN(Conv(x))))), then ReLU; the channels and the size stay."""

    def __init__(self, channels: int, groups: int = 4):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(groups, channels)
        self.relu = nn.ReLU()

    def forward(self, x):
        h = self.relu(self.norm1(self.conv1(x)))
        return self.relu(x + self.norm2(self.conv2(h)))


class TinyResNet(nn.Module):
    """A little ResNet for small images (28x28 Fashion-MNIST; any [channels, H, W] of at least 8x8):
    Conv(ch->16, 3) + GroupNorm + ReLU, max-pool 2 (28 -> 14), one residual block of 16 channels,
    Conv(16->32, 3, stride 2) + GroupNorm + ReLU (14 -> 7), global average pool, Linear(32 -> classes).
    About 10,000 parameters on Fashion-MNIST."""

    def __init__(self, input_shape, num_classes, width: int = 16):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"TinyResNet takes images [channels, height, width], got input_shape {input_shape}; "
                             "use TabularMLP for vectors")
        channels = input_shape[0]
        self.stem = nn.Sequential(nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.GroupNorm(4, width),
                                  nn.ReLU(), nn.MaxPool2d(2))
        self.block = ResidualBlock(width)
        self.down = nn.Sequential(nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
                                  nn.GroupNorm(4, 2 * width), nn.ReLU())
        self.head = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        h = self.down(self.block(self.stem(x)))
        return self.head(h.mean(dim=(2, 3)))


class TabularMLP(nn.Module):
    """An MLP for vectors (or anything, flattened): Linear(d->hidden) + LayerNorm + ReLU, twice, then
    Linear(hidden -> classes)."""

    def __init__(self, input_shape, num_classes, hidden: int = 64):
        super().__init__()
        d = math.prod(input_shape)
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(d, hidden), nn.LayerNorm(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.LayerNorm(hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.net(x)


def wide_resnet(input_shape, num_classes):
    """A factory function works as NAME too: TinyResNet with 32 channels (model=...model.py:wide_resnet)."""
    return TinyResNet(input_shape, num_classes, width=32)
