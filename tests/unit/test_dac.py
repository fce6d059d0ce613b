"""DAC (fedclust/algorithms/dac.py) against its rule written plainly per
client, as the reference code (edvinli/DAC utils.py) states it: the pulls
sampled one after another by softmax(τ·s) (their law checked by
enumeration), the scores 1/loss, the spreading of scores to peers never
asked, the τ schedule, the clusters of the top-k graph, two processes'
shares, offline clients and lost models, and its keys."""

from __future__ import annotations

import itertools
import math

import networkx as nx
import pytest
import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.dac import Dac, DacConfig, DacState, draw_pulls, tau_at, top_k_components, update_tables
from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.network import Delivery, Network
from fedclust.peers import as_mask
from fedclust.schema import NetworkConfig

P = 4


def rows_of(choice) -> list[set]:
    return [set(r.nonzero().flatten().tolist()) for r in as_mask(choice)]


def test_tau_schedule_by_hand():
    assert tau_at(30.0, "constant", 7) == 30.0
    assert tau_at(30.0, "sigmoid", 1) == pytest.approx(1.0)                 # 2τ/2 − τ + 1
    assert tau_at(30.0, "sigmoid", 11) == pytest.approx(60 / (1 + math.exp(-2.0)) - 29)
    assert tau_at(30.0, "sigmoid", 500) == pytest.approx(31.0)


def successive_inclusion(weights: list[float], k: int) -> list[float]:
    """P(j among k drawn one after another without replacement, each ∝ weight), by enumeration."""
    n = len(weights)
    out = [0.0] * n
    for seq in itertools.permutations(range(n), k):
        p, left = 1.0, sum(weights)
        for j in seq:
            p *= weights[j] / left
            left -= weights[j]
        for j in seq:
            out[j] += p
    return out


@pytest.mark.parametrize("k", [1, 2])
def test_pulls_follow_successive_sampling_by_softmax(k):
    n, tau = 5, 8.0
    scores = torch.rand(n, n, generator=torch.Generator().manual_seed(0)) * 0.3
    scores[0, 2] = 0.0                                    # unknown: weight exp(0)
    hits = torch.zeros(n, n)
    rounds = 3000
    clients = torch.arange(n)
    for t in range(1, rounds + 1):
        hits += as_mask(draw_pulls(1, t, scores, clients, k, tau)).float()
    for i in range(n):
        others = [j for j in range(n) if j != i]
        want = successive_inclusion([math.exp(tau * float(scores[i, j])) for j in others], k)
        got = [float(hits[i, j]) / rounds for j in others]
        sd = max(math.sqrt(p * (1 - p) / rounds) for p in want)
        assert all(abs(g - w) < 5 * sd + 1e-3 for g, w in zip(got, want)), (i, got, want)
    assert float(hits.diagonal().sum()) == 0


def test_pulls_are_the_k_lowest_gumbel_keys_and_keep_to_the_graph():
    n, k, t, seed, tau = 12, 3, 4, 7, 5.0
    scores = torch.rand(n, n, generator=torch.Generator().manual_seed(1))
    g = Network(NetworkConfig(graph="regular", degree=4), n, seed).graph(t)
    allowed = g.rows(torch.arange(n))
    got = rows_of(draw_pulls(seed, t, scores, torch.arange(n), k, tau, lambda a, b: allowed[a:b]))
    for i in range(n):
        others = [j for j in range(n) if j != i and bool(allowed[i, j])]
        key = {j: math.log(-math.log(float(rng.uniform(seed, t, "dac", torch.tensor(i), torch.tensor(j)))
                                     + 2.0**-33)) - tau * float(scores[i, j]) for j in others}
        assert got[i] == set(sorted(others, key=key.get)[:k]), i
    few = rows_of(draw_pulls(seed, t, scores, torch.arange(n), 6, tau, lambda a, b: allowed[a:b]))
    assert few == [set(allowed[i].nonzero().flatten().tolist()) for i in range(n)]   # fewer than k: all of them


