"""Your own model (model=FILE.py:NAME): trained for all clients at once
exactly as one nn.Module + torch.optim.SGD per client would train it, or
refused before anything starts."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedclust import rng
from fedclust.engine.layout import ParamLayout
from fedclust.engine.module_net import ModuleNet
from fedclust.engine.pool import pool_losses
from fedclust.engine.train import TrainSettings, evaluate, train_round
from fedclust.errors import ConfigError
from fedclust.models import build_model, builtin, initial_weights, make_net, model_record

HERE = Path(__file__).resolve().parents[1]
MODELS = HERE / "plugins" / "user_models.py"
CONV, DENSE = f"{MODELS}:SmallConvGN", f"{MODELS}:tabular"
SHAPE, CLASSES = (1, 12, 12), 4


def plain_loop(spec, flat, x, y, orders, lr, momentum, batch, anchor=None, mu=0.0, counts=None):
    """Each client: its own nn.Module and torch.optim.SGD, the same batches;
    with ``counts``, alone on its own first counts[c] examples (its epoch the
    first counts[c] entries of its order, which must list each of them once)."""
    layout = ParamLayout.from_module(build_model(spec, SHAPE, CLASSES))
    out = flat.clone()
    for c in range(flat.shape[0]):
        model = build_model(spec, SHAPE, CLASSES)
        layout.load_into(model, flat[c])
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        m = x.shape[1] if counts is None else int(counts[c])
        for e in range(orders.shape[0]):
            order = orders[e, c, :m]
            assert sorted(order.tolist()) == list(range(m))          # its own examples, each once
            for s in range(0, m, batch):
                idx = order[s:s + batch]
                loss = F.cross_entropy(model(x[c, idx]), y[c, idx])
                if anchor is not None:
                    w = torch.cat([p.reshape(-1) for p in model.parameters()])
                    loss = loss + 0.5 * mu * (w - anchor).pow(2).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
        out[c] = layout.flatten(model)
    return out


def _setup(spec, clients=3, n=12, seed=0):
    layout, w0 = initial_weights(spec, SHAPE, CLASSES, seed)
    g = torch.Generator().manual_seed(seed + 1)
    flat = (w0 + 0.05 * torch.randn(clients, layout.numel, generator=g)).contiguous()   # clients differ
    x = torch.randn(clients, n, *SHAPE, generator=g)
    y = torch.randint(0, CLASSES, (clients, n), generator=g)
    orders = rng.batch_orders(seed, 1, torch.arange(clients), 2, n)
    return layout, flat, x, y, orders


@pytest.mark.parametrize("spec", [CONV, DENSE], ids=["conv_groupnorm", "dense_layernorm"])
@pytest.mark.parametrize("engine", ["batched", "loop"])
@pytest.mark.parametrize("proximal", [False, True], ids=["sgd", "proximal"])
def test_user_model_trains_as_a_plain_per_client_loop(spec, engine, proximal):
    layout, flat, x, y, orders = _setup(spec)
    anchor, mu = (flat[0].clone(), 0.3) if proximal else (None, 0.0)
    want = plain_loop(spec, flat, x, y, orders, lr=0.05, momentum=0.9, batch=5, anchor=anchor, mu=mu)
    net = ModuleNet(build_model(spec, SHAPE, CLASSES), engine)
    got = flat.clone()
    losses = train_round(got, layout, net, x, y, orders, TrainSettings(lr=0.05, momentum=0.9, batch_size=5, epochs=2),
                         anchor=anchor, mu=mu)
    assert losses.shape == (3,) and torch.isfinite(losses).all()
    assert not torch.equal(got, flat)                                  # it trained
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec", [CONV, DENSE], ids=["conv_groupnorm", "dense_layernorm"])
def test_user_model_evaluation_and_peer_losses_match_one_module_per_model(spec):
    layout, flat, x, y, _ = _setup(spec, clients=4, n=7)
    net = ModuleNet(build_model(spec, SHAPE, CLASSES), "batched")
    model = build_model(spec, SHAPE, CLASSES)

    def plain(row, xs, ys):
        layout.load_into(model, row)
        with torch.no_grad():
            logits = model(xs)
        return (logits.argmax(1) == ys).float().mean(), F.cross_entropy(logits, ys)

    acc, loss = evaluate(flat, layout, net, x, y)
    for c in range(4):
        a, l_ = plain(flat[c], x[c], y[c])
        assert acc[c].item() == pytest.approx(a.item()) and loss[c].item() == pytest.approx(l_.item(), rel=1e-5)
    peers = torch.tensor([[1, 2], [0, 3], [3, 1], [2, 0]])
    got = pool_losses(flat, layout, net, x, y, peers)
    for c in range(4):
        for s in range(2):
            assert got[c, s].item() == pytest.approx(plain(flat[peers[c, s]], x[c], y[c])[1].item(), rel=1e-5)


@pytest.mark.parametrize("engine", ["batched", "loop"])
def test_evaluation_runs_a_user_module_in_eval_mode_and_training_in_train_mode(engine):
    """model.eval() before inference, as any PyTorch user expects; the module is back in train mode after."""
    spec = f"{MODELS}:ModeDependent"
    net, _ = make_net(spec, SHAPE, CLASSES, engine, "cpu")
    layout = ParamLayout.from_module(net.module)
    flat = layout.flatten(net.module).repeat(3, 1)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 5, *SHAPE, generator=gen), torch.randint(0, CLASSES, (3, 5), generator=gen)
    model = build_model(spec, SHAPE, CLASSES)
    layout.load_into(model, flat[0])
    model.eval()
    with torch.no_grad():
        want = F.cross_entropy(model(x[0]), y[0])
    _, loss = evaluate(flat, layout, net, x, y)
    assert loss[0].item() == pytest.approx(want.item(), rel=1e-5)
    assert net.module.training


def test_auto_engine_batches_dense_models_and_loops_convolutions_on_a_cpu():
    net, why = make_net(DENSE, SHAPE, CLASSES, "auto", "cpu")
    assert net.engine == "batched" and "engine=batched" in why
    net, why = make_net(CONV, SHAPE, CLASSES, "auto", "cpu")
    assert net.engine == "loop" and "convolutions (Conv2d)" in why and "engine=batched overrides" in why
    assert make_net(CONV, SHAPE, CLASSES, "batched", "cpu")[0].engine == "batched"
    assert make_net(CONV, SHAPE, CLASSES, "auto", "cuda")[0].engine == "batched"
    assert make_net("mlp", SHAPE, CLASSES, "auto", "cpu") == (builtin("mlp"), "")   # built-ins keep their own paths
    loop, _ = make_net("mlp", SHAPE, CLASSES, "loop", "cpu")
    assert isinstance(loop, ModuleNet) and loop.engine == "loop"


def test_auto_engine_loops_clients_of_unequal_sizes_on_a_cpu(tmp_path):
    """The batched engine pads every client to the largest: on a CPU, auto trains one client after another where
    the clients' sizes differ (a natural file), and still batches equal clients and on a GPU."""
    net, why = make_net(DENSE, SHAPE, CLASSES, "auto", "cpu", unequal=True)
    assert net.engine == "loop" and "different numbers of examples" in why and "engine=batched overrides" in why
    assert make_net(DENSE, SHAPE, CLASSES, "auto", "cpu", unequal=False)[0].engine == "batched"
    assert make_net(DENSE, SHAPE, CLASSES, "auto", "cuda", unequal=True)[0].engine == "batched"
    assert make_net(DENSE, SHAPE, CLASSES, "batched", "cpu", unequal=True)[0].engine == "batched"
    import numpy as np

    from fedclust.config import load_config
    from fedclust.runner import prepare, run

    r = np.random.default_rng(0)
    sizes = np.array([2, 9, 30])
    owner = np.repeat(np.arange(3), sizes)
    np.savez(tmp_path / "f.npz", x_train=r.normal(size=(len(owner), 5)).astype(np.float32),
             y_train=np.arange(len(owner)) % 3, x_test=r.normal(size=(6, 5)).astype(np.float32),
             y_test=np.arange(6) % 3, client_train=owner, client_test=np.arange(6) % 3)
    summaries = {}
    for engine in ("auto", "batched"):
        cfg = load_config(None, ["data.name=npz", f"data.path={tmp_path / 'f.npz'}", "clients=3", "rounds=2",
                                 "algorithm.name=fedavg", f"model={MODELS}:TabularNet", f"engine={engine}",
                                 "progress=false", "figures=false", f"out={tmp_path / engine}"])
        summaries[engine] = run(cfg, prepare(cfg))
    assert summaries["auto"]["model_engine"] == "loop" and summaries["batched"]["model_engine"] == "batched"
    assert summaries["auto"]["final_accuracy"] == pytest.approx(summaries["batched"]["final_accuracy"], abs=1e-4)


