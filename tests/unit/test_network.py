"""Communication graphs (config ``network``, fedclust.network): the graphs
networkx draws from (seed, epoch), a graph file and what is refused in it,
every peer method receiving only from the round's graph neighbours, its draws
those of the plain rule restricted to them, the checks of the keys, and runs
on a graph identical on 1 and 2 processes and after a kill and resume.  The
complete graph changes nothing (tests/integration/test_golden_runs.py)."""

from __future__ import annotations

import dataclasses

import networkx as nx
import pytest
import torch

from fedclust import rng
from fedclust.algorithms import registry
from fedclust.algorithms.base import Context, RoundView
from fedclust.config import load_config, run_facts
from fedclust.errors import ConfigError
from fedclust.network import Graph, Network, Reach, both, edge_array, make_graph, read_edge_list, within
from fedclust.peers import PeerIndex, as_mask
from fedclust.schema import NetworkConfig

PEER_METHODS = ("random", "oracle", "fixtopology", "pens", "panm_loss", "panm_grad")


def net(**kw) -> NetworkConfig:
    return dataclasses.replace(NetworkConfig(), **kw)


def adjacency(g: Graph) -> set[tuple[int, int]]:
    return {(int(i), int(j)) for i, j in edge_array(g)}


@pytest.mark.parametrize("spec,degree", [(net(graph="ring"), 2), (net(graph="regular", degree=4), 4),
                                         (net(graph="regular", degree=7), 7)])
def test_ring_and_regular_graphs_give_every_client_its_degree(spec, degree):
    g = make_graph(spec, 20, seed=1, epoch=0)
    assert g.degrees().tolist() == [degree] * 20
    nxg = nx.Graph(list(map(tuple, edge_array(g))))
    assert nx.is_connected(nxg) and nxg.number_of_nodes() == 20


def test_graphs_are_drawn_from_seed_and_epoch_alone():
    a, b = make_graph(net(graph="regular", degree=4), 30, 5, 0), make_graph(net(graph="regular", degree=4), 30, 5, 0)
    assert torch.equal(a.idx, b.idx) and torch.equal(a.valid, b.valid)
    assert adjacency(a) != adjacency(make_graph(net(graph="regular", degree=4), 30, 5, 1))   # another epoch
    assert adjacency(a) != adjacency(make_graph(net(graph="regular", degree=4), 30, 6, 0))   # another seed
    sw = make_graph(net(graph="small_world", degree=4, rewire=0.2), 40, 5, 0)
    assert sw.degrees().double().mean() == 4.0 and nx.is_connected(nx.Graph(list(map(tuple, edge_array(sw)))))
    er = make_graph(net(graph="erdos_renyi", p_edge=0.3), 30, 5, 0)
    assert nx.is_connected(nx.Graph(list(map(tuple, edge_array(er)))))
    with pytest.raises(ConfigError, match="network.p_edge"):   # never connected: refused, naming the key
        make_graph(net(graph="erdos_renyi", p_edge=0.001), 30, 5, 0)


def test_a_network_redraws_every_T_rounds_and_keeps_its_graph_between():
    network = Network(net(graph="regular", degree=4, redraw_every=3), 24, 9)
    graphs = [adjacency(network.graph(t)) for t in range(1, 8)]
    assert graphs[0] == graphs[1] == graphs[2] != graphs[3]
    assert graphs[3] == graphs[4] == graphs[5] != graphs[6]
    assert Network(net(), 24, 9).graph(5) is None and Network(net(), 24, 9).reach(5, torch.arange(3), "cpu") is None


def test_rows_are_the_graph_s_neighbours():
    g = make_graph(net(graph="regular", degree=3), 10, 2, 0)
    nxg = nx.Graph(list(map(tuple, edge_array(g))))
    rows = g.rows(torch.tensor([7, 2, 5]))
    for r, i in enumerate((7, 2, 5)):
        assert set(rows[r].nonzero().flatten().tolist()) == set(nxg.neighbors(i))


