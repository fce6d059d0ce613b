"""Facade (fedclust/algorithms/facade.py) against its rule written plainly
per client: the head of lowest training loss (exact ties by key), the core
averaged over the round's graph, each head the mean of itself and the
neighbours' copies of that index, the warm-up of whole models, offline
clients, its lists and clusters, and its keys."""

from __future__ import annotations

import pytest
import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.facade import Facade, FacadeConfig, FacadeState, choose_heads
from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.network import Delivery, Network
from fedclust.peers import as_mask
from fedclust.schema import NetworkConfig

P, HEAD = 8, ((5, 8),)   # core: columns 0-4, head: 5-7


def rows_of(choice) -> list[set]:
    return [set(r.nonzero().flatten().tolist()) for r in as_mask(choice)]


def make_ctx(n, ids, net, seed=3, pair_loss=None, delivery=lambda t: None):
    return Context(n=n, client_ids=ids, clusters=None, seed=seed, stage1_rounds=1, w0=torch.zeros(P),
                   device=torch.device("cpu"), graph=net.graph, pair_loss=pair_loss, delivery=delivery)


def test_the_lowest_loss_head_is_chosen_and_exact_ties_go_by_key():
    losses = torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.3], [0.1, 0.1, 0.4]])
    ids = torch.tensor([4, 5, 6])
    got = choose_heads(losses, 7, 3, ids).tolist()
    assert got[0] == 1
    keys = [[float(rng.uniform(7, 3, "facade_tie", torch.tensor(i), torch.tensor(j))) for j in range(3)]
            for i in (5, 6)]
    assert got[1] == min(range(3), key=lambda j: keys[0][j])
    assert got[2] == min(range(2), key=lambda j: keys[1][j])
    many = choose_heads(torch.zeros(400, 2), 1, 1, torch.arange(400))
    assert 150 < int(many.sum()) < 250   # copies: either head, about half each


def plain_round(algo, state, after, labels, graph, t):
    """Step 3 for every client, written per client from the module's rule."""
    n = after.shape[0]
    core = torch.ones(P, dtype=torch.bool)
    core[5:8] = False
    models, heads = torch.empty(n, P), state.heads.clone()
    for i in range(n):
        nb = graph.idx[i][graph.valid[i]].tolist()
        models[i, core] = after[[i, *nb]][:, core].mean(0)
        own = state.heads[i].clone()
        own[labels[i]] = after[i, ~core]
        for j in range(own.shape[0]):
            sent = [after[m, ~core] for m in nb if labels[m] == j]
            heads[i, j] = (own[j] + sum(sent)) / (1 + len(sent)) if sent else own[j]
        models[i, ~core] = heads[i, labels[i]]
    return models, heads


def test_a_round_after_the_warm_up_matches_the_plain_rule():
    n, seed, t, k = 10, 3, 5, 3
    net = Network(NetworkConfig(graph="regular", degree=3), n, seed)
    algo = Facade(HEAD, FacadeConfig(heads=k, warmup=2))
    gen = torch.Generator().manual_seed(0)
    state = FacadeState(heads=torch.randn(n, k, 3, generator=gen), choice=torch.zeros(n, dtype=torch.int64))
    after = torch.randn(n, P, generator=gen)
    labels = torch.randint(0, k, (n,), generator=gen)
    view = RoundView(round=t, before=None, after=after, all_after=after, all_labels=labels)
    new, result = algo.aggregate(state, make_ctx(n, torch.arange(n), net, seed), view)
    models, heads = plain_round(algo, state, after, labels, net.graph(t), t)
    assert torch.allclose(result.models, models, atol=1e-6) and torch.allclose(new.heads, heads, atol=1e-6)
    g = net.graph(t)
    assert rows_of(result.averaged) == [set(g.idx[i][g.valid[i]].tolist()) for i in range(n)]
    assert rows_of(result.lists) == [{m for m in g.idx[i][g.valid[i]].tolist() if labels[m] == labels[i]}
                                     for i in range(n)]
    assert torch.equal(result.assignment, labels) and torch.equal(new.choice, labels)
    # two processes: each its own clients, the same rows
    part, res = algo.aggregate(FacadeState(heads=state.heads[6:], choice=state.choice[6:]),
                               make_ctx(n, torch.arange(6, n), net, seed),
                               RoundView(round=t, before=None, after=after[6:], all_after=after, all_labels=labels))
    assert torch.equal(res.models, result.models[6:]) and torch.equal(part.heads, new.heads[6:])