def test_a_model_vmap_cannot_batch_falls_back_to_the_loop_or_is_refused_when_batched_is_asked():
    spec = f"{MODELS}:DataDependent"
    net, why = make_net(spec, SHAPE, CLASSES, "auto", "cpu")
    assert net.engine == "loop" and "torch.func.vmap cannot batch it" in why
    with pytest.raises(ConfigError) as e:
        make_net(spec, SHAPE, CLASSES, "batched", "cpu")
    assert e.value.field == "engine" and "engine=loop" in str(e.value)


@pytest.mark.parametrize("name, words", [
    ("WithBatchNorm", ["'bn' (BatchNorm1d)", "running statistics", "nn.GroupNorm"]),
    ("WithDropout", ["'drop' (Dropout)", "(seed, round, client)", "p=0"]),
    ("BatchStatistics", ["'bn' (BatchNorm1d with track_running_stats off)", "that batch's own statistics",
                         "nn.GroupNorm"]),
    ("FunctionalDropout", ["draws random numbers", "(seed, round, client)", "dropout p=0"]),
    ("RandomInForward", ["draws random numbers"]),
    ("WrongOutput", ["logits [batch, 4]", "got (2, 3)"]),
    ("not_a_module", ["must return a torch.nn.Module, got str"]),
    ("NoSuchName", ["has no callable 'NoSuchName'", "SmallConvGN"]),
])
def test_models_the_engine_cannot_train_are_refused_naming_the_module_and_the_fix(name, words):
    with pytest.raises(ConfigError) as e:
        make_net(f"{MODELS}:{name}", SHAPE, CLASSES, "auto", "cpu")
    assert e.value.field == "model"
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_a_missing_file_or_module_is_named():
    with pytest.raises(ConfigError, match="no such file"):
        make_net("nowhere/model.py:Net", SHAPE, CLASSES)
    with pytest.raises(ConfigError, match="cannot import it"):
        make_net("no_such_package_xyz.models:Net", SHAPE, CLASSES)


