"""Local training in phases (RoundPlan.phases, train_round(phases=...)):
each phase keeps the tensors it names as they were, one momentum buffer
throughout, against a plain per-client torch.optim.SGD loop that restores
the frozen tensors after every step (DePRL's code), on every training path:
the MLP's hand-written backward, torch.func (MLP and CNN), clients of
unequal sizes, and the per-client loop engine."""

from __future__ import annotations

import pytest
import torch

from fedclust import rng
from fedclust.bench.reference import reference_train_round
from fedclust.engine.layout import ParamLayout
from fedclust.engine.module_net import ModuleNet
from fedclust.engine.train import TrainSettings, frozen_epochs, train_round
from fedclust.models import build_model
from fedclust.models.registry import builtin

MNIST = (1, 28, 28)
SMALL_CNN = (3, 18, 18)
HEAD_THEN_BODY = ((2, ("head",)), (1, ()))      # not DePRL's order: the body first, then everything
DEPRL = ((2, ("fc1", "fc2")), (1, ("head",)))   # the MLP's head (body frozen), then its body (head frozen)


def make(arch, shape, clients, n, seed=0):
    torch.manual_seed(seed)
    module = build_model(arch, shape, 10).double()
    layout = ParamLayout.from_module(module)
    flat = layout.flatten(module) + 0.05 * torch.randn(clients, layout.numel, dtype=torch.float64)
    x = torch.randn(clients, n, *shape, dtype=torch.float64)
    return module, layout, flat, x, torch.randint(0, 10, (clients, n))


@pytest.mark.parametrize("arch,shape,backprop,phases", [
    ("mlp", MNIST, "auto", DEPRL), ("mlp", MNIST, "func", DEPRL), ("mlp", MNIST, "auto", HEAD_THEN_BODY),
    ("cnn", SMALL_CNN, "auto", ((1, ("conv1", "conv2", "conv3", "fc1")), (2, ("head",)))),
])
def test_phases_equal_the_plain_loop_that_restores_frozen_tensors(arch, shape, backprop, phases):
    _, layout, flat, x, y = make(arch, shape, 3, 20)
    s = TrainSettings(lr=0.08, momentum=0.9, batch_size=8, epochs=3, client_chunk=2, backprop=backprop)
    orders = rng.batch_orders(3, 1, torch.arange(3), 3, 20)
    fast, slow = flat.clone(), flat.clone()
    lf = train_round(fast, layout, builtin(arch), x, y, orders, s, phases=phases)
    ls = reference_train_round(slow, layout, arch, x, y, orders, s, shape, 10, phases=phases)
    assert torch.allclose(fast, slow, atol=1e-10) and torch.allclose(lf, ls, atol=1e-10)
    free = flat.clone()
    reference_train_round(free, layout, arch, x, y, orders, s, shape, 10)
    assert not torch.allclose(fast, free)   # the phases changed the training
    if phases is DEPRL:   # over the round every tensor moved, each in its own phase
        assert all(not torch.equal(a, b) for a, b in zip(layout.views(fast).values(), layout.views(flat).values()))


def test_clients_of_unequal_sizes_train_in_phases_as_each_alone():
    _, layout, flat, x, y = make("mlp", MNIST, 4, 24)
    counts = torch.tensor([24, 10, 17, 5])
    s = TrainSettings(lr=0.08, momentum=0.9, batch_size=8, epochs=3)
    orders = rng.batch_orders(3, 1, torch.arange(4), 3, 24, counts)
    fast = flat.clone()
    lf = train_round(fast, layout, builtin("mlp"), x, y, orders, s, counts=counts, phases=DEPRL)
    for c in range(4):
        m = int(counts[c])
        one = flat[c:c + 1].clone()
        ls = reference_train_round(one, layout, "mlp", x[c:c + 1, :m], y[c:c + 1, :m], orders[:, c:c + 1, :m], s,
                                   MNIST, 10, phases=DEPRL)
        assert torch.allclose(fast[c], one[0], atol=1e-10) and torch.allclose(lf[c], ls[0], atol=1e-10), c


def test_the_loop_engine_trains_in_phases_as_the_plain_loop():
    module, layout, flat, x, y = make("mlp", MNIST, 2, 20)
    s = TrainSettings(lr=0.08, momentum=0.9, batch_size=8, epochs=3)
    orders = rng.batch_orders(3, 1, torch.arange(2), 3, 20)
    fast, slow = flat.clone(), flat.clone()
    train_round(fast, layout, ModuleNet(module, "loop", "mlp"), x, y, orders, s, phases=DEPRL)
    reference_train_round(slow, layout, "mlp", x, y, orders, s, MNIST, 10, phases=DEPRL)
    assert torch.allclose(fast, slow, atol=1e-10)


def test_phases_must_cover_the_epochs_and_name_tensors():
    layout = make("mlp", MNIST, 1, 4)[1]
    assert frozen_epochs(layout, DEPRL, 3) == ((0, 1, 2, 3),) * 2 + ((4, 5),)
    with pytest.raises(ValueError, match="hold 3 epochs but settings.epochs = 4"):
        frozen_epochs(layout, DEPRL, 4)
    with pytest.raises(ValueError, match="names none"):
        frozen_epochs(layout, ((1, ("fc9",)),), 1)