def test_the_warm_up_averages_whole_models_and_copies_the_head():
    n, seed = 8, 3
    net = Network(NetworkConfig(graph="ring"), n, seed)
    algo = Facade(HEAD, FacadeConfig(heads=2, warmup=3))
    state = algo.init(make_ctx(n, torch.arange(n), net, seed))
    after = torch.randn(n, P, generator=torch.Generator().manual_seed(1))
    _, plan = algo.plan(state, make_ctx(n, torch.arange(n), net, seed), 2, after)
    assert torch.equal(plan.labels, torch.zeros(n, dtype=torch.int64)) and plan.start is after
    view = RoundView(round=2, before=None, after=after, all_after=after, all_labels=plan.labels)
    new, result = algo.aggregate(state, make_ctx(n, torch.arange(n), net, seed), view)
    for i in range(n):
        assert torch.allclose(result.models[i], after[[i, (i - 1) % n, (i + 1) % n]].mean(0), atol=1e-6)
        assert torch.equal(new.heads[i, 0], result.models[i, 5:]) and torch.equal(new.heads[i, 1], result.models[i, 5:])


def test_plan_trains_the_core_with_the_head_of_lowest_loss():
    n, seed, k = 6, 3, 3
    net = Network(NetworkConfig(graph="ring"), n, seed)
    targets = torch.randn(n, 3, generator=torch.Generator().manual_seed(2))
    loss = lambda models, owner: (models[:, 5:] - targets[owner]).pow(2).mean(1)   # noqa: E731
    algo = Facade(HEAD, FacadeConfig(heads=k, warmup=0))
    state = FacadeState(heads=torch.randn(n, k, 3, generator=torch.Generator().manual_seed(3)),
                        choice=torch.zeros(n, dtype=torch.int64))
    models = torch.randn(n, P, generator=torch.Generator().manual_seed(4))
    _, plan = algo.plan(state, make_ctx(n, torch.arange(n), net, seed, pair_loss=loss), 1, models)
    for i in range(n):
        want = min(range(k), key=lambda j: float((state.heads[i, j] - targets[i]).pow(2).mean()))
        assert int(plan.labels[i]) == want
        assert torch.equal(plan.start[i, :5], models[i, :5]) and torch.equal(plan.start[i, 5:], state.heads[i, want])


def test_an_offline_client_keeps_its_heads_and_choice():
    n, seed, t, k = 10, 3, 4, 2
    net = Network(NetworkConfig(graph="regular", degree=3), n, seed)
    online = torch.arange(n) % 4 != 0
    algo = Facade(HEAD, FacadeConfig(heads=k, warmup=0))
    gen = torch.Generator().manual_seed(5)
    state = FacadeState(heads=torch.randn(n, k, 3, generator=gen), choice=torch.ones(n, dtype=torch.int64))
    after = torch.randn(n, P, generator=gen)
    labels = torch.zeros(n, dtype=torch.int64)
    view = RoundView(round=t, before=None, after=after, all_after=after, all_labels=labels)
    c = make_ctx(n, torch.arange(n), net, seed, delivery=lambda r: Delivery(seed, r, online, 0.0, torch.arange(n)))
    new, result = algo.aggregate(state, c, view)
    for i in range(n):
        if not online[i]:
            assert torch.equal(new.heads[i], state.heads[i]) and int(new.choice[i]) == 1
            assert not as_mask(result.averaged)[i].any()
        else:
            assert not (as_mask(result.averaged)[i] & ~online).any()


@pytest.mark.parametrize("extra,field", [
    (["facade.head=[fc1,fc2,fc3]"], "facade.head"), (["model=logreg"], "facade.head"),
    (["facade.heads=0"], "facade.heads"), (["facade.warmup=-1"], "facade.warmup"),
    (["clients=9", "facade.degree=3"], "facade.degree"),
])
def test_bad_keys_are_refused_naming_the_field(extra, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=facade", "data.name=synthetic", "model=mlp", "clients=10"] + extra)
    assert e.value.field == field
