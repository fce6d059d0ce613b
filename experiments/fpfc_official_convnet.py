"""The CNN of FPFC's official MNIST/FMNIST code (xueyu-ubc/FPFC, LABELSWAP/FLAlgorithms/trainmodel/models.py),
as a fedclust model of your own: model=experiments/fpfc_official_convnet.py:ConvNet.

Conv(1->6, 5, padding 2), ReLU, MaxPool 2, Conv(6->16, 5), ReLU, MaxPool 2, Flatten, Linear(400 -> classes):
28 -> 28 -> 14 -> 10 -> 5, so the head `fc1` has 16*5*5 = 400 inputs, the code's `dimension`. `fpfc.fuse=head`
fuses `fc1` (4,010 numbers) and averages the two convolutions (2,572).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ConvNet(nn.Module):
    def __init__(self, input_shape, num_classes: int):
        super().__init__()
        if tuple(input_shape) != (1, 28, 28):
            raise ValueError(f"ConvNet is the code's 28x28 grey-image CNN; got examples of shape {tuple(input_shape)}")
        self.conv1 = nn.Conv2d(1, 6, kernel_size=5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.fc1 = nn.Linear(16 * 5 * 5, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc1(torch.flatten(x, 1))
