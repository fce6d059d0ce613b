"""FedSPD (fedclust/algorithms/fedspd.py) against its rules written plainly
per client, as the reference code states them: the first split of a
client's examples, the minimum per cluster, the groups, what a client
trains on, the average within a group over the graph, the reassignment of
every example, the mixed model and the fine-tuning, offline clients, and
its keys."""

from __future__ import annotations

import pytest
import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.fedspd import Fedspd, FedspdConfig, FedspdState, group_of, initial_split, keep_minimum
from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.network import Delivery, Network
from fedclust.peers import as_mask
from fedclust.schema import NetworkConfig

P = 4


def init_model(seed):
    return torch.randn(P, generator=torch.Generator().manual_seed(seed))


def test_the_first_split_by_hand():
    N, S = 20, 2
    got = initial_split(5, torch.tensor([3]), torch.tensor([N]), N, S)[0]
    # per = 10, portion = 10/3: cluster 0 takes 3 of the first half and 6 of the second, cluster 1 the rest
    keys = [float(rng.uniform(5, 0, "fedspd_split", torch.tensor(3), torch.tensor(j))) for j in range(N)]
    first = sorted(range(10), key=lambda j: keys[j])[:3]
    second = sorted(range(10, 20), key=lambda j: keys[j])[:6]
    assert sorted(got.eq(0).nonzero().flatten().tolist()) == sorted(first + second)
    assert int(got.eq(1).sum()) == 11


def plain_minimum(assign, S, m):
    """The reference's BB lists (train.py data_clustering_M): each cluster's examples in order; a cluster with
    fewer than m takes the m last of the largest."""
    bb = {s: [j for j, a in enumerate(assign) if a == s] for s in range(S)}
    for s in range(S):
        if len(bb[s]) < m:
            donor = max(bb, key=lambda k: len(bb[k]))
            bb[s].extend(bb[donor][-m:])
            bb[donor] = bb[donor][:-m]
    out = [0] * len(assign)
    for s, js in bb.items():
        for j in js:
            out[j] = s
    return out


def test_the_minimum_per_cluster_is_the_reference_rule():
    gen = torch.Generator().manual_seed(0)
    S, m, N = 3, 4, 30
    assign = torch.randint(0, S, (6, N), generator=gen)
    assign[0] = 0                       # one cluster holds all
    assign[1, :28] = 2                  # two nearly empty
    assign[1, 28:] = torch.tensor([0, 1])
    got = keep_minimum(assign, torch.ones(6, N, dtype=torch.bool), S, m)
    for c in range(6):
        assert got[c].tolist() == plain_minimum(assign[c].tolist(), S, m), c