def plain_update(S, asked, pulls, propagate=True):
    """The reference's steps 2 and 3 per client (utils.py train_DAC), on the round-start tables S; without
    ``propagate``, step 2 alone (sacs-epfl/facade's DAC: a node keeps only the losses of the peers it pulled)."""
    n = S.shape[0]
    new, seen = S.clone(), asked.clone()
    for i, got in enumerate(pulls):
        if not got:
            continue
        order = [j for j, _ in got]
        for j, v in got:
            new[i, j] = v
            seen[i, j] = True
        if not propagate:
            continue
        heard = set()
        for kp in order:
            heard |= {j for j in range(n) if float(S[kp, j]) > 0}
        heard -= {j for j in range(n) if bool(seen[i, j])} | {i}
        for j in sorted(heard):
            ki = [(float(new[i, kp]), pos) for pos, kp in enumerate(order) if float(S[kp, j]) > 0]
            ki.sort(key=lambda x: x[0])                       # stable: ties keep their order, the last wins
            new[i, j] = S[order[ki[-1][1]], j]
    return new, seen


@pytest.mark.parametrize("propagate", [True, False])
def test_tables_update_as_the_plain_rule(propagate):
    n, k = 9, 3
    gen = torch.Generator().manual_seed(2)
    S = torch.rand(n, n, generator=gen) * (torch.rand(n, n, generator=gen) < 0.4)
    S.fill_diagonal_(0)
    asked = S > 0.5
    idx = torch.stack([torch.randperm(n - 1, generator=gen)[:k] for _ in range(n)])
    idx = torch.where(idx >= torch.arange(n)[:, None], idx + 1, idx).sort(1).values   # never itself
    valid = torch.rand(n, k, generator=gen) < 0.8
    valid[4] = False                                       # a client that pulled nothing
    values = torch.rand(n, k, generator=gen) + 0.1
    values[1, 2] = values[1, 0]                            # a tie: the later pull wins
    pulls = [[(int(idx[i, q]), float(values[i, q])) for q in range(k) if bool(valid[i, q])] for i in range(n)]
    want_s, want_a = plain_update(S, asked, pulls, propagate)
    got_s, got_a = update_tables(S, asked, idx, valid, values, propagate)
    assert torch.equal(got_a, want_a)
    assert torch.equal(got_s, want_s)
    pulled = torch.zeros(n, n, dtype=torch.bool)
    pulled[torch.arange(n)[:, None].expand_as(idx)[valid], idx[valid]] = True
    heard = (got_s != S) & ~pulled   # scores learnt second-hand, from a pulled peer's table
    assert bool(heard.any()) == propagate
    assert torch.equal(got_s[4], S[4]) and torch.equal(got_a[4], asked[4])


def test_clusters_are_the_components_of_the_top_k_graph():
    n, k = 10, 2
    S = torch.rand(n, n, generator=torch.Generator().manual_seed(3))
    S[:, 7] = 0                                            # nobody knows client 7
    S.fill_diagonal_(0)
    g = nx.Graph()
    g.add_nodes_from(range(n))
    for i in range(n):
        for j in sorted(range(n), key=lambda j: -float(S[i, j]))[:k]:
            if float(S[i, j]) > 0:
                g.add_edge(i, j)
    want = {frozenset(c) for c in nx.connected_components(g)}
    labels = top_k_components(S, k).tolist()
    got = {frozenset(i for i in range(n) if labels[i] == c) for c in set(labels)}
    assert got == want


def loss_fn(targets):
    return lambda models, owner: (models - targets[owner]).pow(2).mean(1) + 0.05


def make_ctx(n, ids, targets, seed=3, delivery=lambda t: None, all_reduce=lambda x: x):
    return Context(n=n, client_ids=ids, clusters=torch.arange(n) % 2, seed=seed, stage1_rounds=1,
                   w0=torch.zeros(P), device=torch.device("cpu"), delivery=delivery,
                   pair_loss=lambda m, o: loss_fn(targets)(m, ids[o]), all_reduce=all_reduce)


