"""``model=cnn`` (CIFAR-10; PANM paper §4.2, docs/algorithms.md): Conv(3→32,
3), ReLU, MaxPool 2, Conv(32→64, 3), ReLU, MaxPool 2, Conv(64→64, 3), ReLU,
Flatten, FC(1024→64), ReLU, FC(64→classes).  On 32x32 inputs the sides go
30→15→13→6→4, so FC1 has 64·4·4 = 1024 inputs.

The batched forward is written out by hand, because ``vmap`` of
``F.conv2d`` (measured 2-3x slower than a per-client loop on a 2-core CPU)
reshapes every activation between layers: here the clients are stacked
along the channel axis of one channels-last activation ``[B, C·channels,
H, W]`` for the whole convolutional trunk, each convolution is one grouped
convolution (:func:`fedclust.engine.functional.grouped_conv`: client c's
filters see only client c's channels), and only the two dense layers go
through batched matmuls.  Max-pool is applied before ReLU:
``relu(maxpool(h)) == maxpool(relu(h))`` in value and in gradient (both
monotone; the gradient reaches the same first maximal element, or nothing
when it is not positive), and ReLU then touches 4x fewer elements.  The
engine trains it through ``torch.func.grad`` of that forward."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedclust.engine.functional import batched_linear, grouped_conv
from fedclust.models.base import BuiltinModel
from fedclust.models.registry import register


def cnn_side(side: int) -> int:
    """Side length after conv3-pool2-conv3-pool2-conv3 (32 -> 4)."""
    return ((side - 2) // 2 - 2) // 2 - 2


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


def cnn_forward(p: dict, x: torch.Tensor) -> torch.Tensor:
    """One client's CNN: x [B, C_in, H, W] -> logits [B, K]."""
    h = F.max_pool2d(F.relu(F.conv2d(x, p["conv1.weight"], p["conv1.bias"])), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, p["conv2.weight"], p["conv2.bias"])), 2)
    h = F.relu(F.conv2d(h, p["conv3.weight"], p["conv3.bias"]))
    h = F.relu(F.linear(torch.flatten(h, 1), p["fc1.weight"], p["fc1.bias"]))
    return F.linear(h, p["fc2.weight"], p["fc2.bias"])


def cnn_forward_batched(p: dict, x: torch.Tensor) -> torch.Tensor:
    """C clients' CNNs at once: x [C, B, C_in, H, W] -> logits [C, B, K].

    Equals ``vmap(cnn_forward)`` (see the module docstring for the layout).
    """
    c, b, cin, hgt, wid = x.shape
    h = x.transpose(0, 1).reshape(b, c * cin, hgt, wid).contiguous(memory_format=torch.channels_last)
    h = F.relu(F.max_pool2d(grouped_conv(h, p["conv1.weight"], p["conv1.bias"]), 2))
    h = F.relu(F.max_pool2d(grouped_conv(h, p["conv2.weight"], p["conv2.bias"]), 2))
    h = F.relu(grouped_conv(h, p["conv3.weight"], p["conv3.bias"]))
    h = h.reshape(b, c, -1).transpose(0, 1)  # [C, B, 64·s·s], torch.flatten order per client
    h = F.relu(batched_linear(h, p["fc1.weight"], p["fc1.bias"]))
    return batched_linear(h, p["fc2.weight"], p["fc2.bias"])


@register
class CnnModel(BuiltinModel):
    name = "cnn"
    aliases = ("conv", "convnet")
    cpu_chunk = 2   # clients trained at once on a CPU (fedclust bench, 2 cores)

    def module(self, input_shape, num_classes):
        why = self.check_input(tuple(input_shape))
        if why:
            raise ValueError(f"the cnn {why}, got {tuple(input_shape)}")
        c, h, w = input_shape
        return CNN(c, h, w, num_classes)

    def check_input(self, input_shape):
        if len(input_shape) != 3 or min(cnn_side(s) for s in input_shape[1:]) < 1:
            return "needs image inputs (channels, height, width) of at least 18x18"
        return None

    def forward(self, params, x):
        return cnn_forward(params, x)

    def batched_forward(self, params, x):
        return cnn_forward_batched(params, x)

    def activation_bytes(self, input_shape, element_size=4):
        _, hgt, wid = input_shape
        h1, w1 = hgt - 2, wid - 2
        h2, w2 = h1 // 2 - 2, w1 // 2 - 2
        h3, w3 = h2 // 2 - 2, w2 // 2 - 2
        # conv outputs, pooled maps (+ int64 indices), ReLU outputs, dense layers
        floats = 3 * (32 * h1 * w1 + 64 * h2 * w2) + 2 * 64 * h3 * w3 + 4 * 64 + math.prod(input_shape)
        return int(floats * element_size)
