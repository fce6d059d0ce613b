"""DPFL (fedclust/algorithms/dpfl.py) against its rules written plainly per
client, as the reference code (salmakh1/DPFL selection/bandits.py
optimized_rgl_p, fl/train_clients_constrained_rgl.py) states them: the
randomized double greedy one client and one candidate at a time on Python
lists and floats, the probability by hand, the schedule, the frozen pool,
the weighted average, two processes' rows, the graph and offline clients,
and its keys."""

from __future__ import annotations

import pytest
import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.dpfl import (
    Dpfl,
    DpflConfig,
    add_probability,
    double_greedy,
    greedy,
    search_round,
    sequential_average,
    set_models,
)
from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.network import Delivery, Network
from fedclust.schema import NetworkConfig

P = 5


def loss_fn(targets):
    """A validation loss owned by each client: the squared distance of a model to the client's target."""
    return lambda models, owner: (models - targets[owner]).pow(2).mean(1) + 0.05


def plain_search(i, pool, sizes, models, loss, seed, t, budget, tie, previous=False, ties=None):
    """The reference's optimized_rgl_p for client i (its pool a list, i first), on Python floats: the shuffle
    and the coins are fedclust's keyed draws; ``previous``: a tie of positive gains keeps p from the step before
    (0 at first: the reference's ``p = [0]``); ``ties``: a list counting such ties."""
    def reward(members):
        w = torch.tensor([float(sizes[j]) for j in members], dtype=torch.float64)
        avg = ((w / w.sum())[:, None].to(models.dtype) * models[members]).sum(0)
        return (10 - float(loss(avg[None], torch.tensor([i]))[0])) / 10

    others = sorted((j for j in pool if j != i),
                    key=lambda j: float(rng.uniform(seed, t, "dpfl_order", torch.tensor(i), torch.tensor(j))))
    x, y = [i], [i] + others
    rx, ry = reward(x), reward(y)
    p = 0.0
    for s, z in enumerate(others):
        r21 = reward(x + [z])
        r22 = reward([j for j in y if j != z])
        a, b = max(r21 - rx, 0.0), max(r22 - ry, 0.0)
        if a == b:
            if a == 0:
                p = 1.0
            else:
                p = p if previous else tie
                if ties is not None:
                    ties.append(i)
        else:
            p = a / (a + b)
        if float(rng.uniform(seed, t, "dpfl_coin", torch.tensor(i), torch.tensor(s))) < p:
            x, rx = x + [z], r21
        else:
            y, ry = [j for j in y if j != z], r22
        if len(x) == budget:
            break
    return set(x)


def test_add_probability_by_hand():
    a = torch.tensor([0.2, 0.0, 0.3, -1.0, 0.5, -0.2, 0.0])
    b = torch.tensor([0.6, 0.0, 0.3, 0.5, -1.0, -0.1, 0.4])
    assert add_probability(a, b, 0.5).tolist() == pytest.approx([0.25, 1.0, 0.5, 0.0, 1.0, 1.0, 0.0])
    assert add_probability(torch.tensor([0.3]), torch.tensor([0.3]), 0.9).tolist() == pytest.approx([0.9])


def test_search_rounds_by_hand():
    assert [t for t in range(1, 12) if search_round(DpflConfig(), t)] == [3, 5, 7, 9, 11]   # the reference's t=2,4,..
    assert [t for t in range(1, 12) if search_round(DpflConfig(start=2, period=3), t)] == [2, 5, 8, 11]


def test_set_models_weights_by_examples_by_hand():
    models = torch.tensor([[1.0, 0.0], [3.0, 4.0], [5.0, 8.0]])
    sets = torch.tensor([[True, True, False], [True, False, True], [False, False, True]])
    got = set_models(sets, torch.tensor([1.0, 3.0, 2.0]), models)
    assert torch.allclose(got, torch.tensor([[2.5, 3.0], [11 / 3, 16 / 3], [5.0, 8.0]]))