@pytest.mark.parametrize("offline", [False, True])
def test_two_rounds_match_the_plain_rule_and_two_processes_share_the_same(offline):
    n, k, seed = 8, 3, 3
    gen = torch.Generator().manual_seed(4)
    targets = torch.randn(n, P, generator=gen)
    algo = Dac(k, DacConfig(tau=6.0, schedule="sigmoid"))
    everyone = torch.arange(n)
    online = (torch.arange(n) % 3 != 1) if offline else None
    p_drop = 0.3 if offline else 0.0

    def delivery(ids):
        return (lambda t: Delivery(seed, t, online, p_drop, ids)) if offline else (lambda t: None)

    state = algo.init(make_ctx(n, everyone, targets))
    for t in (1, 2):
        after = torch.randn(n, P, generator=gen)
        view = RoundView(round=t, before=None, after=after, all_after=after)
        whole = make_ctx(n, everyone, targets, seed, delivery(everyone))
        # two processes: each scores its own clients' pulls; their shares sum to one process's
        shards = [torch.arange(0, 3), torch.arange(3, n)]
        parts = [algo.pulls(state, make_ctx(n, ids, targets, seed, delivery(ids)),
                            RoundView(round=t, before=None, after=after[ids], all_after=after)) for ids in shards]
        assert torch.equal(parts[0] + parts[1], algo.pulls(state, whole, view))
        new, choice = algo.select(state, whole, view)
        # plain: client i's pulls are its k lowest keys among the others, scored 1/L if the model arrived
        tau = tau_at(6.0, "sigmoid", t)
        pulls = []
        for i in range(n):
            others = [j for j in range(n) if j != i]
            key = {j: math.log(-math.log(float(rng.uniform(seed, t, "dac", torch.tensor(i), torch.tensor(j)))
                                         + 2.0**-33)) - tau * float(state.scores[i, j]) for j in others}
            drawn = sorted(sorted(others, key=key.get)[:k])
            if online is not None:
                lost = [float(rng.uniform(seed, t, "drop", torch.tensor(i), torch.tensor(j))) < p_drop for j in drawn]
                drawn = [j for j, gone in zip(drawn, lost) if bool(online[i]) and bool(online[j]) and not gone]
            pulls.append([(j, float(1 / (loss_fn(targets)(after[j:j + 1], torch.tensor([i]))))) for j in drawn])
        want_s, want_a = plain_update(state.scores, state.asked, pulls)
        assert rows_of(choice) == [{j for j, _ in row} for row in pulls]
        assert torch.allclose(new.scores, want_s, rtol=1e-6) and torch.equal(new.asked, want_a)
        state = new
    assert bool((state.scores > 0).any())


def test_a_round_averages_the_pulls_and_reports_the_top_k_clusters():
    n, k = 6, 2
    targets = torch.randn(n, P, generator=torch.Generator().manual_seed(5))
    algo = Dac(k, DacConfig())
    c = make_ctx(n, torch.arange(n), targets)
    after = torch.randn(n, P, generator=torch.Generator().manual_seed(6))
    state, result = algo.aggregate(algo.init(c), c, RoundView(round=1, before=None, after=after, all_after=after))
    for i, peers in enumerate(rows_of(result.lists)):
        assert len(peers) == k
        assert torch.allclose(result.models[i], after[[i, *sorted(peers)]].mean(0), atol=1e-6)
    assert torch.equal(result.assignment, top_k_components(state.scores, k))
    assert result.received.tolist() == [k] * n


def test_propagate_is_read_from_the_config_default_true():
    base = ["algorithm.name=dac", "data.name=synthetic", "clients=8"]
    assert Dac.from_config(load_config(None, base)).dac.propagate is True
    assert Dac.from_config(load_config(None, base + ["dac.propagate=false"])).dac.propagate is False


@pytest.mark.parametrize("key,value", [("dac.tau", "0"), ("dac.tau", "nan"), ("dac.schedule", "var")])
def test_bad_keys_are_refused_naming_the_field(key, value):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=dac", "data.name=synthetic", "clients=8", f"{key}={value}"])
    assert e.value.field == key


def test_state_is_replicated_server_state():
    algo = Dac(2, DacConfig())
    state = algo.init(make_ctx(5, torch.arange(2, 4), torch.zeros(5, P)))
    assert isinstance(state, DacState) and state.scores.shape == (5, 5) and state.asked.dtype == torch.bool