def test_groups_are_disjoint_blocks_of_the_key_order():
    n, S = 11, 3
    g = group_of(4, 7, n, S)
    keys = [float(rng.uniform(4, 7, "fedspd_group", torch.tensor(i), 0)) for i in range(n)]
    order = sorted(range(n), key=lambda i: keys[i])
    for r, i in enumerate(order):
        assert int(g[i]) == (r // 3 if r < 9 else -1)


def make_ctx(n, ids, net, seed=3, sample_loss=None, delivery=lambda t: None, N=12):
    return Context(n=n, client_ids=ids, clusters=None, seed=seed, stage1_rounds=1, w0=init_model(seed),
                   device=torch.device("cpu"), graph=net.graph, sample_loss=sample_loss, delivery=delivery,
                   train_examples=torch.full((len(ids),), N), train_width=N)


def test_plan_draws_a_share_of_the_groups_cluster_and_the_first_pass_trains_every_cluster_in_turn():
    n, seed, N = 8, 3, 12
    net = Network(NetworkConfig(graph="ring"), n, seed)
    algo = Fedspd(init_model, rounds=10, train_size=N, fedspd=FedspdConfig(clusters=2, share=0.5, first_epochs=4,
                                                                          finetune_rounds=2, finetune_epochs=3,
                                                                          min_examples=2))
    c = make_ctx(n, torch.arange(n), net, seed, N=N)
    state = algo.init(c)
    models = torch.zeros(n, P)
    _, p1 = algo.plan(state, c, 2, models)
    assert bool(p1.trains.all()) and p1.phases == ((4, ()),)
    assert torch.equal(p1.start, state.bank[:, 1])
    t = 5
    _, plan = algo.plan(state, c, t, models)
    g = group_of(seed, t, n, 2)
    assert torch.equal(plan.trains, g >= 0) and plan.phases is None
    for i in range(n):
        s = max(int(g[i]), 0)
        ours = [j for j in range(N) if int(state.assign[i, j]) == s]
        drawn = [j for j in ours if float(rng.uniform(seed, t, "fedspd_share", torch.tensor(i), torch.tensor(j))) < 0.5]
        assert plan.samples[i].nonzero().flatten().tolist() == (drawn or ours)
        assert torch.equal(plan.start[i], state.bank[i, s])
    _, last = algo.plan(state, c, 9, models)   # the first fine-tuning round starts from the mix
    pi = torch.stack([(state.assign == s).sum(1) for s in range(2)], 1).float() / N
    assert torch.allclose(last.start, (pi[:, :, None] * state.bank).sum(1), atol=1e-6)
    assert last.phases == ((3, ()),) and last.trains is None   # fedspd.finetune_epochs, everyone, alone


def test_a_round_averages_within_the_group_and_reassigns_every_example():
    n, seed, N, S, t = 8, 3, 12, 2, 5
    net = Network(NetworkConfig(graph="regular", degree=3), n, seed)
    gen = torch.Generator().manual_seed(1)
    targets = torch.randn(n, N, P, generator=gen)

    def sample_loss(models):   # example j of client c fits the model closest to its target
        return (models[:, None, :] - targets).pow(2).mean(-1)

    algo = Fedspd(init_model, rounds=20, train_size=N, fedspd=FedspdConfig(clusters=S, min_examples=2))
    state = FedspdState(bank=torch.randn(n, S, P, generator=gen), assign=torch.randint(0, S, (n, N), generator=gen))
    group = group_of(seed, t, n, S)
    labels = torch.where(group >= 0, group, torch.full_like(group, S))
    after = torch.randn(n, P, generator=gen)
    view = RoundView(round=t, before=None, after=after, all_after=after, all_labels=labels)
    new, result = algo.aggregate(state, make_ctx(n, torch.arange(n), net, seed, sample_loss, N=N), view)
    g = net.graph(t)
    for i in range(n):
        nb = [j for j in g.idx[i][g.valid[i]].tolist() if int(group[j]) == int(group[i]) >= 0]
        for s in range(S):
            if s == int(group[i]):
                assert torch.allclose(new.bank[i, s], after[[i, *nb]].mean(0), atol=1e-6)
            else:
                assert torch.equal(new.bank[i, s], state.bank[i, s])
        assert set(as_mask(result.lists)[i].nonzero().flatten().tolist()) == set(nb)
        losses = [[float((new.bank[i, s] - targets[i, j]).pow(2).mean()) for s in range(S)] for j in range(N)]
        want = plain_minimum([min(range(S), key=lambda s: row[s]) for row in losses], S, 2)
        assert new.assign[i].tolist() == want
        pi = [want.count(s) / N for s in range(S)]
        assert torch.allclose(result.models[i], sum(pi[s] * new.bank[i, s] for s in range(S)), atol=1e-6)


def test_an_offline_client_keeps_its_models_and_examples():
    n, seed, N, S, t = 8, 3, 12, 2, 5
    net = Network(NetworkConfig(graph="ring"), n, seed)
    online = torch.arange(n) % 3 != 0
    algo = Fedspd(init_model, rounds=20, train_size=N, fedspd=FedspdConfig(clusters=S, min_examples=2))
    gen = torch.Generator().manual_seed(2)
    state = FedspdState(bank=torch.randn(n, S, P, generator=gen), assign=torch.randint(0, S, (n, N), generator=gen))
    labels = torch.zeros(n, dtype=torch.int64)
    after = torch.randn(n, P, generator=gen)
    c = make_ctx(n, torch.arange(n), net, seed, lambda m: torch.rand(n, N, generator=gen), N=N,
                 delivery=lambda r: Delivery(seed, r, online, 0.0, torch.arange(n)))
    new, _ = algo.aggregate(state, c, RoundView(round=t, before=None, after=after, all_after=after, all_labels=labels))
    for i in range(n):
        if not online[i]:
            assert torch.equal(new.bank[i], state.bank[i]) and torch.equal(new.assign[i], state.assign[i])


@pytest.mark.parametrize("extra,field", [
    (["fedspd.share=0"], "fedspd.share"), (["fedspd.clusters=0"], "fedspd.clusters"),
    (["rounds=5", "fedspd.finetune_rounds=4"], "fedspd.finetune_rounds"), (["fedspd.finetune_epochs=0"], "fedspd.finetune_epochs"),
    (["data.train_size=15"], "fedspd.min_examples"), (["clients=9", "fedspd.degree=3"], "fedspd.degree"),
])
def test_bad_keys_are_refused_naming_the_field(extra, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=fedspd", "data.name=synthetic", "clients=10", "rounds=20"] + extra)
    assert e.value.field == field