def test_a_graph_file_is_read_and_what_is_wrong_in_it_is_named(tmp_path):
    good = tmp_path / "g.txt"
    good.write_text("0 1\n1 2\n2 3\n3 0\n# a comment\n")
    g = read_edge_list(good, 4)
    assert sorted(g.edges) == [(0, 1), (0, 3), (1, 2), (2, 3)]
    spec = net(graph="file", path=str(good))
    assert adjacency(make_graph(spec, 4, 0, 0)) == {(0, 1), (0, 3), (1, 2), (2, 3)}
    cases = {"0 1\n2 3\n": "not connected", "0 1\n1 1\n": "self-loop on client 1", "0 1\n1 9\n": "names client 9",
             "0 1\n1 x\n": "cannot be read"}
    for text, why in cases.items():
        bad = tmp_path / "bad.txt"
        bad.write_text(text)
        with pytest.raises(ConfigError) as e:
            read_edge_list(bad, 4)
        assert e.value.field == "network.path" and why in str(e.value), (text, str(e.value))
    with pytest.raises(ConfigError, match="not connected.*client 4 has no edge"):   # a client the file never names
        read_edge_list(good, 5)


def test_an_edge_list_is_read_as_the_user_meant_it(tmp_path, capsys):
    """Undirected, said once when edges are listed one way; a weight column, commas and a file with no edge are
    refused naming the first line that could not be read (issue 44, part 4)."""
    one_way = tmp_path / "one_way.txt"
    one_way.write_text("0 1\n1 2\n2 3\n")
    told = []
    g = read_edge_list(one_way, 4, say=told.append)
    assert sorted(g.edges) == [(0, 1), (1, 2), (2, 3)] and len(told) == 1
    assert "3 of its 3 edges are listed in one direction only" in told[0] and "used both ways" in told[0]
    both_ways = tmp_path / "both.txt"
    both_ways.write_text("0 1\n1 0\n1 2\n2 1\n2 3\n3 2\n")
    told.clear()
    assert sorted(read_edge_list(both_ways, 4, say=told.append).edges) == [(0, 1), (1, 2), (2, 3)] and told == []
    cases = {"0 1 0.5\n1 2 0.5\n2 3 1\n": "line 1 ('0 1 0.5') has a third column",
             "0,1\n1,2\n2,3\n": "line 1 ('0,1') is not two client ids (comma-separated",
             "": "holds no edge (it is empty)", "# only a note\n\n": "holds no edge (only comments and blank lines)",
             "0 1\n1 x\n": "line 2 ('1 x') is not two client ids"}
    for text, why in cases.items():
        bad = tmp_path / "bad.txt"
        bad.write_text(text)
        with pytest.raises(ConfigError) as e:
            read_edge_list(bad, 4)
        assert e.value.field == "network.path" and why in str(e.value), (text, str(e.value))
    # the config check says it once, from the process that writes the run
    load_config(None, ["clients=4", "data.name=synthetic", "algorithm.name=random", "algorithm.k=1",
                       "network.graph=file", f"network.path={one_way}"])
    assert capsys.readouterr().err.count("listed in one direction only") == 1


