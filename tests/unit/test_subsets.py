"""A round's training subsets (RoundPlan.samples: each client trains on the
examples it is given, FedSPD's examples of one cluster) and the per-example
losses (Context.sample_loss), against each client trained alone on its
subset and the loss of each example computed by the module one at a time."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fedclust import rng
from fedclust.bench.reference import reference_train_round
from fedclust.engine.layout import ParamLayout
from fedclust.engine.train import TrainSettings, sample_losses, train_round
from fedclust.models import build_model
from fedclust.models.registry import builtin
from fedclust.runner import training_subset

MNIST = (1, 28, 28)


def make(clients, n, seed=0):
    torch.manual_seed(seed)
    module = build_model("mlp", MNIST, 10).double()
    layout = ParamLayout.from_module(module)
    flat = layout.flatten(module) + 0.05 * torch.randn(clients, layout.numel, dtype=torch.float64)
    x = torch.randn(clients, n, *MNIST, dtype=torch.float64)
    return module, layout, flat, x, torch.randint(0, 10, (clients, n))


def test_each_example_loss_is_the_modules_and_padding_is_infinite():
    module, layout, flat, x, y = make(3, 7)
    counts = torch.tensor([7, 4, 1])
    got = sample_losses(flat, layout, builtin("mlp"), x, y, counts)
    for c in range(3):
        layout.load_into(module, flat[c])
        for j in range(7):
            if j < counts[c]:
                want = F.cross_entropy(module(x[c, j:j + 1]), y[c, j:j + 1])
                assert math.isclose(float(got[c, j]), float(want.detach()), rel_tol=1e-9), (c, j)
            else:
                assert got[c, j] == math.inf


def test_a_client_trains_on_its_subset_as_a_client_of_those_examples_alone():
    _, layout, flat, x, y = make(4, 20)
    gen = torch.Generator().manual_seed(1)
    samples = torch.rand(4, 20, generator=gen) < 0.5
    samples[3] = False
    samples[3, [2, 17]] = True                                    # two examples, far apart
    order, rows, counts = training_subset(samples, None)
    assert counts.tolist() == samples.sum(1).tolist()
    for c in range(4):
        assert order[c, :counts[c]].tolist() == samples[c].nonzero().flatten().tolist()   # chosen first, in order
    s = TrainSettings(lr=0.08, momentum=0.9, batch_size=4, epochs=2)
    orders = rng.batch_orders(3, 1, torch.arange(4), 2, 20, counts)
    fast = flat.clone()
    train_round(fast, layout, builtin("mlp"), x[rows, order], y[rows, order], orders, s, counts=counts)
    for c in range(4):
        chosen = samples[c].nonzero().flatten()
        one = flat[c:c + 1].clone()
        m = len(chosen)
        reference_train_round(one, layout, "mlp", x[c:c + 1, chosen], y[c:c + 1, chosen], orders[:, c:c + 1, :m], s,
                              MNIST, 10)
        assert torch.allclose(fast[c], one[0], atol=1e-10), c


def test_a_subset_is_kept_to_the_clients_own_examples():
    samples = torch.ones(2, 6, dtype=torch.bool)
    _, _, counts = training_subset(samples, torch.tensor([6, 3]))
    assert counts.tolist() == [6, 3]