@pytest.mark.parametrize("budget,tie,seed", [(10, 0.5, 1), (3, 0.5, 2), (4, 0.2, 3), (2, 0.5, 4)])
def test_the_double_greedy_is_the_reference_rule_client_by_client(budget, tie, seed):
    n = 9
    gen = torch.Generator().manual_seed(seed)
    targets = torch.randn(n, P, generator=gen)
    targets[n // 2:] += 2.0                                     # two clusters of targets
    models = targets + 0.8 * torch.randn(n, P, generator=gen)
    sizes = torch.randint(5, 20, (n,), generator=gen).to(torch.float64)
    pool = torch.rand(n, n, generator=gen) < 0.8
    loss = loss_fn(targets)
    ids = torch.arange(n)
    for t in (3, 5):
        got = double_greedy(pool, ids, sizes, models, loss, seed, t, budget, tie)
        for i in range(n):
            members = [j for j in range(n) if bool(pool[i, j]) or j == i]
            want = plain_search(i, members, sizes, models, loss, seed, t, budget, tie)
            assert set(got[i].nonzero().flatten().tolist()) == want, (t, i)
            assert len(want) <= budget


def test_flat_rewards_add_in_shuffled_order_up_to_the_budget():
    n, budget, seed, t = 8, 4, 5, 3
    got = double_greedy(torch.ones(n, n, dtype=torch.bool), torch.arange(n), torch.ones(n, dtype=torch.float64),
                        torch.zeros(n, P), lambda m, o: torch.full((len(m),), 0.7), seed, t, budget, 0.5)
    for i in range(n):
        order = sorted((j for j in range(n) if j != i),
                       key=lambda j: float(rng.uniform(seed, t, "dpfl_order", torch.tensor(i), torch.tensor(j))))
        assert set(got[i].nonzero().flatten().tolist()) == {i, *order[:budget - 1]}


def make_ctx(n, ids, targets, seed=3, delivery=lambda t: None, reach=lambda t: None, examples=None):
    examples = torch.full((n,), 10) if examples is None else examples
    share = torch.zeros(n, dtype=torch.float64)

    def all_reduce(x):   # the other processes' rows: every client's examples
        return examples.to(torch.float64) if x.shape == share.shape else x

    return Context(n=n, client_ids=ids, clusters=torch.arange(n) % 2, seed=seed, stage1_rounds=1,
                   w0=torch.zeros(P), device=torch.device("cpu"), delivery=delivery, reach=reach,
                   val_loss=lambda m, o: loss_fn(targets)(m, ids[o]), all_reduce=all_reduce,
                   train_examples=examples[ids])


def test_rounds_search_on_schedule_freeze_the_pool_and_average_by_examples():
    n, seed = 8, 3
    gen = torch.Generator().manual_seed(7)
    targets = torch.randn(n, P, generator=gen)
    targets[4:] += 3.0
    examples = torch.tensor([10, 20, 5, 10, 8, 12, 10, 30])
    algo = Dpfl(DpflConfig(budget=4))
    everyone = torch.arange(n)
    ctx = make_ctx(n, everyone, targets, seed, examples=examples)
    state = algo.init(ctx)
    for t in range(1, 8):
        after = targets + 0.5 * torch.randn(n, P, generator=gen)
        before = state
        state, result = algo.aggregate(state, ctx, RoundView(round=t, before=None, after=after, all_after=after))
        if not search_round(algo.dpfl, t):
            assert torch.equal(result.models, after) and result.received.tolist() == [0] * n
            assert torch.equal(state.chosen, before.chosen) and torch.equal(state.pool, before.pool)
            continue
        pool = torch.ones(n, n, dtype=torch.bool) if t == 3 else before.pool
        for i in range(n):
            members = [j for j in range(n) if bool(pool[i, j]) or j == i]
            want = plain_search(i, members, examples, after, loss_fn(targets), seed, t, 4, 0.5)
            assert set(state.chosen[i].nonzero().flatten().tolist()) == want - {i}
            w = examples[sorted(want)].to(torch.float64)
            assert torch.allclose(result.models[i], ((w / w.sum())[:, None].float() * after[sorted(want)]).sum(0),
                                  atol=1e-6)
            assert int(result.received[i]) == len(members) - 1   # it read its whole pool's models
        assert torch.equal(state.pool, before.pool if t > 3 else state.chosen | torch.eye(n, dtype=torch.bool))
        assert torch.equal(result.lists, state.chosen)


@pytest.mark.parametrize("search", ["double_greedy", "greedy"])
def test_two_processes_choose_as_one(search):
    n, seed = 8, 4
    gen = torch.Generator().manual_seed(8)
    targets = torch.randn(n, P, generator=gen)
    after = targets + torch.randn(n, P, generator=gen)
    algo = Dpfl(DpflConfig(budget=3, search=search))
    whole_ctx = make_ctx(n, torch.arange(n), targets, seed)
    _, whole = algo.select(algo.init(whole_ctx), whole_ctx, RoundView(round=3, before=None, after=after,
                                                                      all_after=after))
    parts = []
    for ids in (torch.arange(0, 5), torch.arange(5, n)):
        c = make_ctx(n, ids, targets, seed)
        parts.append(algo.select(algo.init(c), c, RoundView(round=3, before=None, after=after[ids],
                                                            all_after=after))[1])
    assert torch.equal(torch.cat(parts), whole)


def test_the_search_keeps_to_the_graph_and_to_the_models_that_arrived():
    n, seed, t = 10, 6, 3
    gen = torch.Generator().manual_seed(9)
    targets = torch.zeros(n, P)
    after = 0.1 * torch.randn(n, P, generator=gen)              # everyone helps: sets fill up to the budget
    ids = torch.arange(n)
    net = Network(NetworkConfig(graph="regular", degree=4), n, seed)
    online = torch.arange(n) % 4 != 1
    ctx = make_ctx(n, ids, targets, seed, reach=lambda r: net.reach(r, ids, "cpu"),
                   delivery=lambda r: Delivery(seed, r, online, 0.3, ids))
    algo = Dpfl(DpflConfig(budget=n))
    state, result = algo.aggregate(algo.init(ctx), ctx, RoundView(round=t, before=None, after=after,
                                                                  all_after=after))
    graph = net.graph(t).rows(ids)
    lost = rng.uniform(seed, t, "drop", ids[:, None], ids[None, :]) < 0.3
    allowed = graph & online[None, :] & ~lost & online[:, None]
    assert not bool((state.chosen & ~allowed).any())
    assert bool(state.chosen.any())
    for i in torch.nonzero(~online).flatten().tolist():     # offline: nothing chosen, its model kept
        assert not bool(state.chosen[i].any()) and torch.equal(result.models[i], after[i])
        assert bool(state.pool[i].all())                    # its pool not frozen


def test_uniform_weights_are_the_plain_mean():
    n = 6
    gen = torch.Generator().manual_seed(10)
    targets = torch.randn(n, P, generator=gen)
    after = targets + 0.3 * torch.randn(n, P, generator=gen)
    ctx = make_ctx(n, torch.arange(n), targets, examples=torch.tensor([1, 50, 3, 9, 2, 7]))
    algo = Dpfl(DpflConfig(weights="uniform", budget=3))
    state, result = algo.aggregate(algo.init(ctx), ctx, RoundView(round=3, before=None, after=after,
                                                                  all_after=after))
    for i in range(n):
        members = sorted({i, *state.chosen[i].nonzero().flatten().tolist()})
        assert torch.allclose(result.models[i], after[members].mean(0), atol=1e-6)


def test_keys_are_read_with_their_defaults():
    algo = Dpfl.from_config(load_config(None, ["algorithm.name=dpfl", "data.name=synthetic", "clients=8"]))
    assert algo.dpfl == DpflConfig(budget=10, period=2, start=3, pool="frozen_first", weights="data_size",
                                   validation=0.2, tie=0.5, tie_rule="fixed", average="jacobi",
                                   search="double_greedy")
    assert algo.validation_share == 0.2


@pytest.mark.parametrize("key,value", [("dpfl.budget", "1"), ("dpfl.period", "0"), ("dpfl.start", "0"),
                                       ("dpfl.start", "41"), ("dpfl.pool", "first"), ("dpfl.weights", "size"),
                                       ("dpfl.validation", "0"), ("dpfl.validation", "1"), ("dpfl.tie", "1.5"),
                                       ("dpfl.tie", "nan"), ("dpfl.tie_rule", "last"),
                                       ("dpfl.average", "gauss"), ("dpfl.search", "rgl")])
def test_bad_keys_are_refused_naming_the_field(key, value):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=dpfl", "data.name=synthetic", "clients=8", "rounds=40",
                           f"{key}={value}"])
    assert e.value.field == key and e.value.fix


