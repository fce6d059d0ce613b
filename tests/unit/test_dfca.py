"""DFCA (fedclust/algorithms/dfca.py) against its rule written plainly per
client: the partner draws (m_i uniform in 1..λ-1, the m_i lowest keys), the
two-way exchange, each bank model the mean of itself and what partners of
that cluster sent, the choice by lowest loss, the inits, the lists and the
assignment it reports, offline clients, column blocks, and its keys."""

from __future__ import annotations

import math

import pytest
import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.dfca import (
    Dfca,
    DfcaConfig,
    DfcaState,
    exchange_partners,
    merge_bank,
    partner_bound,
    partner_draws,
)
from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.network import Delivery, Network
from fedclust.peers import PeerIndex, as_mask, union
from fedclust.schema import NetworkConfig

P = 5


def init_model(seed: int) -> torch.Tensor:
    return torch.randn(P, generator=torch.Generator().manual_seed(seed))


def ctx(n, ids, seed=3, graph=lambda t: None, delivery=lambda t: None, pair_loss=None):
    return Context(n=n, client_ids=ids, clusters=torch.arange(n) % 2, seed=seed, stage1_rounds=1,
                   w0=init_model(seed), device=torch.device("cpu"), graph=graph, delivery=delivery,
                   pair_loss=pair_loss)


def plain_draws(seed, t, n, bound, allowed=None):
    """Client i draws m_i = 1 + floor(u_i (λ-1)) partners: its m_i others of lowest key (among allowed)."""
    out = []
    for i in range(n):
        u = float(rng.uniform(seed, t, "dfca_count", torch.tensor(i), 0))
        m = 1 + math.floor(u * (bound - 1))
        others = [j for j in range(n) if j != i and (allowed is None or allowed[i][j])]
        keys = {j: float(rng.uniform(seed, t, "dfca_partner", torch.tensor(i), torch.tensor(j))) for j in others}
        out.append(set(sorted(others, key=keys.get)[:m]))
    return out


def rows_of(choice) -> list[set]:
    return [set(r.nonzero().flatten().tolist()) for r in as_mask(choice)]


def test_partner_counts_are_uniform_in_1_to_lambda_minus_1():
    n, bound = 400, 6
    counts = torch.cat([partner_draws(5, t, n, bound).counts() for t in range(1, 6)])
    assert int(counts.min()) == 1 and int(counts.max()) == bound - 1
    freq = torch.bincount(counts, minlength=bound)[1:].double() / len(counts)
    assert torch.allclose(freq, torch.full_like(freq, 1 / (bound - 1)), atol=0.03)


@pytest.mark.parametrize("graph", [False, True])
def test_partners_are_the_plain_rule_and_the_exchange_goes_both_ways(graph):
    n, bound, t, seed = 16, 6, 4, 3
    allowed = None
    if graph:
        g = Network(NetworkConfig(graph="regular", degree=4), n, seed).graph(t)
        allowed_rows = g.rows(torch.arange(n))
        allowed = allowed_rows.tolist()
    draws = partner_draws(seed, t, n, bound, None if not graph else (lambda a, b: allowed_rows[a:b]))
    want = plain_draws(seed, t, n, bound, allowed)
    assert rows_of(draws) == want
    for lo, hi in [(0, n), (3, 11)]:
        got = rows_of(exchange_partners(draws, lo, hi))
        assert got == [want[i] | {j for j in range(n) if i in want[j]} for i in range(lo, hi)]


def test_union_merges_index_lists_each_peer_once():
    a = PeerIndex.from_mask(torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool))
    b = PeerIndex.from_mask(torch.tensor([[0, 0, 1, 1], [1, 0, 0, 0]], dtype=torch.bool))
    u = union(a, b)
    assert u.idx.tolist() == [[1, 2, 3], [0, 0, 0]] and u.valid.tolist() == [[True] * 3, [True, False, False]]


def _blocks(all_after, width):
    class Columns:
        def __init__(self):
            self.width, self.parts = all_after.shape[1], {}

        def blocks(self, names=("after",)):
            for a in range(0, self.width, width):
                yield a, min(a + width, self.width), {"after": all_after[:, a:a + width]}
    return Columns()


def test_each_bank_model_is_the_mean_of_itself_and_what_that_cluster_sent():
    n, k = 7, 3
    gen = torch.Generator().manual_seed(0)
    bank = torch.randn(n, k, P, generator=gen)
    after = torch.randn(n, P, generator=gen)
    labels = torch.tensor([0, 2, 2, 1, 0, 2, 0])
    partners = PeerIndex.from_mask((torch.rand(n, n, generator=gen) < 0.5) & ~torch.eye(n, dtype=torch.bool))
    view = RoundView(round=1, before=None, after=after, all_after=after)
    got = merge_bank(bank, partners, labels, view)
    for i, peers in enumerate(rows_of(partners)):
        for c in range(k):
            sent = [j for j in sorted(peers) if int(labels[j]) == c]
            want = (bank[i, c] + after[sent].sum(0)) / (1 + len(sent)) if sent else bank[i, c]
            assert torch.allclose(got[i, c], want, atol=1e-6), (i, c)
    blocked = RoundView(round=1, before=None, after=after, columns=_blocks(after, 2))
    assert torch.equal(merge_bank(bank, partners, labels, blocked), got)   # any column block, the same bits
    mine = bank.clone()
    assert merge_bank(mine, partners, labels, blocked, inplace=True) is mine and torch.equal(mine, got)
    import fedclust.algorithms.cluster_models as cm
    old_chunk, cm.MERGE_CHUNK = cm.MERGE_CHUNK, 2 * n   # two columns at a time: the same bits
    try:
        assert torch.equal(merge_bank(bank, partners, labels, view), got)
    finally:
        cm.MERGE_CHUNK = old_chunk


