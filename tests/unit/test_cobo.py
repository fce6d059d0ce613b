"""CoBo (fedclust/algorithms/cobo.py) against its rules written plainly, as
the reference code (epfml/CoBo personalized-vision-models: optim/cobo_optim.py,
grouping.py) states them: the pull towards collaborators client by client,
the pairs drawn on the upper triangle, a pair's batches, the weight update
from the two gradients at the midpoint (computed one pair and one side at a
time), the engine's midpoint gradients against nn.Module autograd one model
at a time, two processes' shares, graphs and offline clients, and its keys."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.cobo import Cobo, CoboConfig, draw_pairs, pair_batches, pair_probability
from fedclust.config import load_config
from fedclust.engine.layout import ParamLayout
from fedclust.engine.train import batch_grads
from fedclust.errors import ConfigError
from fedclust.models import build_model
from fedclust.models.registry import builtin
from fedclust.network import Delivery, Network
from fedclust.schema import NetworkConfig, TrainConfig

P, WIDTH = 4, 6


def test_pair_probability_by_hand():
    cfg = CoboConfig()
    assert pair_probability(cfg, 8, 1) == 0.25 and pair_probability(cfg, 8, 801) == 0.25   # steps 0 .. 800
    assert pair_probability(cfg, 8, 802) == pytest.approx(1 / math.sqrt(801))
    assert pair_probability(cfg, 2, 5) == 1.0
    assert pair_probability(CoboConfig(pairs=0.7), 8, 5000) == 0.7
    assert pair_probability(CoboConfig(switch=3), 8, 5) == pytest.approx(0.5)                # 1/sqrt(4)


def test_pairs_are_the_upper_triangle_keys_at_most_p():
    n, seed, t, p = 11, 3, 4, 0.3
    I, J = draw_pairs(seed, t, n, p)
    want = [(i, j) for i in range(n) for j in range(i + 1, n)
            if float(rng.uniform(seed, t, "cobo_pairs", torch.tensor(i), torch.tensor(j))) <= p]
    assert list(zip(I.tolist(), J.tolist())) == want and want
    allowed = torch.rand(n, n, generator=torch.Generator().manual_seed(0)) < 0.5
    I, J = draw_pairs(seed, t, n, p, lambda lo, hi: allowed[lo:hi])
    assert list(zip(I.tolist(), J.tolist())) == [(i, j) for i, j in want if bool(allowed[i, j])]


def test_a_pairs_batch_is_its_lowest_keys_among_real_examples():
    seed, t = 2, 5
    clients, partners, counts = torch.tensor([0, 3, 3]), torch.tensor([3, 0, 1]), torch.tensor([6, 2, 6])
    examples, weights = pair_batches(seed, t, clients, partners, counts, WIDTH, 4)
    for k in range(3):
        i, j, m = int(clients[k]), int(partners[k]), int(counts[k])
        keys = {e: float(rng.uniform(seed, t, "cobo_batch", torch.tensor(i), torch.tensor(j * WIDTH + e)))
                for e in range(m)}
        want = sorted(keys, key=keys.get)[:4]
        got = [int(e) for e, w in zip(examples[k], weights[k]) if w > 0]
        assert got == want and torch.allclose(weights[k][weights[k] > 0], torch.full((len(want),), 1 / len(want)))
    assert examples.shape == (3, 4)


@pytest.mark.parametrize("arch,shape", [("mlp", (1, 6, 6)), ("cnn", (3, 18, 18))])
def test_batch_grads_equal_autograd_one_model_at_a_time(arch, shape):
    torch.manual_seed(0)
    module = build_model(arch, shape, 10)
    layout = ParamLayout.from_module(module)
    w0 = layout.flatten(module)
    models = w0 + 0.1 * torch.randn(5, layout.numel)
    x, y = torch.randn(3, 7, *shape), torch.randint(0, 10, (3, 7))
    owner = torch.tensor([2, 0, 1, 1, 2])
    examples = torch.randint(0, 7, (5, 3))
    weights = torch.rand(5, 3)
    got = batch_grads(models, layout, builtin(arch), x, y, owner, examples, weights)
    for m in range(5):
        layout.load_into(module, models[m])
        module.zero_grad()
        xb, yb = x[owner[m], examples[m]], y[owner[m], examples[m]]
        (F.cross_entropy(module(xb), yb, reduction="none") * weights[m]).sum().backward()
        want = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
        assert torch.allclose(got[m], want, atol=1e-5), m


# a hand-made engine: client c's example e is the point targets[c, e]; f(z; batch) = Σ_b w_b ||z − t_b||² / 2
CENTRES = 2.0 * (torch.arange(12) % 2 * 2 - 1).to(torch.float32)[:, None, None]   # clusters: odd and even clients
TARGETS = CENTRES + torch.randn(12, WIDTH, P, generator=torch.Generator().manual_seed(11))


def fake_grad(ids):
    def batch_grad(models, owner, examples, weights):
        t = TARGETS[ids[owner][:, None], examples]
        return (weights[..., None] * (models[:, None] - t)).sum(1)
    return batch_grad


def make_ctx(n, ids, seed=3, all_reduce=lambda x: x, delivery=lambda t: None, reach=lambda t: None,
             graph=lambda t: None, online=lambda t: None):
    return Context(n=n, client_ids=ids, clusters=torch.arange(n) % 2, seed=seed, stage1_rounds=1,
                   w0=torch.zeros(P), device=torch.device("cpu"), batch_grad=fake_grad(ids), all_reduce=all_reduce,
                   train_examples=torch.full((len(ids),), WIDTH), train_width=WIDTH, delivery=delivery,
                   reach=reach, graph=graph, online=online)


def plain_round(w, after, t, seed, cfg, lr, batch, allowed=None, links=None):
    """The round one client and one pair at a time: the pull from the snapshot (cobo_optim.py), then each drawn
    pair's two gradients at the midpoint and the clipped step (grouping.py)."""
    n = len(after)
    out = after.clone()
    c = (cfg.consensus_lr or lr) * cfg.rho
    for i in range(n):
        for k in range(n):
            if k != i and float(w[i, k]) > 0 and (links is None or bool(links[i, k])):
                out[i] -= c * float(w[i, k]) * (after[i] - after[k])
    w = w.clone()
    p = pair_probability(cfg, n, t)
    for i in range(n):
        for j in range(i + 1, n):
            if float(rng.uniform(seed, t, "cobo_pairs", torch.tensor(i), torch.tensor(j))) > p:
                continue
            if allowed is not None and not bool(allowed[i, j]):
                continue
            z = (after[i] + after[j]) / 2
            g = []
            for a, b in ((i, j), (j, i)):
                keys = [float(rng.uniform(seed, t, "cobo_batch", torch.tensor(a), torch.tensor(b * WIDTH + e)))
                        for e in range(WIDTH)]
                batch_of = sorted(range(WIDTH), key=lambda e: keys[e])[:batch]
                g.append(sum((z - TARGETS[a, e]) / len(batch_of) for e in batch_of))
            new = min(1.0, max(0.0, float(w[i, j]) + cfg.gamma * float(g[0] @ g[1])))
            w[i, j] = w[j, i] = new
    return out, w