@pytest.mark.parametrize("previous", [False, True])
def test_ties_of_positive_gains_by_either_rule(previous):
    """A loss in steps of 1/4: many exact ties, some of equal positive gains."""
    n, seed, budget, tie = 9, 6, 6, 0.3
    gen = torch.Generator().manual_seed(15)
    targets = torch.randn(n, P, generator=gen)
    models = targets + 2 * torch.randn(n, P, generator=gen)
    sizes = torch.ones(n, dtype=torch.float64)

    def loss(m, o):
        return torch.floor((m - targets[o]).pow(2).mean(1) * 4) / 4

    pool = torch.ones(n, n, dtype=torch.bool)
    ties: list = []
    for t in range(3, 16, 2):
        got = double_greedy(pool, torch.arange(n), sizes, models, loss, seed, t, budget, tie, previous)
        for i in range(n):
            want = plain_search(i, list(range(n)), sizes, models, loss, seed, t, budget, tie, previous, ties)
            assert set(got[i].nonzero().flatten().tolist()) == want, (t, i)
    assert ties   # the rule was exercised


def plain_sequential(sets, sizes, models):
    """The reference's aggregation loop (train_clients_constrained_rgl.py): client by client, each average read
    from the models as the clients before it left them."""
    x = [m.clone() for m in models]
    for i in range(len(x)):
        members = [k for k in range(len(x)) if bool(sets[i, k])]
        w = sizes[members].to(torch.float64)
        x[i] = sum(float(wk / w.sum()) * x[k] for wk, k in zip(w, members))
    return torch.stack(x)


