"""Test plug-in: a built-in-style model added by one file.  ``tinynet`` is a
two-layer tanh net; loaded with ``plugins=[tests/plugins/tiny_model.py]``
and ``model=tinynet``.  It declares no fast path: the engine trains it
through torch.func and sizes its chunks from memory."""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import vmap

from fedclust.models import BuiltinModel, register


class Tiny(nn.Module):
    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 8)
        self.fc2 = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(torch.flatten(x, 1))))


def tiny_forward(p, x):
    h = torch.tanh(F.linear(torch.flatten(x, 1), p["fc1.weight"], p["fc1.bias"]))
    return F.linear(h, p["fc2.weight"], p["fc2.bias"])


@register
class TinyNet(BuiltinModel):
    name = "tinynet"
    aliases = ("tiny",)

    def __init__(self):
        self._batched = vmap(tiny_forward)

    def module(self, input_shape, num_classes):
        return Tiny(math.prod(input_shape), num_classes)

    def forward(self, params, x):
        return tiny_forward(params, x)

    def batched_forward(self, params, x):
        return self._batched(params, x)

    def activation_bytes(self, input_shape, element_size=4):
        return (math.prod(input_shape) + 3 * 8) * element_size
