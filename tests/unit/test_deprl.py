"""DePRL (fedclust/algorithms/deprl.py) against its rule written plainly:
the head trained with the body frozen, then the body with the head frozen
(the round's phases), the body averaged over the client and its graph
neighbours (a fresh random regular graph each round on the complete graph,
the given graph otherwise), the head kept, its keys, and the final all-reduce
of the bodies (the plain mean by hand, on one and two in-process ranks)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import networkx as nx
import pytest
import torch

from fedclust.algorithms import registry
from fedclust.algorithms.base import Context, RoundView
from fedclust.config import load_config, run_facts
from fedclust.errors import ConfigError
from fedclust.network import Delivery, Network, graph_seed
from fedclust.peers import as_mask
from fedclust.schema import NetworkConfig

BASE = ["algorithm.name=deprl", "data.name=synthetic", "model=mlp", "clients=10"]


def build(extra=()):
    cfg = load_config(None, BASE + list(extra))
    return cfg, registry.build(cfg, run_facts(cfg))


def ctx(n, ids, P, graph=lambda t: None, seed=3):
    return Context(n=n, client_ids=ids, clusters=None, seed=seed, stage1_rounds=1, w0=torch.zeros(P),
                   device=torch.device("cpu"), graph=graph)


def rows_of(choice) -> list[set]:
    return [set(r.nonzero().flatten().tolist()) for r in as_mask(choice)]


def test_plan_trains_the_head_then_the_body():
    _, algo = build(["deprl.head_epochs=2"])
    _, plan = algo.plan(None, None, 1, torch.zeros(3, 5))
    assert plan.phases == ((2, ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")), (1, ("fc3.weight", "fc3.bias")))


def test_on_the_complete_graph_the_neighbours_are_a_fresh_regular_graph_each_round():
    n, seed = 10, 3
    _, algo = build()
    P = algo.head_columns[-1][1]
    rounds = []
    for t in (1, 2):
        view = RoundView(round=t, before=None, after=torch.zeros(n, P), all_after=torch.zeros(n, P))
        got = rows_of(algo.select(None, ctx(n, torch.arange(n), P, seed=seed), view)[1])
        want = nx.random_regular_graph(4, n, seed=graph_seed(seed, t, 0, "deprl"))
        assert got == [set(want.neighbors(i)) for i in range(n)]
        shard = rows_of(algo.select(None, ctx(n, torch.arange(4, 10), P, seed=seed), view)[1])
        assert shard == got[4:]
        rounds.append(got)
    assert rounds[0] != rounds[1]


def test_a_round_averages_the_body_over_the_graph_and_keeps_each_head():
    n, seed, t = 10, 3, 2
    cfg, algo = build(["network.graph=regular", "network.degree=3"])
    net = Network(NetworkConfig(graph="regular", degree=3), n, seed)
    P = algo.head_columns[-1][1]
    head = torch.zeros(P, dtype=torch.bool)
    for a, b in algo.head_columns:
        head[a:b] = True
    after = torch.randn(n, P, generator=torch.Generator().manual_seed(0))
    c = ctx(n, torch.arange(n), P, graph=net.graph, seed=seed)
    _, result = algo.aggregate(None, c, RoundView(round=t, before=None, after=after, all_after=after))
    g = net.graph(t)
    for i in range(n):
        peers = [i, *sorted(g.idx[i][g.valid[i]].tolist())]
        assert len(peers) == 4
        assert torch.allclose(result.models[i, ~head], after[peers][:, ~head].mean(0), atol=1e-6)
        assert torch.equal(result.models[i, head], after[i, head])
    assert result.assignment is None


@pytest.mark.parametrize("extra,field", [
    (["deprl.head=[fc1,fc2,fc3]"], "deprl.head"), (["deprl.head=[conv9]"], "deprl.head"),
    (["model=logreg"], "deprl.head"), (["deprl.head_epochs=0"], "deprl.head_epochs"),
    (["clients=9", "deprl.degree=3"], "deprl.degree"), (["deprl.degree=10"], "deprl.degree"),
])
def test_bad_keys_are_refused_naming_the_field(extra, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, BASE + extra)
    assert e.value.field == field


def on_ranks(n, bounds, call):
    """``call(ids, all_reduce)`` on each in-process rank's clients (``bounds``: each rank's first), in threads whose
    ``all_reduce`` sums every rank's tensor in rank order at a barrier; the results in rank order."""
    barrier, slots, edges = threading.Barrier(len(bounds)), [None] * len(bounds), [*bounds, n]

    def reducer(rank):
        def reduce(x):
            slots[rank] = x.clone()
            barrier.wait()
            total = slots[0].clone()
            for other in slots[1:]:
                total += other
            barrier.wait()
            return x.copy_(total)
        return reduce

    with ThreadPoolExecutor(len(bounds)) as pool:
        jobs = [pool.submit(call, torch.arange(edges[r], edges[r + 1]), reducer(r)) for r in range(len(bounds))]
        return [j.result() for j in jobs]