def test_the_sequential_average_is_the_reference_loop():
    n = 7
    gen = torch.Generator().manual_seed(16)
    sets = (torch.rand(n, n, generator=gen) < 0.4) | torch.eye(n, dtype=torch.bool)
    sets[3] = False
    sets[3, 3] = True                                            # a client alone keeps its model
    sizes = torch.randint(1, 9, (n,), generator=gen).to(torch.float64)
    models = torch.randn(n, P, generator=gen)
    got = sequential_average(sets, sizes, models)
    assert torch.allclose(got, plain_sequential(sets, sizes, models), atol=1e-5)
    assert torch.equal(got[3], models[3])
    assert not torch.allclose(got, set_models(sets, sizes, models), atol=1e-3)   # not the Jacobi average


def test_a_sequential_round_averages_client_by_client():
    n = 8
    gen = torch.Generator().manual_seed(17)
    targets = torch.randn(n, P, generator=gen)
    after = targets + 0.4 * torch.randn(n, P, generator=gen)
    examples = torch.tensor([10, 20, 5, 10, 8, 12, 10, 30])
    ctx = make_ctx(n, torch.arange(n), targets, examples=examples)
    algo = Dpfl(DpflConfig(budget=4, average="sequential"))
    state, result = algo.aggregate(algo.init(ctx), ctx, RoundView(round=3, before=None, after=after,
                                                                  all_after=after))
    sets = state.chosen | torch.eye(n, dtype=torch.bool)
    assert torch.allclose(result.models, plain_sequential(sets, examples, after), atol=1e-5)


def plain_greedy(i, pool, sizes, models, loss, budget):
    """The reference's non_monotone_constrained_greedy for client i: the candidate of largest gain (ties to the
    lower index) joins while its gain is >= 0, at most budget − 1 times."""
    def reward(members):
        w = torch.tensor([float(sizes[j]) for j in members], dtype=torch.float64)
        avg = ((w / w.sum())[:, None].to(models.dtype) * models[members]).sum(0)
        return (10 - float(loss(avg[None], torch.tensor([i]))[0])) / 10

    x, left = [i], sorted(j for j in pool if j != i)
    for _ in range(budget - 1):
        if not left:
            break
        r0 = reward(x)
        gains = {c: reward(x + [c]) - r0 for c in left}
        best = max(left, key=lambda c: (gains[c], -c))
        if gains[best] < 0:
            break
        x.append(best)
        left.remove(best)
    return set(x)


@pytest.mark.parametrize("budget", [2, 4, 9])
def test_the_greedy_search_is_the_reference_rule_client_by_client(budget):
    n = 9
    gen = torch.Generator().manual_seed(18)
    targets = torch.randn(n, P, generator=gen)
    targets[n // 2:] += 2.0
    models = targets + 0.8 * torch.randn(n, P, generator=gen)
    sizes = torch.randint(5, 20, (n,), generator=gen).to(torch.float64)
    pool = torch.rand(n, n, generator=gen) < 0.8
    got = greedy(pool, torch.arange(n), sizes, models, loss_fn(targets), budget)
    sizes_seen = set()
    for i in range(n):
        members = [j for j in range(n) if bool(pool[i, j]) or j == i]
        want = plain_greedy(i, members, sizes, models, loss_fn(targets), budget)
        assert set(got[i].nonzero().flatten().tolist()) == want, i
        sizes_seen.add(len(want))
    assert len(sizes_seen) > 1 or budget == 2


def test_flat_gains_fill_the_greedy_set_in_index_order():
    n = 6
    got = greedy(torch.ones(n, n, dtype=torch.bool), torch.arange(n), torch.ones(n, dtype=torch.float64),
                 torch.zeros(n, P), lambda m, o: torch.full((len(m),), 0.7), 3)
    assert [set(r.nonzero().flatten().tolist()) for r in got] == [{i, *[j for j in range(n) if j != i][:2]}
                                                                  for i in range(n)]
