"""DePRL (fedclust/algorithms/deprl.py) against its rule written plainly:
the head trained with the body frozen, then the body with the head frozen
(the round's phases), the body averaged over the client and its graph
neighbours (a fresh random regular graph each round on the complete graph,
the given graph otherwise), the head kept, and its keys."""

from __future__ import annotations

import networkx as nx
import pytest
import torch

from fedclust.algorithms import registry
from fedclust.algorithms.base import Context, RoundView
from fedclust.config import load_config, run_facts
from fedclust.errors import ConfigError
from fedclust.network import Network, graph_seed
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