@pytest.mark.parametrize("offline", [False, True])
def test_the_final_all_reduce_is_the_plain_mean_of_the_bodies_on_one_and_two_ranks(offline):
    n, seed, t = 10, 3, 4
    _, plain = build(["network.graph=regular", "network.degree=3", "rounds=4"])
    _, final = build(["network.graph=regular", "network.degree=3", "rounds=4", "deprl.final_allreduce=true"])
    assert final.rounds == 4
    net = Network(NetworkConfig(graph="regular", degree=3), n, seed)
    P = final.head_columns[-1][1]
    head = torch.zeros(P, dtype=torch.bool)
    for a, b in final.head_columns:
        head[a:b] = True
    after = torch.randn(n, P, generator=torch.Generator().manual_seed(0))
    online = torch.arange(n) % 3 != 2 if offline else torch.ones(n, dtype=torch.bool)

    def call(algo, ids, all_reduce):
        c = ctx(n, ids, P, graph=net.graph, seed=seed)
        c.all_reduce, c.online = all_reduce, (lambda r: online) if offline else (lambda r: None)
        if offline:
            c.delivery = lambda r: Delivery(seed, r, online, 0.0, ids)
        lo, hi = int(ids[0]), int(ids[-1]) + 1
        return algo.aggregate(None, c, RoundView(round=t, before=None, after=after[lo:hi], all_after=after))[1]

    (gossip,) = on_ranks(n, [0], lambda ids, red: call(plain, ids, red))
    (result,) = on_ranks(n, [0], lambda ids, red: call(final, ids, red))
    mean = gossip.models[online][:, ~head].mean(0)   # the bodies after the last round's gossip, by hand
    for i in range(n):
        if online[i]:
            assert torch.allclose(result.models[i, ~head], mean, atol=1e-6)
            assert torch.equal(result.models[i, head], after[i, head])   # the head as trained
        else:
            assert torch.equal(result.models[i], gossip.models[i])
    assert torch.equal(result.received, gossip.received + torch.where(online, int(online.sum()) - 1, 0))
    two = on_ranks(n, [0, 4], lambda ids, red: call(final, ids, red))
    assert torch.equal(torch.cat([r.models for r in two]), result.models)
    _, early = build(["network.graph=regular", "network.degree=3", "rounds=5", "deprl.final_allreduce=true"])
    (before_last,) = on_ranks(n, [0], lambda ids, red: call(early, ids, red))
    assert torch.equal(before_last.models, gossip.models)


def test_the_final_all_reduce_key_refuses_a_non_boolean():
    with pytest.raises(ConfigError) as e:
        load_config(None, BASE + ["deprl.final_allreduce=maybe"])
    assert e.value.field == "deprl.final_allreduce" and e.value.fix