def test_rounds_match_the_plain_rule():
    n, seed = 8, 3
    gen = torch.Generator().manual_seed(12)
    cfg = CoboConfig(rho=0.05, gamma=0.5, pairs=0.4)
    algo = Cobo(TrainConfig(lr=0.5, batch_size=3), cfg)
    ctx = make_ctx(n, torch.arange(n), seed)
    state = algo.init(ctx)
    for t in (1, 2, 3):
        after = TARGETS[:n].mean(1) + 0.5 * torch.randn(n, P, generator=gen)
        want_models, want_w = plain_round(state.w, after, t, seed, cfg, algo.train.round_lr(t), 3)
        state, result = algo.aggregate(state, ctx, RoundView(round=t, before=None, after=after, all_after=after))
        assert torch.allclose(result.models, want_models, atol=1e-5)
        assert torch.allclose(state.w, want_w, atol=1e-5) and torch.equal(state.w, state.w.T)
    assert bool((state.w < 1).any()) and bool((state.w == 0).any())       # the weights moved, some to 0
    links = (state.w > 0) & ~torch.eye(n, dtype=torch.bool)
    _, result = algo.aggregate(state, ctx, RoundView(round=4, before=None, after=after, all_after=after))
    assert torch.equal(result.lists, links)


def test_two_processes_share_the_same_round():
    n, seed, t = 8, 4, 2
    gen = torch.Generator().manual_seed(13)
    algo = Cobo(TrainConfig(lr=0.5, batch_size=4), CoboConfig(rho=0.05, gamma=0.5, pairs=0.5))
    after = torch.randn(n, P, generator=gen)
    whole_ctx = make_ctx(n, torch.arange(n), seed)
    state = algo.init(whole_ctx)
    state.w[0, 5] = state.w[5, 0] = 0.3
    whole, whole_result = algo.aggregate(state, whole_ctx, RoundView(round=t, before=None, after=after,
                                                                     all_after=after))
    shards = [torch.arange(0, 3), torch.arange(3, n)]
    parts = []
    for ids in shards:   # each process's share of the all-reduce, then the sum of both
        got: list = []
        algo.aggregate(state, make_ctx(n, ids, seed, all_reduce=lambda x: got.append(x.clone()) or x),
                       RoundView(round=t, before=None, after=after[ids], all_after=after))
        parts.append(got[0])
    total = parts[0] + parts[1]
    for ids in shards:
        new, result = algo.aggregate(state, make_ctx(n, ids, seed, all_reduce=lambda x: total.clone()),
                                     RoundView(round=t, before=None, after=after[ids], all_after=after))
        assert torch.equal(new.w, whole.w) and torch.equal(result.models, whole_result.models[ids])