def test_a_client_trains_its_model_of_lowest_loss():
    n = 6
    targets = torch.randn(n, P, generator=torch.Generator().manual_seed(1))
    loss = lambda models, owner: (models - targets[owner]).pow(2).mean(1)   # noqa: E731
    algo = Dfca(init_model, DfcaConfig(clusters=3, init="local"))
    c = ctx(n, torch.arange(n), pair_loss=loss)
    state = algo.init(c)
    _, plan = algo.plan(state, c, 1, state.bank[:, 0])
    for i in range(n):
        want = min(range(3), key=lambda j: float((state.bank[i, j] - targets[i]).pow(2).mean()))
        assert int(plan.labels[i]) == want and torch.equal(plan.start[i], state.bank[i, want])


def test_banks_start_shared_or_per_client_whatever_the_shard():
    n = 6
    shared = Dfca(init_model, DfcaConfig(clusters=3)).init(ctx(n, torch.arange(n))).bank
    assert torch.equal(shared[0, 0], init_model(3)) and all(torch.equal(shared[i], shared[0]) for i in range(n))
    assert not torch.equal(shared[0, 1], shared[0, 2])
    local = Dfca(init_model, DfcaConfig(clusters=3, init="local"))
    whole, part = local.init(ctx(n, torch.arange(n))).bank, local.init(ctx(n, torch.arange(2, 5))).bank
    assert torch.equal(whole[2:5], part) and not torch.equal(whole[0], whole[1])


def test_the_round_merges_reports_lists_and_clusters_and_leaves_offline_clients_alone():
    n, t, seed = 10, 3, 3
    gen = torch.Generator().manual_seed(2)
    bank = torch.randn(n, 2, P, generator=gen)
    labels = torch.tensor([0, 1, 1, 0, 0, 1, 0, 1, 1, 0])
    after = torch.randn(n, P, generator=gen)
    online = torch.ones(n, dtype=torch.bool)
    online[[2, 7]] = False
    algo = Dfca(init_model, DfcaConfig(clusters=2, partners=4))
    for lo, hi in [(0, n), (4, 9)]:
        ids = torch.arange(lo, hi)
        c = ctx(n, ids, seed=seed, delivery=lambda r: Delivery(seed, r, online, 0.0, ids))
        view = RoundView(round=t, before=after[ids], after=after[ids], all_after=after, all_labels=labels)
        new, res = algo.aggregate(DfcaState(bank=bank[ids].clone()), c, view)
        drawn = plain_draws(seed, t, n, partner_bound(4, n))
        for r, i in enumerate(ids.tolist()):
            if not online[i]:
                assert torch.equal(new.bank[r], bank[i]) and int(res.received[r]) == 0
                continue
            peers = {j for j in drawn[i] | {j for j in range(n) if i in drawn[j]} if online[j]}
            own = bank[i].clone()
            own[labels[i]] = after[i]
            for cl in range(2):
                sent = [j for j in sorted(peers) if int(labels[j]) == cl]
                want = (own[cl] + after[sent].sum(0)) / (1 + len(sent))
                assert torch.allclose(new.bank[r, cl], want, atol=1e-6)
            assert torch.equal(res.models[r], new.bank[r, labels[i]])
            assert rows_of(res.averaged)[r] == peers and int(res.received[r]) == len(peers)
            assert rows_of(res.lists)[r] == {j for j in peers if labels[j] == labels[i]}
        assert torch.equal(res.assignment, labels)


@pytest.mark.parametrize("overrides,field,words", [
    (["dfca.clusters=0"], "dfca.clusters", "[1, clients"),
    (["dfca.partners=1"], "dfca.partners", "[2, clients - 1"),
    (["dfca.partners=30"], "dfca.partners", "[2, clients - 1"),
    (["dfca.init=random"], "dfca.init", "global"),
])
def test_bad_dfca_keys_are_refused_naming_the_key_and_the_fix(overrides, field, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.name=synthetic", "clients=20", "algorithm.name=dfca"] + overrides)
    assert e.value.field == field and words in str(e.value), str(e.value)


def test_lambda_is_the_reference_rule_by_default():
    assert partner_bound(0, 100) == 15 and partner_bound(0, 10) == 9 and partner_bound(0, 1200) == 50
    assert partner_bound(7, 100) == 7
