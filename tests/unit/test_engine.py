"""The vectorized engine against the plain per-client path (SPEC §2-§3).

Every fast path is compared with an independent plain computation: the
reference ``nn.Module`` forward, ``reference_train_round`` (one module and
one ``torch.optim.SGD`` per client), and per-client / per-model loops.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from fedclust import rng
from fedclust.bench import local as bench
from fedclust.bench.reference import reference_train_round
from fedclust.engine import memory, train
from fedclust.engine.functional import batched_forward_fn, forward_fn
from fedclust.engine.layout import ParamLayout
from fedclust.engine.pool import pool_losses
from fedclust.engine.train import TrainSettings, evaluate, pair_losses, train_round
from fedclust.errors import ConfigError
from fedclust.models import build_model
from fedclust.models.registry import builtin
from fedclust.runmodel import default_arch

SMALL_CNN = (3, 18, 18)  # smallest input the CNN takes: 16 -> 8 -> 6 -> 3 -> 1
MNIST = (1, 28, 28)


def make(arch, shape, clients, n, dtype=torch.float64, seed=0, spread=0.05):
    """Module, layout, per-client weights around one w0, data."""
    torch.manual_seed(seed)
    module = build_model(arch, shape, 10).to(dtype)
    layout = ParamLayout.from_module(module)
    w0 = layout.flatten(module)
    flat = w0 + spread * torch.randn(clients, layout.numel, dtype=dtype)
    x = torch.randn(clients, n, *shape, dtype=dtype)
    y = torch.randint(0, 10, (clients, n))
    return module, layout, flat, x, y


# ---------------------------------------------------------------- models

def test_models_follow_spec_shapes():
    mlp = build_model("mlp", MNIST, 10)
    assert [tuple(p.shape) for p in mlp.parameters()] == [(200, 784), (200,), (200, 200), (200,), (10, 200), (10,)]
    assert build_model("mlp", (60,), 10).fc1.in_features == 60
    cnn = build_model("cnn", (3, 32, 32), 10)
    assert cnn.fc1.in_features == 1024 and cnn.conv1.in_channels == 3 and cnn.fc2.out_features == 10
    assert cnn(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert default_arch("cifar10") == "cnn" and default_arch("fmnist") == "mlp" and default_arch("synthetic") == "logreg"
    logreg = build_model("logreg", (60,), 10)
    assert [tuple(p.shape) for p in logreg.parameters()] == [(10, 60), (10,)]   # FedProx's mclr: 610 parameters


def test_models_reject_bad_arch_and_shape():
    with pytest.raises(ConfigError, match="model"):
        build_model("resnet", MNIST, 10)
    with pytest.raises(ConfigError, match="model"):
        build_model("cnn", (60,), 10)
    with pytest.raises(TypeError, match="the engine takes a built model, not the name 'resnet'"):
        forward_fn("resnet")


# ---------------------------------------------------------------- layout

def test_layout_round_trip_and_views_alias_the_buffer():
    module = build_model("cnn", SMALL_CNN, 10)
    layout = ParamLayout.from_module(module)
    assert layout.names == tuple(n for n, _ in module.named_parameters())
    assert layout.numel == sum(p.numel() for p in module.parameters())
    flat = layout.flatten(module)
    assert flat.shape == (layout.numel,)
    for (name, p), (vname, v) in zip(module.named_parameters(), layout.views(flat).items()):
        assert name == vname and torch.equal(v, p.detach())

    other = build_model("cnn", SMALL_CNN, 10)
    layout.load_into(other, flat)
    assert torch.equal(layout.flatten(other), flat)

    stack = torch.zeros(3, layout.numel)
    views = layout.views(stack)
    assert views["conv2.weight"].shape == (3, 64, 32, 3, 3)
    views["conv2.weight"][1].fill_(7.0)  # writes land in the buffer
    off = layout.offsets[layout.names.index("conv2.weight")]
    assert (stack[1, off:off + 64 * 32 * 9] == 7).all() and stack[0].abs().sum() == 0
    assert stack.sum() == 7.0 * 64 * 32 * 9
    stack[2, layout.offsets[-1]] = 5.0  # and the other way round
    assert views["fc2.bias"][2, 0] == 5.0


def test_layout_rejects_mismatches():
    layout = ParamLayout.from_module(build_model("mlp", MNIST, 10))
    with pytest.raises(ValueError, match="P = "):
        layout.views(torch.zeros(2, layout.numel + 1))
    with pytest.raises(ValueError, match="layout"):
        layout.flatten(build_model("mlp", (60,), 10))


# ---------------------------------------------------------------- forward

@pytest.mark.parametrize("arch,shape", [("mlp", MNIST), ("mlp", (60,)), ("logreg", (60,)), ("cnn", (3, 32, 32)),
                                        ("cnn", SMALL_CNN)])
def test_forward_fn_equals_module(arch, shape):
    module, layout, flat, x, _ = make(arch, shape, 3, 5)
    for c in range(3):
        layout.load_into(module, flat[c])
        want = module(x[c])
        assert torch.allclose(forward_fn(builtin(arch))(layout.views(flat[c]), x[c]), want, atol=1e-12)
        assert torch.allclose(batched_forward_fn(builtin(arch))(layout.views(flat), x)[c], want, atol=1e-12)
    assert torch.allclose(vmap(forward_fn(builtin(arch)))(layout.views(flat), x), batched_forward_fn(builtin(arch))(layout.views(flat), x),
                          atol=1e-12)


# ---------------------------------------------------------------- training

def both_rounds(arch, shape, clients, n, settings, dtype=torch.float64, rounds=1, anchor=None, mu=0.0):
    """(vectorized, reference) weights and losses after ``rounds`` rounds from
    the same start; ``anchor``: None, "row" ([P]) or "rows" ([C, P])."""
    module, layout, flat, x, y = make(arch, shape, clients, n, dtype)
    centre = {None: None, "row": flat[0] + 0.3, "rows": flat.flip(0) - 0.2}[anchor]
    fast, slow = flat.clone(), flat.clone()
    for r in range(1, rounds + 1):
        orders = rng.batch_orders(3, r, torch.arange(clients), settings.epochs, n)
        lf = train_round(fast, layout, builtin(arch), x, y, orders, settings, anchor=centre, mu=mu)
        ls = reference_train_round(slow, layout, arch, x, y, orders, settings, shape, 10, anchor=centre, mu=mu)
    assert not torch.equal(fast, flat)  # it trained
    return fast, slow, lf, ls


@pytest.mark.parametrize("arch,shape", [("mlp", MNIST), ("logreg", (60,))])
@pytest.mark.parametrize("backprop", ["auto", "func"])
def test_train_round_dense_equals_reference(arch, shape, backprop):
    # N = 40, batch 16: batches 16 + 16 + 8 (last partial); 2 epochs = 6 momentum steps; chunks of 2 clients.
    # logreg goes through the MLP's hand-written backward with no hidden layer.
    s = TrainSettings(lr=0.08, momentum=0.9, batch_size=16, epochs=2, client_chunk=2, backprop=backprop)
    fast, slow, lf, ls = both_rounds(arch, shape, 5, 40, s)
    assert torch.allclose(fast, slow, atol=1e-10) and torch.allclose(lf, ls, atol=1e-10)
    assert lf.shape == (5,)


def test_train_round_mlp_float32_and_two_rounds():
    # momentum restarts from zero each round; float32 and the real batches
    # (200 = 128 + 72).  A small lr: on random labels lr 0.08 amplifies
    # float32 rounding (4e-8 after one round, 1e-4 after two; float64 agrees to 1e-16).
    s = TrainSettings(lr=0.02, batch_size=128, epochs=3)
    fast, slow, lf, ls = both_rounds("mlp", MNIST, 2, 200, s, dtype=torch.float32, rounds=2)
    assert torch.allclose(fast, slow, atol=1e-5) and torch.allclose(lf, ls, atol=1e-5)


def test_train_round_cnn_equals_reference():
    # 3 clients in chunks of 2, N = 10, batch 4: 4 + 4 + 2, 2 epochs
    s = TrainSettings(lr=0.05, momentum=0.9, batch_size=4, epochs=2, client_chunk=2)
    fast, slow, lf, ls = both_rounds("cnn", SMALL_CNN, 3, 10, s)
    assert torch.allclose(fast, slow, atol=1e-10) and torch.allclose(lf, ls, atol=1e-10)


def test_pool_before_relu_has_the_modules_values_and_gradients():
    # the batched CNN applies relu after max-pool; with ties (positive, zero,
    # all negative) the gradient must reach the same elements as the module's
    # relu-then-pool, and the values must be equal
    windows = torch.tensor([[[-1.0, -2.0], [-3.0, -4.0]], [[0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0], [0.5, -1.0]],
                            [[-1.0, 2.0], [2.0, 0.0]], [[0.0, -1.0], [3.0, 3.0]], [[-2.0, 0.0], [-1.0, 0.0]]],
                           dtype=torch.float64)
    h = windows.permute(1, 0, 2).reshape(1, 1, 2, 12)  # six 2x2 windows side by side
    weight = torch.arange(1.0, 7.0, dtype=torch.float64).view(1, 1, 1, 6)
    grads = []
    for order in ("module", "batched"):
        hh = h.clone().requires_grad_()
        out = F.max_pool2d(F.relu(hh), 2) if order == "module" else F.relu(F.max_pool2d(hh, 2))
        (out * weight).sum().backward()
        grads.append((out.detach(), hh.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    assert grads[0][1].sum() == 3 + 4 + 5  # positive windows only, one element each


@pytest.mark.parametrize("arch,shape,backprop,anchor", [
    ("mlp", MNIST, "auto", "row"), ("mlp", MNIST, "func", "rows"), ("logreg", (60,), "auto", "rows"),
    ("cnn", SMALL_CNN, "auto", "rows")])
def test_train_round_proximal_term_equals_reference(arch, shape, backprop, anchor):
    # FedProx / FPFC local objective: CE + mu/2 ||w - anchor||^2
    s = TrainSettings(lr=0.05, batch_size=8, epochs=2, client_chunk=2, backprop=backprop)
    fast, slow, lf, ls = both_rounds(arch, shape, 3, 12, s, anchor=anchor, mu=0.5)
    assert torch.allclose(fast, slow, atol=1e-10) and torch.allclose(lf, ls, atol=1e-10)
    plain, _, _, _ = both_rounds(arch, shape, 3, 12, s)
    assert (fast - plain).abs().max() > 1e-4  # the term matters


def test_train_round_anchor_aliasing_the_weights_is_the_round_start():
    # an anchor that is the trained buffer itself means "the weights the round starts from"
    _, layout, flat, x, y = make("mlp", (60,), 2, 12)
    s = TrainSettings(lr=0.05, batch_size=8, epochs=2)
    orders = rng.batch_orders(0, 1, torch.arange(2), 2, 12)
    start = flat.clone()
    want = flat.clone()
    train_round(want, layout, builtin("mlp"), x, y, orders, s, anchor=start, mu=0.5)
    train_round(flat, layout, builtin("mlp"), x, y, orders, s, anchor=flat, mu=0.5)
    assert torch.allclose(flat, want, atol=1e-12)
    with pytest.raises(ValueError, match="mu"):
        train_round(flat, layout, builtin("mlp"), x, y, orders, s, anchor=start, mu=-1.0)
    with pytest.raises(ValueError, match="anchor"):
        train_round(flat, layout, builtin("mlp"), x, y, orders, s, anchor=start[:, :5], mu=0.5)


def test_train_round_cnn_float32():
    s = TrainSettings(lr=0.05, batch_size=8, epochs=1)
    fast, slow, lf, ls = both_rounds("cnn", SMALL_CNN, 2, 12, s, dtype=torch.float32)
    assert torch.allclose(fast, slow, atol=1e-5) and torch.allclose(lf, ls, atol=1e-5)


def test_sgd_momentum_matches_torch_optimizer():
    torch.manual_seed(1)
    w = torch.randn(4, 6, dtype=torch.float64)
    grads = [torch.randn(4, 6, dtype=torch.float64) for _ in range(4)]
    p = w.clone().requires_grad_()
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    mine, bufs = w.clone(), None
    for g in grads:
        p.grad = g.clone()
        opt.step()
        bufs = train.sgd_momentum_([mine], [g.clone()], bufs, 0.1, 0.9)
    assert torch.allclose(mine, p.detach(), atol=1e-14)


def test_train_round_rejects_bad_orders():
    _, layout, flat, x, y = make("mlp", (60,), 2, 10)
    s = TrainSettings(lr=0.1, epochs=2)
    with pytest.raises(ValueError, match="orders"):
        train_round(flat, layout, builtin("mlp"), x, y, torch.zeros(2, 3, 10, dtype=torch.long), s)
    with pytest.raises(ValueError, match="epochs"):
        train_round(flat, layout, builtin("mlp"), x, y, rng.batch_orders(0, 1, torch.arange(2), 3, 10), s)
    with pytest.raises(ValueError, match="TrainSettings.lr"):    # the engine's guard; train.lr is checked with the config
        TrainSettings(lr=0.0)


# ---------------------------------------------------------------- evaluation

def loop_metrics(module, layout, models, xs, ys):
    """Plain loop: accuracy and mean CE of models[m] on xs[m], ys[m]."""
    acc, loss = [], []
    with torch.no_grad():
        for w, x, y in zip(models, xs, ys):
            layout.load_into(module, w)
            logits = module(x)
            acc.append((logits.argmax(1) == y).double().mean())
            loss.append(F.cross_entropy(logits, y))
    return torch.stack(acc), torch.stack(loss)


@pytest.mark.parametrize("arch,shape", [("mlp", MNIST), ("logreg", (60,)), ("cnn", SMALL_CNN)])
def test_evaluate_equals_per_client_loop(arch, shape, monkeypatch):
    module, layout, flat, x, y = make(arch, shape, 5, 30, spread=0.3)
    want_acc, want_loss = loop_metrics(module, layout, flat, x, y)
    for chunk in (None, 7):
        acc, loss = evaluate(flat, layout, builtin(arch), x, y, chunk=chunk)
        assert torch.allclose(acc, want_acc) and torch.allclose(loss, want_loss, atol=1e-10)
    monkeypatch.setattr(memory, "CPU_EVAL_BYTES", 1)  # one client and one sample per pass
    acc, loss = evaluate(flat, layout, builtin(arch), x, y)
    assert torch.allclose(acc, want_acc) and torch.allclose(loss, want_loss, atol=1e-10)


@pytest.mark.parametrize("arch,shape", [("mlp", MNIST), ("cnn", SMALL_CNN)])
def test_pair_losses_equals_per_model_evaluation(arch, shape, monkeypatch):
    module, layout, flat, x, y = make(arch, shape, 4, 20, spread=0.3)
    torch.manual_seed(5)
    models = flat[torch.tensor([0, 3, 1, 1, 2, 0, 3])] + 0.01 * torch.randn(7, layout.numel, dtype=flat.dtype)
    owner = torch.tensor([2, 0, 1, 3, 3, 0, 1])
    _, want = loop_metrics(module, layout, models, x[owner], y[owner])
    assert torch.allclose(pair_losses(models, layout, builtin(arch), x, y, owner), want, atol=1e-10)
    monkeypatch.setattr(memory, "CPU_EVAL_BYTES", 1)
    assert torch.allclose(pair_losses(models, layout, builtin(arch), x, y, owner), want, atol=1e-10)
    with pytest.raises(ValueError, match="owner"):
        pair_losses(models, layout, builtin(arch), x, y, torch.full((7,), 4))
    aligned = models[:4]                                  # model m on client m: the data sliced, not gathered
    _, want = loop_metrics(module, layout, aligned, x, y)
    assert torch.allclose(pair_losses(aligned, layout, builtin(arch), x, y, torch.arange(4)), want, atol=1e-10)


@pytest.mark.parametrize("arch,shape", [("mlp", MNIST), ("logreg", (60,)), ("cnn", SMALL_CNN)])
def test_pool_losses_equals_per_model_evaluation(arch, shape):
    """Client c's loss of models[peers[c, s]], grouped by client, against nn.Module evaluation one model at a time."""
    module, layout, flat, x, y = make(arch, shape, 4, 20, spread=0.3)
    torch.manual_seed(6)
    models = torch.cat([flat, flat[:2] + 0.2 * torch.randn(2, layout.numel, dtype=flat.dtype)])   # 6 models
    peers = torch.tensor([[1, 4, 5], [0, 0, 2], [5, 3, 1], [2, 4, 0]])   # repeats allowed (padding)
    owner = torch.arange(4).repeat_interleave(3)
    _, want = loop_metrics(module, layout, models[peers.reshape(-1)], x[owner], y[owner])
    got = pool_losses(models, layout, builtin(arch), x, y, peers)
    assert got.shape == (4, 3) and torch.allclose(got.reshape(-1), want, atol=1e-10)
    for chunk in (1, 3):     # clients per pass
        assert torch.allclose(pool_losses(models, layout, builtin(arch), x, y, peers, chunk=chunk), got, atol=1e-12)
    assert pool_losses(models, layout, builtin(arch), x, y, peers[:, :0]).shape == (4, 0)
    with pytest.raises(ValueError, match="peers"):
        pool_losses(models, layout, builtin(arch), x, y, torch.full((4, 2), 6))