def test_the_run_records_the_model_source_its_hash_and_size():
    import hashlib
    rec = model_record(DENSE, 1234, ModuleNet(build_model(DENSE, SHAPE, CLASSES), "batched"))
    assert rec == {"model_parameters": 1234, "model_engine": "batched", "model_source": str(MODELS),
                   "model_source_sha256": hashlib.sha256(MODELS.read_bytes()).hexdigest()}
    assert model_record("mlp", 10, "mlp")["model_source"] is None


# ---------------------------------------------------------------- clients of unequal sizes

@pytest.mark.parametrize("arch", ["mlp", DENSE, CONV, "loop"])
def test_clients_of_unequal_sizes_train_and_evaluate_as_each_alone_on_its_own_examples(arch):
    spec = {"mlp": "mlp", "loop": DENSE}.get(arch, arch)
    layout, flat, x, y, _ = _setup(spec, clients=4, n=13)
    counts = torch.tensor([13, 4, 9, 1])
    x[1, 4:] = 1e6      # padding must never be read
    orders = rng.batch_orders(0, 1, torch.arange(4), 2, 13, counts)
    want = plain_loop(spec, flat, x, y, orders, lr=0.05, momentum=0.9, batch=5, counts=counts)
    if spec == "mlp":
        net = builtin("mlp")
    else:
        net = ModuleNet(build_model(spec, SHAPE, CLASSES), "loop" if arch in ("loop", CONV) else "batched")
    got = flat.clone()
    train_round(got, layout, net, x, y, orders, TrainSettings(lr=0.05, momentum=0.9, batch_size=5, epochs=2),
                counts=counts)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    acc, loss = evaluate(got, layout, net, x, y, counts=counts)
    model = build_model(spec, SHAPE, CLASSES)
    for c in range(4):
        layout.load_into(model, got[c])
        with torch.no_grad():
            logits = model(x[c, :counts[c]])
        assert acc[c].item() == pytest.approx((logits.argmax(1) == y[c, :counts[c]]).float().mean().item())
        assert loss[c].item() == pytest.approx(F.cross_entropy(logits, y[c, :counts[c]]).item(), rel=1e-5)
    peers = torch.tensor([[1], [2], [3], [0]])
    pl = pool_losses(got, layout, net, x, y, peers, counts=counts)
    for c in range(4):
        layout.load_into(model, got[peers[c, 0]])
        with torch.no_grad():
            want_l = F.cross_entropy(model(x[c, :counts[c]]), y[c, :counts[c]])
        assert pl[c, 0].item() == pytest.approx(want_l.item(), rel=1e-5)


def test_batch_orders_list_each_clients_own_examples_first_and_equal_counts_change_nothing():
    counts = torch.tensor([5, 2, 5])
    o = rng.batch_orders(7, 3, torch.tensor([0, 1, 2]), 2, 5, counts)
    assert sorted(o[0, 1, :2].tolist()) == [0, 1] and o[0, 1, 2:].tolist() == [2, 3, 4]
    assert torch.equal(rng.batch_orders(7, 3, torch.tensor([0, 2]), 2, 5, torch.tensor([5, 5])),
                       rng.batch_orders(7, 3, torch.tensor([0, 2]), 2, 5))


def test_a_model_named_by_package_module_and_name(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE / "plugins"))
    net, why = make_net("user_models:tabular", SHAPE, CLASSES, "auto", "cpu")
    assert isinstance(net, ModuleNet) and net.engine == "batched" and why.startswith("model user_models:tabular")
    assert model_record("user_models:tabular", 1, net)["model_source"] == str(MODELS)


def test_a_factory_that_fails_on_the_data_sets_shape_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        make_net(f"{HERE.parent / 'examples' / 'own_model' / 'model.py'}:TinyResNet", (60,), 10)
    assert e.value.field == "model" and "raised ValueError" in str(e.value) and "(60,)" in str(e.value)
