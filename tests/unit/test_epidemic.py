"""Epidemic Learning (fedclust/algorithms/epidemic.py) against its rule
written plainly: who pushes to whom (s lowest keys among the others per
sender), whom a client receives from on any shard of clients, the average
(w + Σ received)/(m + 1), EL-Oracle's fresh s-regular graph, and its keys."""

from __future__ import annotations

import math

import pytest
import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.epidemic import Epidemic, EpidemicConfig, fanout, incoming
from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.network import Network
from fedclust.peers import PeerIndex, as_mask
from fedclust.schema import NetworkConfig


def _ctx(n, ids, seed=3, graph=lambda t: None):
    return Context(n=n, client_ids=ids, clusters=torch.arange(n) % 2, seed=seed, stage1_rounds=1,
                   w0=torch.zeros(4), device=torch.device("cpu"), graph=graph)


def _view(t, n, ids):
    w = torch.randn(n, 4, generator=torch.Generator().manual_seed(t))
    return RoundView(round=t, before=w[ids], after=w[ids], all_after=w)


def plain_pushes(seed, t, n, s, allowed=None):
    """Sender j pushes to the s others of lowest key uniform(seed, t, "epidemic_push", j, i) (among allowed)."""
    keys = rng.client_keys(seed, t, "epidemic_push", torch.arange(n), n)
    out = []
    for j in range(n):
        others = [i for i in range(n) if i != j and (allowed is None or allowed[j, i])]
        out.append(set(sorted(others, key=lambda i: float(keys[j, i]))[:s]))
    return out


@pytest.mark.parametrize("lo,hi", [(0, 20), (5, 13)])
def test_a_client_receives_from_every_peer_that_pushed_to_it(lo, hi):
    n, s, t = 20, 3, 4
    algo = Epidemic(EpidemicConfig(s=s))
    ids = torch.arange(lo, hi)
    _, choice = algo.select(None, _ctx(n, ids), _view(t, n, ids))
    pushes = plain_pushes(3, t, n, s)
    for r, i in enumerate(range(lo, hi)):
        assert set(as_mask(choice)[r].nonzero().flatten().tolist()) == {j for j in range(n) if i in pushes[j]}
    total = sum(len(p) for p in pushes)
    assert total == n * s                                     # every sender pushes s models


def test_the_average_is_own_plus_received_over_m_plus_1():
    n, s = 12, 2
    algo = Epidemic(EpidemicConfig(s=s))
    ids = torch.arange(n)
    view = _view(3, n, ids)
    _, result = algo.aggregate(None, _ctx(n, ids), view)
    w = view.all_after
    for i in range(n):
        got = as_mask(result.averaged)[i].nonzero().flatten().tolist()
        want = (w[i] + w[got].sum(0)) / (len(got) + 1)       # m = 0 keeps its own model
        assert torch.allclose(result.models[i], want, atol=1e-6)
    assert int(result.received.sum()) == n * s


def test_incoming_inverts_the_pushes():
    pushes = PeerIndex(torch.tensor([[1, 2], [0, 0], [1, 3], [0, 2]]),
                       torch.tensor([[True, True], [True, False], [True, True], [True, True]]), 4)
    got = incoming(pushes, 0, 4)
    assert [as_mask(got)[i].nonzero().flatten().tolist() for i in range(4)] == [[1, 3], [0, 2], [0, 3], [2]]
    assert as_mask(incoming(pushes, 1, 3)).tolist() == as_mask(got)[1:3].tolist()


def test_on_a_graph_a_client_pushes_among_its_neighbours():
    n, s, t = 16, 2, 3
    network = Network(NetworkConfig(graph="regular", degree=4), n, 3)
    g = network.graph(t)
    algo = Epidemic(EpidemicConfig(s=s))
    ids = torch.arange(n)
    _, choice = algo.select(None, _ctx(n, ids, graph=network.graph), _view(t, n, ids))
    pushes = plain_pushes(3, t, n, s, g.rows(ids))
    for i in range(n):
        assert set(as_mask(choice)[i].nonzero().flatten().tolist()) == {j for j in range(n) if i in pushes[j]}
        assert not (as_mask(choice)[i] & ~g.rows(torch.tensor([i]))[0]).any()


def test_the_oracle_averages_with_a_fresh_s_regular_graph_each_round():
    n, s = 20, 4
    algo = Epidemic(EpidemicConfig(variant="oracle", s=s))
    ids = torch.arange(n)
    m3 = as_mask(algo.select(None, _ctx(n, ids), _view(3, n, ids))[1])
    m4 = as_mask(algo.select(None, _ctx(n, ids), _view(4, n, ids))[1])
    assert m3.sum(1).tolist() == [s] * n and torch.equal(m3, m3.T)     # s-regular, undirected
    assert not torch.equal(m3, m4)                                       # fresh each round
    part = as_mask(algo.select(None, _ctx(n, torch.arange(6, 11)), _view(3, n, torch.arange(6, 11)))[1])
    assert torch.equal(part, m3[6:11])                                   # the same graph on every process


def test_s_defaults_to_log2_n_and_its_keys_are_checked():
    assert fanout(0, 96) == 7 and fanout(0, 100) == 7 and fanout(3, 100) == 3 and fanout(0, 2) == 1
    cfg = load_config(None, ["data.name=synthetic", "clients=16", "algorithm.name=epidemic"])
    assert fanout(cfg.epidemic.s, 16) == math.ceil(math.log2(16))
    for overrides, field in [(["epidemic.s=16"], "epidemic.s"), (["epidemic.s=-1"], "epidemic.s"),
                             (["epidemic.variant=oracle", "epidemic.s=3", "clients=15"], "epidemic.s"),
                             (["epidemic.variant=oracle", "network.graph=ring"], "network.graph"),
                             (["epidemic.variant=push"], "epidemic.variant")]:
        with pytest.raises(ConfigError) as e:
            load_config(None, ["data.name=synthetic", "clients=16", "algorithm.name=epidemic", *overrides])
        assert e.value.field == field, overrides