# ---------------------------------------------------------------- bench

def test_bench_records_and_table(monkeypatch, capsys):
    tiny = [bench.Case("mlp", 3, "vectorized", "tiny"), bench.Case("mlp", 3, "reference", "tiny")]
    monkeypatch.setattr(bench, "plan", lambda quick, device: tiny)
    assert bench.main(["--json", "--repeats", "1", "--device", "cpu"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["model"], r["clients"], r["path"]) for r in records] == [("mlp", 3, "vectorized"), ("mlp", 3, "reference")]
    for r in records:
        assert r["ms_per_round"] > 0 and r["peak_mem_mb"] >= 0 and r["device"].startswith("cpu") and r["note"] == "tiny"
    assert bench.main(["--repeats", "1", "--device", "cpu", "--models", "mlp"]) == 0
    out = capsys.readouterr().out
    assert "speed-up mlp vectorized at 3 clients" in out and "device: cpu" in out


def test_bench_times_a_user_model_batched_looped_and_as_the_plain_loop(monkeypatch, capsys):
    spec = str(Path(__file__).resolve().parents[1] / "plugins" / "user_models.py") + ":tabular"
    monkeypatch.setattr(bench, "user_plan", lambda specs, quick: [bench.Case(s, 3, p, "tiny") for s in specs
                                                                   for p in bench.USER_PATHS])
    assert bench.main(["--repeats", "1", "--device", "cpu", "--models", "", "--user-models", spec]) == 0
    out = capsys.readouterr().out
    for path in ("batched", "loop"):
        assert f"speed-up {spec} {path} at 3 clients" in out and f"(reference / {path})" in out
    assert out.count(spec) >= 5   # three rows and two speed-ups