def test_within_keeps_a_choice_to_the_graph_as_a_plain_intersection():
    g = make_graph(net(graph="regular", degree=4), 16, 3, 0)
    ids = torch.arange(4, 12)
    reach = Reach(g, ids, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(8, 16, generator=gen) < 0.5
    mask[torch.arange(8), ids] = False
    want = mask & g.rows(ids)
    assert torch.equal(within(mask, reach), want)
    got = within(PeerIndex.from_mask(mask), reach)
    assert torch.equal(as_mask(got), want) and torch.equal(got.counts(), want.sum(1))
    assert got.idx.shape[1] == int(want.sum(1).max())   # padded to the longest kept row
    assert within(mask, None) is mask
    allowed = both(lambda lo, hi: ~mask[lo:hi], reach)
    assert torch.equal(allowed(2, 6), ~mask[2:6] & g.rows(ids[2:6]))
    assert both(mask, None) is mask


def test_random_draws_the_plain_rule_among_the_graph_neighbours():
    """k lowest keys among the client's neighbours (the rule written per client, keys from fedclust.rng)."""
    n, k, t = 20, 3, 4
    g = make_graph(net(graph="regular", degree=5), n, 1, 0)
    ids = torch.arange(n)
    algo = registry.get("random")(k=k)
    ctx = _ctx(n, ids, reach=lambda r: Reach(g, ids, torch.device("cpu")))
    _, choice = algo.select(None, ctx, _view(t, n))
    keys = rng.client_keys(ctx.seed, t, "neighbors", ids, n)
    for i in range(n):
        nbrs = g.rows(torch.tensor([i]))[0].nonzero().flatten().tolist()
        want = sorted(sorted(nbrs, key=lambda j: float(keys[i, j]))[:k])
        assert as_mask(choice)[i].nonzero().flatten().tolist() == want


def _ctx(n, ids, reach=lambda t: None, seed=3):
    return Context(n=n, client_ids=ids, clusters=torch.arange(n) % 2, seed=seed, stage1_rounds=3,
                   w0=torch.zeros(6), device=torch.device("cpu"), pair_loss=lambda m, o: m.pow(2).mean(1),
                   pool_loss=lambda m, p: m[p].pow(2).mean(-1), reach=reach)


def _view(t, n, gen=None):
    gen = gen or torch.Generator().manual_seed(t)
    before = torch.randn(n, 6, generator=gen)
    after = before + 0.1 * torch.randn(n, 6, generator=gen)
    return RoundView(round=t, before=before, after=after, all_after=after, all_before=before)


@pytest.mark.parametrize("name", PEER_METHODS)
def test_every_peer_method_receives_only_from_the_round_s_graph_neighbours(name):
    n = 16
    cfg = load_config(None, ["data.name=synthetic", f"clients={n}", "algorithm.k=3", "algorithm.l=4",
                             "stage1_rounds=3", "rounds=8", f"algorithm.name={name}"])
    algo = registry.build(cfg, run_facts(cfg))
    network = Network(net(graph="regular", degree=4, redraw_every=2), n, 3)
    for ids in (torch.arange(n), torch.arange(5, 11)):   # all clients on one rank, or a rank's shard
        ctx = _ctx(n, ids, reach=lambda t, ids=ids: network.reach(t, ids, "cpu"))
        state, averaged_any = algo.init(ctx), False
        for t in range(1, 9):
            state, plan = algo.plan(state, ctx, t, _view(t, n).after[ids])
            view = _view(t, n)
            view.before, view.after = view.all_before[ids], view.all_after[ids]
            state, result = algo.aggregate(state, ctx, view)
            graph = network.graph(t).rows(ids)
            averaged = as_mask(result.averaged)
            assert not (averaged & ~graph).any(), (name, t)                 # only from this round's neighbours
            contacted = algo.contacted(state, t)
            if contacted is not None:                                      # and fetched only from them
                assert not (as_mask(contacted) & ~graph).any(), (name, t)
            assert (averaged.sum(1) <= 3).all()
            averaged_any |= bool(averaged.any())
        assert averaged_any, name   # the check saw real choices


@pytest.mark.parametrize("overrides,field,words", [
    (["algorithm.name=random", "network.graph=regular", "network.degree=2"], "network.degree", "raise network.degree"),
    (["algorithm.name=random", "algorithm.k=3", "network.graph=regular", "network.degree=3", "clients=9"],
     "network.degree", "must be even"),
    (["algorithm.name=random", "algorithm.k=2", "network.graph=small_world", "network.degree=3"], "network.degree",
     "even degree"),
    (["algorithm.name=random", "network.graph=erdos_renyi", "network.p_edge=0.01"], "network.p_edge",
     "raise network.p_edge"),
    (["algorithm.name=random", "network.graph=ring"], "algorithm.k", "algorithm.k=2"),
    (["algorithm.name=random", "network.graph=file"], "network.path", "network.path=FILE"),
    (["algorithm.name=fedavg", "network.graph=ring"], "network.graph", "peer-to-peer"),
    (["algorithm.name=ifca", "network.p_drop=0.2"], "network.p_drop", "between peers"),
    (["network.p_edge=0"], "network.p_edge", "(0, 1]"),
    (["network.graph=mesh"], "network.graph", "must be one of"),
])
def test_bad_network_keys_are_refused_naming_the_key_and_the_fix(overrides, field, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.name=synthetic", "clients=20", "algorithm.k=3"] + overrides)
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_complete_is_the_default_and_a_round_s_reach_then_is_none():
    cfg = load_config(None, ["data.name=synthetic"])
    assert cfg.network.graph == "complete"
    assert Network(cfg.network, 10, 0).reach(1, torch.arange(10), "cpu") is None


# ----------------------------------------------------------------------------
# Clients that go offline


def test_a_client_is_offline_with_p_offline_keyed_on_seed_round_and_client():
    network = Network(net(p_offline=0.3), 400, 7)
    rows = torch.stack([network.online(t) for t in range(1, 51)])
    assert abs(float((~rows).double().mean()) - 0.3) < 0.02            # about 30% offline
    assert torch.equal(rows[4], Network(net(p_offline=0.3), 400, 7).online(5))   # replicated: same everywhere
    assert not torch.equal(rows[4], rows[5])                             # anew each round
    assert Network(net(), 400, 7).online(3) is None                      # no faults asked: everyone


def test_an_availability_trace_is_read_by_round_and_its_faults_named(tmp_path):
    import numpy as np

    from fedclust.network import read_availability

    trace = np.array([[True, False, True], [False, True, True]])
    np.save(tmp_path / "on.npy", trace)
    network = Network(net(availability=str(tmp_path / "on.npy")), 3, 0)
    assert [network.online(t).tolist() for t in (1, 2, 3)] == [trace[0].tolist(), trace[1].tolist(),
                                                               trace[0].tolist()]   # rows cycle
    for bad, words in [(np.ones((2, 4), dtype=bool), "[rounds, clients = 3]"), (np.full((2, 3), 0.5), "float64"),
                       (np.ones(3, dtype=bool), "[rounds, clients = 3]")]:
        np.save(tmp_path / "bad.npy", bad)
        with pytest.raises(ConfigError) as e:
            read_availability(tmp_path / "bad.npy", 3)
        assert e.value.field == "network.availability" and words in str(e.value)
    with pytest.raises(ConfigError, match="cannot be read"):
        read_availability(tmp_path / "none.npy", 3)


def test_a_server_samples_its_participants_among_the_online():
    from fedclust.algorithms.aggregation import participants, trainers

    online = torch.tensor([True, False, True, True, False, True, True, False, True, True])
    assert torch.equal(participants(3, 4, 10, 1.0, online=online), online)
    part = participants(3, 4, 10, 0.5, online=online)
    assert not (part & ~online).any() and int(part.sum()) == 4           # ceil(0.5 x 7 online)
    keys = rng.uniform(3, 4, "participation", torch.arange(10), 0)        # the plain rule: lowest keys online
    want = sorted(sorted(online.nonzero().flatten().tolist(), key=lambda i: float(keys[i]))[:4])
    assert part.nonzero().flatten().tolist() == want
    assert not participants(3, 4, 10, 0.5, online=torch.zeros(10, dtype=torch.bool)).any()
    assert torch.equal(participants(3, 4, 10, 0.5), participants(3, 4, 10, 0.5, online=None))   # as before
    assert trainers(3, 4, 10, 1.0) is None and torch.equal(trainers(3, 4, 10, 1.0, online), online)


@pytest.mark.parametrize("name", PEER_METHODS)
def test_an_offline_client_neither_sends_nor_chooses_and_its_state_stays(name):
    n = 16
    cfg = load_config(None, ["data.name=synthetic", f"clients={n}", "algorithm.k=3", "algorithm.l=4",
                             "stage1_rounds=3", "rounds=8", f"algorithm.name={name}"])
    algo = registry.build(cfg, run_facts(cfg))
    network = Network(net(p_offline=0.3), n, 3)
    for ids in (torch.arange(n), torch.arange(5, 11)):
        ctx = _ctx(n, ids)
        ctx.online, ctx.delivery = network.online, (lambda t, ids=ids: network.delivery(t, ids))
        state = algo.init(ctx)
        for t in range(1, 9):
            online = network.online(t)
            state, plan = algo.plan(state, ctx, t, _view(t, n).after[ids])
            view = _view(t, n)
            view.before, view.after = view.all_before[ids], view.all_after[ids]
            old = algo.state_dict(state)["clients"]
            state, result = algo.aggregate(state, ctx, view)
            averaged = as_mask(result.averaged)
            assert not averaged[:, ~online].any(), (name, t)              # nothing from an offline client
            assert not averaged[~online[ids]].any(), (name, t)            # nothing for one
            contacted = algo.contacted(state, t)
            if contacted is not None:
                assert not as_mask(contacted)[:, ~online].any(), (name, t)   # an offline candidate did not answer
            new = algo.state_dict(state)["clients"]
            for field, rows in new.items():                               # an offline client's rows stay
                if rows is not None:
                    assert torch.equal(rows[~online[ids]], old[field][~online[ids]]), (name, t, field)


# ----------------------------------------------------------------------------
# Lost messages


def test_a_model_is_lost_keyed_on_seed_round_receiver_and_sender():
    network = Network(net(p_drop=0.25), 300, 4)
    ids = torch.arange(100, 200)
    d = network.delivery(6, ids)
    everyone = torch.ones(100, 300, dtype=torch.bool)
    arrived = d.answering(everyone)
    assert abs(float((~arrived).double().mean()) - 0.25) < 0.02
    want = rng.uniform(4, 6, "drop", ids[:, None], torch.arange(300)[None, :]) >= 0.25   # the rule, written plainly
    assert torch.equal(arrived, want)
    shard = Network(net(p_drop=0.25), 300, 4).delivery(6, ids[40:60])   # a rank holding other rows: the same
    assert torch.equal(shard.answering(everyone[40:60]), want[40:60])
    pick = PeerIndex.draw(4, 6, "neighbors", ids, 300, 5)
    kept = d.choice(pick)
    assert torch.equal(as_mask(kept), as_mask(pick) & want)           # index and mask forms agree
    assert Network(net(), 300, 4).delivery(6, ids) is None


@pytest.mark.parametrize("name", ["random", "panm_grad", "pens"])
def test_a_lost_model_is_neither_scored_nor_averaged(name):
    n = 16
    cfg = load_config(None, ["data.name=synthetic", f"clients={n}", "algorithm.k=3", "algorithm.l=4",
                             "stage1_rounds=3", "rounds=8", f"algorithm.name={name}"])
    algo = registry.build(cfg, run_facts(cfg))
    network = Network(net(p_drop=0.4), n, 3)
    ids = torch.arange(n)
    ctx = _ctx(n, ids)
    ctx.delivery = lambda t: network.delivery(t, ids)
    state = algo.init(ctx)
    for t in range(1, 9):
        state, _ = algo.plan(state, ctx, t, _view(t, n).after)
        state, result = algo.aggregate(state, ctx, _view(t, n))
        arrived = network.delivery(t, ids).answering(torch.ones(n, n, dtype=torch.bool))
        assert not (as_mask(result.averaged) & ~arrived).any(), (name, t)
        contacted = algo.contacted(state, t)
        if contacted is not None:
            assert not (as_mask(contacted) & ~arrived).any(), (name, t)


# ----------------------------------------------------------------------------
# Stragglers


def test_stragglers_are_keyed_on_seed_round_and_client():
    network = Network(net(stragglers=0.2), 500, 1)
    rows = torch.stack([network.stragglers(t) for t in range(1, 41)])
    assert abs(float(rows.double().mean()) - 0.2) < 0.02
    assert torch.equal(rows[0], rng.uniform(1, 1, "straggle", torch.arange(500), 0) < 0.2)
    assert Network(net(), 500, 1).stragglers(3) is None


# ----------------------------------------------------------------------------
# Attackers, and the honest and worst-cluster accuracies


def test_the_attackers_are_the_lowest_keys_fixed_for_the_run():
    from fedclust.attack import attackers

    bad = attackers(5, 40, 0.2)
    keys = rng.uniform(5, 0, "attackers", torch.arange(40), 0)
    assert bad.nonzero().flatten().tolist() == sorted(torch.argsort(keys)[:8].tolist())   # ceil(0.2 x 40)
    assert attackers(5, 40, 0.0) is None and int(attackers(5, 7, 0.3).sum()) == 3


def test_what_an_attacker_sends():
    from fedclust.attack import flip_labels, poison_
    from fedclust.schema import AttackConfig

    start = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    trained = start + 0.5
    rows, ids = torch.tensor([1, 3]), torch.tensor([11, 13])
    flat = trained.clone()
    poison_(flat, start[rows], rows, ids, AttackConfig(kind="sign_flip", scale=2.0), seed=1, round_=3)
    assert torch.allclose(flat[rows], start[rows] - 2.0 * 0.5) and torch.equal(flat[[0, 2]], trained[[0, 2]])
    a, b = trained.clone(), trained.clone()
    poison_(a, start[rows], rows, ids, AttackConfig(kind="gaussian", scale=0.1), seed=1, round_=3)
    poison_(b, start[rows], rows, ids[[1, 0]], AttackConfig(kind="gaussian", scale=0.1), seed=1, round_=3)
    noise_a, noise_b = a - trained, b - trained
    assert torch.allclose(noise_a[1], noise_b[3], atol=1e-6) and torch.allclose(noise_a[3], noise_b[1], atol=1e-6)
    assert 0.03 < float((a[rows] - trained[rows]).std()) < 0.3 and torch.equal(a[[0, 2]], trained[[0, 2]])
    same = trained.clone()
    poison_(same, start[rows], rows, ids, AttackConfig(kind="label_flip"), seed=1, round_=3)
    assert torch.equal(same, trained)                                      # label_flip's poison is in its labels
    y = torch.tensor([[0, 1, 9], [2, 3, 4]])
    assert flip_labels(y, torch.tensor([False, True]), 10).tolist() == [[0, 1, 9], [7, 6, 5]]


def test_honest_and_worst_cluster_accuracy_by_hand():
    from fedclust.evaluation import honest_and_worst

    acc = torch.tensor([1.0, 0.5, 0.0, 0.75, 0.25, 1.0], dtype=torch.float64)
    clusters = torch.tensor([0, 0, 0, 1, 1, 1])
    got = honest_and_worst(acc, None, clusters)
    assert got["honest_accuracy"] == pytest.approx(100 * 3.5 / 6) and got["worst_cluster_accuracy"] == 50.0
    bad = torch.tensor([False, False, True, False, True, False])            # clients 2 and 4 attack
    got = honest_and_worst(acc, bad, clusters)
    assert got["honest_accuracy"] == pytest.approx(100 * 3.25 / 4)
    assert got["worst_cluster_accuracy"] == pytest.approx(75.0)             # cluster 0: (1 + .5)/2; 1: (.75 + 1)/2
    assert honest_and_worst(acc, None, None)["worst_cluster_accuracy"] is None


# Each fault under 1 and 2 processes, several at once per run (every peer and server family once); the faults'
# rules are tested above one by one, these runs test that their draws do not depend on the processes.




def test_a_methods_own_regular_graph_joins_a_disconnected_draw_with_a_ring_as_the_reference():
    """network.regular_graph (EL-Oracle's, DePRL's, Facade's, FedSPD's graph): networkx's draw from (seed, epoch,
    stream), and where that draw is not connected, the ring i — i+1 mod n added (decentralizepy's Regular and
    Graph.connect_graph); a connected draw is taken as it is."""
    from fedclust.network import graph_seed, regular_graph

    seen = {True: 0, False: 0}
    for epoch in range(30):   # 2-regular graphs of 12 clients: unions of cycles, often several
        want = nx.random_regular_graph(2, 12, seed=graph_seed(7, epoch, 0, "deprl"))
        connected = nx.is_connected(want)
        seen[connected] += 1
        if not connected:
            for i in range(12):   # the plain rule, one edge at a time
                want.add_edge(i, (i + 1) % 12)
        got = regular_graph(12, 2, 7, epoch, "deprl")
        assert [set(got.idx[i][got.valid[i]].tolist()) for i in range(12)] == \
            [set(want.neighbors(i)) for i in range(12)], epoch
        g = nx.Graph()
        g.add_nodes_from(range(12))
        g.add_edges_from((i, int(j)) for i in range(12) for j in got.idx[i][got.valid[i]])
        assert nx.is_connected(g)
    assert seen[True] and seen[False]   # both cases met


@pytest.mark.parametrize("name", ["panm_grad", "panm_loss"])
@pytest.mark.parametrize("fault", ["p_offline", "p_drop"])
def test_panm_stage_one_keeps_a_silent_previous_neighbour_with_keep_and_not_with_drop(name, fault):
    """panm.silent_neighbours: with keep, a previous neighbour whose model did not arrive stays in N_i^t and the
    other places go to answering candidates (k in all, or fewer when fewer answer); with drop, the list holds
    answers only."""
    n, k = 16, 3
    for rule in ("keep", "drop"):
        cfg = load_config(None, ["data.name=synthetic", f"clients={n}", f"algorithm.k={k}", "algorithm.l=5",
                                 "stage1_rounds=8", "rounds=8", f"algorithm.name={name}",
                                 f"panm.silent_neighbours={rule}"])
        algo = registry.build(cfg, run_facts(cfg))
        network = Network(net(**{fault: 0.4}), n, 3)
        ids = torch.arange(n)
        ctx = _ctx(n, ids)
        ctx.online, ctx.delivery = network.online, (lambda t: network.delivery(t, ids))
        state = algo.init(ctx)
        kept = 0
        for t in range(1, 9):
            previous = state.neighbors.clone()
            view = _view(t, n)
            state, _ = algo.aggregate(state, ctx, view)
            delivery = network.delivery(t, ids)
            arrived = delivery.answering(torch.ones(n, n, dtype=torch.bool))
            own = delivery.own_online()
            for i in range(n):
                if not own[i]:
                    continue
                now = set(state.neighbors[i].nonzero().flatten().tolist())
                silent = {j for j in previous[i].nonzero().flatten().tolist() if not arrived[i, j]}
                answers = now - silent
                assert all(arrived[i, j] for j in answers), (rule, t, i)
                if rule == "keep":
                    assert silent <= now, (rule, t, i)
                    kept += len(silent)
                else:
                    assert not (now & silent), (rule, t, i)
                assert len(now) <= k, (rule, t, i)
        if rule == "keep":
            assert kept > 0   # the case arose


def test_keep_is_the_default_and_a_run_written_before_the_key_reads_drop():
    """The default is keep (docs/results_network.md: PANM's lists stay pure under churn); a config written before
    the key existed (a checkpoint's, a run directory's) reads drop, the rule that run was made with."""
    from fedclust.config import Config
    from fedclust.upgrade import config as upgraded

    assert Config().panm.silent_neighbours == "keep"
    assert upgraded({"algorithm": {"name": "panm_grad"}, "panm": {"tau": 1}})["panm.silent_neighbours"] == "drop"
    written = {"algorithm": {"name": "panm_grad"}, "panm": {"silent_neighbours": "keep"}}
    assert upgraded(written)["panm.silent_neighbours"] == "keep"
