"""Facade (fedclust/algorithms/facade.py) against its rule written plainly
per client: the head of lowest training loss (exact ties by key), the core
averaged over the round's graph, each head the mean of itself and the
neighbours' copies of that index, the warm-up of whole models, offline
clients, its lists and clusters, and its keys; the reference's end (the
final all-reduce, on one and two in-process ranks) and its reported head
(the one of lowest test loss)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

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


# ---------------------------------------------------------------- the reference's end: all-reduce, reported head


class Ranks:
    """``world`` in-process ranks whose ``all_reduce`` sums every rank's tensor in rank order (threads meeting at a
    barrier): the collective ``ctx.all_reduce`` stands for, without processes."""

    def __init__(self, world):
        self.barrier, self.slots = threading.Barrier(world), [None] * world

    def all_reduce(self, rank):
        def reduce(x):
            self.slots[rank] = x.clone()
            self.barrier.wait()
            total = self.slots[0].clone()
            for other in self.slots[1:]:
                total += other
            self.barrier.wait()
            return x.copy_(total)
        return reduce


def on_ranks(n, bounds, call):
    """``call(rank, ids, all_reduce)`` on each rank's clients ``ids`` (``bounds``: each rank's first client), in
    threads; the results in rank order."""
    ranks = Ranks(len(bounds))
    edges = [*bounds, n]
    with ThreadPoolExecutor(len(bounds)) as pool:
        jobs = [pool.submit(call, r, torch.arange(edges[r], edges[r + 1]), ranks.all_reduce(r))
                for r in range(len(bounds))]
        return [j.result() for j in jobs]


def plain_final(models, heads, labels, members):
    """The final all-reduce written per client: a member's core the members' mean; its head j the mean of its own
    copy and the copies of index j the other members sent (their heads of their own index)."""
    core = torch.ones(P, dtype=torch.bool)
    core[5:8] = False
    models, heads = models.clone(), heads.clone()
    old = heads.clone()
    inside = [m for m in range(len(models)) if members[m]]
    mean_core = models[inside][:, core].mean(0)
    for i in inside:
        models[i, core] = mean_core
        for j in range(heads.shape[1]):
            sent = [old[m, labels[m]] for m in inside if m != i and labels[m] == j]
            heads[i, j] = (old[i, j] + sum(sent)) / (1 + len(sent)) if sent else old[i, j]
        models[i, ~core] = heads[i, labels[i]]
    return models, heads


@pytest.mark.parametrize("offline", [False, True])
def test_the_final_all_reduce_matches_the_plain_rule_on_one_and_two_ranks(offline):
    n, seed, t, k = 10, 3, 5, 3
    net = Network(NetworkConfig(graph="regular", degree=3), n, seed)
    online = torch.arange(n) % 4 != 1 if offline else torch.ones(n, dtype=torch.bool)
    gen = torch.Generator().manual_seed(0)
    state = FacadeState(heads=torch.randn(n, k, 3, generator=gen), choice=torch.zeros(n, dtype=torch.int64))
    after = torch.randn(n, P, generator=gen)
    labels = torch.randint(0, k, (n,), generator=gen)
    plain_algo = Facade(HEAD, FacadeConfig(heads=k, warmup=2), rounds=t)
    final_algo = Facade(HEAD, FacadeConfig(heads=k, warmup=2, final_allreduce=True), rounds=t)

    def call(algo, ids, all_reduce):
        c = make_ctx(n, ids, net, seed,
                     delivery=(lambda r: Delivery(seed, r, online, 0.0, ids)) if offline else (lambda r: None))
        c.all_reduce = all_reduce
        c.online = (lambda r: online) if offline else (lambda r: None)
        lo, hi = int(ids[0]), int(ids[-1]) + 1
        view = RoundView(round=t, before=None, after=after[lo:hi], all_after=after, all_labels=labels)
        return algo.aggregate(FacadeState(heads=state.heads[lo:hi], choice=state.choice[lo:hi]), c, view)

    (round_state, round_result), = on_ranks(n, [0], lambda r, ids, red: call(plain_algo, ids, red))
    (new, result), = on_ranks(n, [0], lambda r, ids, red: call(final_algo, ids, red))
    models, heads = plain_final(round_result.models, round_state.heads, round_state.choice, online)
    assert torch.allclose(result.models, models, atol=1e-6) and torch.allclose(new.heads, heads, atol=1e-6)
    assert torch.equal(new.choice, round_state.choice)
    assert torch.equal(result.received, round_result.received + torch.where(online, int(online.sum()) - 1, 0))
    if offline:   # an offline client takes no part: as the round left it
        assert torch.equal(result.models[~online], round_result.models[~online])
        assert torch.equal(new.heads[~online], round_state.heads[~online])
    two = on_ranks(n, [0, 6], lambda r, ids, red: call(final_algo, ids, red))   # the same bits on two ranks
    assert torch.equal(torch.cat([two[0][1].models, two[1][1].models]), result.models)
    assert torch.equal(torch.cat([two[0][0].heads, two[1][0].heads]), new.heads)
    # before the last round, the option changes nothing
    early = Facade(HEAD, FacadeConfig(heads=k, warmup=2, final_allreduce=True), rounds=t + 1)
    (s2, r2), = on_ranks(n, [0], lambda r, ids, red: call(early, ids, red))
    assert torch.equal(r2.models, round_result.models) and torch.equal(s2.heads, round_state.heads)


def test_the_final_all_reduce_in_the_warm_up_averages_whole_models():
    n, seed, t = 8, 3, 2
    net = Network(NetworkConfig(graph="ring"), n, seed)
    algo = Facade(HEAD, FacadeConfig(heads=2, warmup=3, final_allreduce=True), rounds=t)
    c = make_ctx(n, torch.arange(n), net, seed)
    state = algo.init(c)
    after = torch.randn(n, P, generator=torch.Generator().manual_seed(1))
    view = RoundView(round=t, before=None, after=after, all_after=after, all_labels=torch.zeros(n, dtype=torch.int64))
    new, result = algo.aggregate(state, c, view)
    ring = torch.stack([after[[i, (i - 1) % n, (i + 1) % n]].mean(0) for i in range(n)])
    for i in range(n):
        assert torch.allclose(result.models[i], ring.mean(0), atol=1e-6)
        assert torch.equal(new.heads[i, 0], result.models[i, 5:]) and torch.equal(new.heads[i, 1], result.models[i, 5:])


def test_the_reported_head_is_the_one_of_lowest_test_loss():
    n, k = 6, 3
    gen = torch.Generator().manual_seed(7)
    targets = torch.randn(n, 3, generator=gen)
    heads = torch.randn(n, k, 3, generator=gen)
    heads[0, 2] = heads[0, 1]   # a tie: the first of them, as the reference's list.index(min)
    targets[0] = heads[0, 1]
    data = SimpleNamespace(test_x=None, test_y=None, test_counts=None)

    def score(models, x, y, counts=None):
        loss = (models[:, 5:] - targets).pow(2).mean(1)
        return torch.zeros(len(models)), loss

    held = torch.randn(n, P, generator=gen)
    state = FacadeState(heads=heads, choice=torch.zeros(n, dtype=torch.int64))
    current = Facade(HEAD, FacadeConfig(heads=k))
    assert current.report_models(state, None, data, held, score) is held   # the default: the held models
    lowest = Facade(HEAD, FacadeConfig(heads=k, report_head="lowest_test_loss"))
    got = lowest.report_models(state, None, data, held, score)
    for i in range(n):
        want = min(range(k), key=lambda j: (float((heads[i, j] - targets[i]).pow(2).mean()), j))
        assert torch.equal(got[i, :5], held[i, :5]) and torch.equal(got[i, 5:], heads[i, want])
    assert torch.equal(got[0, 5:], heads[0, 1])


@pytest.mark.parametrize("extra,field", [
    (["facade.report_head=best"], "facade.report_head"),
    (["facade.report_head=lowest_test_loss", "data.validation=0.2"], "facade.report_head"),
    (["facade.final_allreduce=maybe"], "facade.final_allreduce"),
])
def test_the_reference_end_keys_refuse_bad_values(extra, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=facade", "data.name=synthetic", "model=mlp", "clients=10"] + extra)
    assert e.value.field == field and e.value.fix