def test_bench_quick_plan_times_what_it_reports():
    cases = bench.plan(True, torch.device("cpu"))
    assert {c.model for c in cases} == {"mlp", "cnn"}
    assert all(c.clients < 100 and "10 clients" in c.note for c in cases if c.model == "cnn")
    full = bench.plan(False, torch.device("cpu"))
    assert {(c.model, c.clients, c.path) for c in full} == {
        (m, c, p) for m in ("mlp", "cnn") for c, p in ((100, "vectorized"), (100, "reference"), (1000, "vectorized"))}


def test_batch_orders_on_a_gpu_equal_the_host_ones():
    """The runner draws each round's batch orders on the device that trains: the same orders as the host's
    (integer hash, float64 keys, stable sort)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here: experiments/gpu.sh runs this check on a lent GPU")
    ids = torch.arange(40, 90)
    counts = torch.randint(5, 31, (50,), generator=torch.Generator().manual_seed(0))
    host = rng.batch_orders(7, 3, ids, 2, 30, counts)
    device = rng.batch_orders(7, 3, ids.cuda(), 2, 30, counts.cuda())
    assert device.is_cuda and torch.equal(device.cpu(), host)


# ---------------------------------------------------------------- proximal term on some tensors only

def head_proximal_reference(flat, layout, module, x, y, orders, settings, anchor, mu, names, counts=None):
    """Plain per-client loop with ``torch.optim.SGD``: objective = batch CE + ``mu/2 ||w_k − anchor_k||²``
    summed over the tensors named in ``names`` only (FPFC's ``fpfc.fuse=head``); client c's batches are
    consecutive slices of its first counts[c] order entries.  In place on ``flat``."""
    for c in range(flat.shape[0]):
        layout.load_into(module, flat[c])
        centre = layout.views(anchor[c])
        opt = torch.optim.SGD(module.parameters(), lr=settings.lr, momentum=settings.momentum)
        m = x.shape[1] if counts is None else int(counts[c])
        for epoch in range(orders.shape[0]):
            order = orders[epoch, c, :m]
            for start in range(0, m, settings.batch_size):
                idx = order[start:start + settings.batch_size]
                objective = F.cross_entropy(module(x[c, idx]), y[c, idx])
                for name, p in module.named_parameters():
                    if name in names:
                        objective = objective + 0.5 * mu * (p - centre[name]).pow(2).sum()
                opt.zero_grad(set_to_none=True)
                objective.backward()
                opt.step()
        flat[c] = layout.flatten(module)


@pytest.mark.parametrize("arch,shape,backprop,path", [
    ("mlp", (60,), "auto", "dense"), ("mlp", (60,), "func", "func"), ("cnn", SMALL_CNN, "auto", "func"),
    ("mlp", (60,), "auto", "masked"), ("mlp", (60,), "auto", "loop")])
def test_proximal_term_on_the_head_only_equals_a_plain_loop(arch, shape, backprop, path):
    """``prox_layers`` (RoundPlan.prox_layers, FPFC's fpfc.fuse=head): the term on the last layer only, on
    every training path, against the per-client loop; the body's columns see no term."""
    module, layout, flat, x, y = make(arch, shape, 3, 12)
    head = layout.names[-2:]                          # fc3 / fc2: weight and bias
    anchor = flat.flip(0) - 0.2
    s = TrainSettings(lr=0.05, batch_size=5, epochs=2, client_chunk=2, backprop=backprop)
    counts = torch.tensor([12, 7, 9]) if path == "masked" else None
    orders = rng.batch_orders(3, 1, torch.arange(3), 2, 12, counts)
    net = train.ModuleNet(build_model(arch, shape, 10).to(flat.dtype), "loop") if path == "loop" else builtin(arch)
    fast, slow, whole = flat.clone(), flat.clone(), flat.clone()
    train_round(fast, layout, net, x, y, orders, s, anchor=anchor, mu=0.5, counts=counts, prox_layers=head)
    head_proximal_reference(slow, layout, module, x, y, orders, s, anchor, 0.5, head, counts)
    assert torch.allclose(fast, slow, rtol=0, atol=1e-10)
    train_round(whole, layout, net, x, y, orders, s, anchor=anchor, mu=0.5, counts=counts)
    assert (fast - whole).abs().max() > 1e-4          # the body's term is gone
    everything = flat.clone()
    train_round(everything, layout, net, x, y, orders, s, anchor=anchor, mu=0.5, counts=counts,
                prox_layers=layout.names)
    assert torch.allclose(everything, whole, rtol=0, atol=1e-12)   # every tensor named: the whole model's term


def test_prox_layers_naming_no_parameter_tensor_is_refused():
    _, layout, flat, x, y = make("mlp", (60,), 2, 12)
    orders = rng.batch_orders(0, 1, torch.arange(2), 1, 12)
    s = TrainSettings(lr=0.05, batch_size=8, epochs=1)
    for bad in (("fc9.weight",), ()):
        with pytest.raises(ValueError, match="prox_layers") as e:
            train_round(flat.clone(), layout, builtin("mlp"), x, y, orders, s, anchor=flat.clone(), mu=0.5, prox_layers=bad)
        assert "fc3.weight" in str(e.value) and "None" in str(e.value)   # names the choices and the fix


def test_client_width_by_hand():
    counts = torch.tensor([1, 2, 3, 200, 256, 257, 1000])
    assert train.client_width(counts, 600).tolist() == [1, 2, 4, 256, 256, 512, 600]
    groups = train.width_groups(torch.tensor([7, 12, 9, 3, 8]), 12)
    assert [(w, m.tolist()) for w, m in groups] == [(4, [3]), (8, [0, 4]), (12, [1, 2])]


@pytest.mark.parametrize("arch,shape,batch", [("mlp", (20,), 4), ("logreg", (20,), 64), ("cnn", SMALL_CNN, 5)])
def test_unequal_clients_train_at_their_own_width_bit_for_bit_in_any_grouping(arch, shape, batch):
    """Each client trains at client_width(count) whatever clients share its pass or its rank: the whole set
    and two shards give the same bits; and the result equals the clients padded to the whole width N (the
    masked path before the widths) to rounding."""
    n = 40
    _, layout, flat, x, y = make(arch, shape, 9, n)
    counts = torch.tensor([3, 40, 17, 8, 33, 5, 12, 40, 20])
    ids = torch.arange(9)
    orders = rng.batch_orders(5, 2, ids, 2, n, counts)
    s = TrainSettings(lr=0.05, batch_size=batch, epochs=2, client_chunk=3, momentum=0.5)
    whole, parts, padded = flat.clone(), flat.clone(), flat.clone()
    loss = train_round(whole, layout, builtin(arch), x, y, orders, s, counts=counts)
    for lo, hi in ((0, 4), (4, 9)):
        shard = parts[lo:hi]
        got = train_round(shard, layout, builtin(arch), x[lo:hi], y[lo:hi], orders[:, lo:hi], s, counts=counts[lo:hi])
        assert torch.equal(got, loss[lo:hi])
    assert torch.equal(parts, whole)
    ref = train._train_chunk_masked(padded, layout, builtin(arch), x, y, orders, s, None, 0.0, counts)
    torch.testing.assert_close(whole, padded, rtol=0, atol=1e-12)
    torch.testing.assert_close(loss, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch,shape,path,unequal", [
    ("mlp", (20,), "hand", False), ("mlp", (20,), "hand", True), ("cnn", SMALL_CNN, "hand", False),
    ("mlp", (20,), "loop", False), ("mlp", (20,), "batched", True)])
def test_only_the_rows_that_train_change_and_their_bits_are_the_whole_sets(arch, shape, path, unequal):
    """``train=mask`` (the round's participants): the chosen rows end with the same bits and losses as when
    every client trains, the others keep their weights and report a NaN loss; with equal and unequal counts,
    the hand-written paths, the per-client loop and the vmap path."""
    n, C = 12, 7
    module, layout, flat, x, y = make(arch, shape, C, n)
    net = builtin(arch) if path == "hand" else train.ModuleNet(module, path)
    counts = torch.tensor([3, 12, 7, 12, 5, 9, 12]) if unequal else None
    orders = rng.batch_orders(1, 3, torch.arange(C), 2, n, counts)
    s = TrainSettings(lr=0.05, batch_size=4, epochs=2, client_chunk=2, momentum=0.5)
    mask = torch.tensor([True, False, True, True, False, False, True])
    anchor = flat.clone()
    whole, part = flat.clone(), flat.clone()
    want = train_round(whole, layout, net, x, y, orders, s, anchor=anchor, mu=0.1, counts=counts)
    got = train_round(part, layout, net, x, y, orders, s, anchor=anchor, mu=0.1, counts=counts, train=mask)
    assert torch.equal(part[mask], whole[mask]) and torch.equal(got[mask], want[mask])
    assert torch.equal(part[~mask], flat[~mask]) and bool(got[~mask].isnan().all())
    none = flat.clone()
    assert bool(train_round(none, layout, net, x, y, orders, s, train=torch.zeros(C, dtype=torch.bool)).isnan().all())
    assert torch.equal(none, flat)
    with pytest.raises(ValueError, match="bool"):
        train_round(flat.clone(), layout, net, x, y, orders, s, train=mask.long())


# ---------------------------------------------------------------- stragglers

@pytest.mark.parametrize("arch,shape,backprop", [("mlp", MNIST, "auto"), ("mlp", MNIST, "func"),
                                                 ("cnn", SMALL_CNN, "auto")])
def test_a_straggler_stops_after_max_steps_as_the_reference_does(arch, shape, backprop):
    """max_steps = 4 of 6 (2 epochs of 3 batches): the second epoch stops after its first batch."""
    s = TrainSettings(lr=0.08, momentum=0.9, batch_size=16, epochs=2, client_chunk=2, backprop=backprop, max_steps=4)
    fast, slow, lf, ls = both_rounds(arch, shape, 4, 40, s)
    assert torch.allclose(fast, slow, atol=1e-10) and torch.allclose(lf, ls, atol=1e-10)
    full, _, _, _ = both_rounds(arch, shape, 4, 40, dataclasses.replace(s, max_steps=0))
    assert not torch.allclose(full, fast)                          # it did stop early


def test_stragglers_trained_apart_leave_the_others_bit_for_bit():
    """The runner trains a round's stragglers in a call of their own (train= the stragglers, max_steps) and the
    others in another: the others' bits are those of a round without stragglers."""
    module, layout, flat, x, y = make("mlp", MNIST, 6, 40, torch.float32)
    s = TrainSettings(lr=0.08, batch_size=16, epochs=2)
    orders = rng.batch_orders(3, 1, torch.arange(6), 2, 40)
    whole = flat.clone()
    train_round(whole, layout, builtin("mlp"), x, y, orders, s)
    split = flat.clone()
    slow = torch.tensor([False, True, False, False, True, False])
    train_round(split, layout, builtin("mlp"), x, y, orders, s, train=~slow)
    train_round(split, layout, builtin("mlp"), x, y, orders, dataclasses.replace(s, max_steps=2), train=slow)
    assert torch.equal(split[~slow], whole[~slow]) and not torch.equal(split[slow], whole[slow])