def test_graphs_and_offline_clients():
    n, seed, t = 10, 5, 2
    gen = torch.Generator().manual_seed(14)
    ids = torch.arange(n)
    net = Network(NetworkConfig(graph="regular", degree=4), n, seed)
    online = torch.arange(n) % 4 != 1
    cfg = CoboConfig(rho=0.05, gamma=0.5, pairs=0.9)
    ctx = make_ctx(n, ids, seed, reach=lambda r: net.reach(r, ids, "cpu"), graph=net.graph,
                   online=lambda r: online, delivery=lambda r: Delivery(seed, r, online, 0.0, ids))
    algo = Cobo(TrainConfig(lr=0.5, batch_size=3), cfg)
    after = torch.randn(n, P, generator=gen)
    state, result = algo.aggregate(algo.init(ctx), ctx, RoundView(round=t, before=None, after=after,
                                                                  all_after=after))
    graph = net.graph(t).rows(ids)
    allowed = graph & online[:, None] & online[None, :]
    want_models, want_w = plain_round(torch.ones(n, n), after, t, seed, cfg, 0.5 * 0.99, 3, allowed, allowed)
    assert torch.equal(result.lists, allowed) and torch.allclose(result.models, want_models, atol=1e-5)
    assert torch.allclose(state.w, want_w, atol=1e-5)
    for i in torch.nonzero(~online).flatten().tolist():
        assert torch.equal(result.models[i], after[i]) and bool((state.w[i] == 1).all())


def test_keys_are_read_with_their_defaults():
    algo = Cobo.from_config(load_config(None, ["algorithm.name=cobo", "data.name=synthetic", "clients=8"]))
    assert algo.cobo == CoboConfig(rho=0.01, gamma=0.01, consensus_lr=0.0, pairs=0.0, switch=800, batch_size=0)


@pytest.mark.parametrize("key,value", [("cobo.rho", "-1"), ("cobo.rho", "2"), ("cobo.gamma", "0"),
                                       ("cobo.consensus_lr", "-0.1"), ("cobo.pairs", "1.5"), ("cobo.switch", "-1"),
                                       ("cobo.batch_size", "-1")])
def test_bad_keys_are_refused_naming_the_field(key, value):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=cobo", "data.name=synthetic", "clients=8", f"{key}={value}"])
    assert e.value.field == key and e.value.fix
