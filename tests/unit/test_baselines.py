"""Local, Random, FixTopology, Oracle; gossip mixing; neighbour metrics."""

import numpy as np
import pytest
import torch

from fedclust import upgrade
from fedclust.algorithms.aggregation import SPARSE_GOSSIP_MIN_CLIENTS, gossip, gossip_path, mixing_matrix
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.fixtopology import FixTopology
from fedclust.algorithms.local import Local
from fedclust.algorithms.oracle import Oracle
from fedclust.algorithms.random_peers import RandomPeers
from fedclust.metrics import adjusted_rand_index, cluster_recovery, neighbor_precision_recall
from fedclust.peers import PeerIndex, as_mask, mask_indices


def make_ctx(n=12, ids=None, clusters=None, seed=3):
    ids = torch.arange(n) if ids is None else torch.as_tensor(ids)
    clusters = torch.arange(n) // (n // 2) if clusters is None else clusters
    return Context(n=n, client_ids=ids, clusters=clusters, seed=seed, stage1_rounds=5,
                   w0=torch.zeros(4), device=torch.device("cpu"))


def view(t, n=12):
    w = torch.randn(n, 4)
    return RoundView(round=t, before=w, after=w, all_after=w)


def test_random_draws_k_others_and_changes_each_round():
    ctx, algo = make_ctx(), RandomPeers(k=3)
    state = algo.init(ctx)
    m1, m2 = (as_mask(algo.select(state, ctx, view(t))[1]) for t in (1, 2))
    assert (m1.sum(1) == 3).all() and not m1.diagonal().any()
    assert not torch.equal(m1, m2)


def test_fixtopology_keeps_its_draw():
    ctx, algo = make_ctx(), FixTopology(k=3)
    state = algo.init(ctx)
    m1, m2 = (as_mask(algo.select(state, ctx, view(t))[1]) for t in (1, 7))
    assert torch.equal(m1, m2) and (m1.sum(1) == 3).all() and not m1.diagonal().any()


def test_oracle_only_same_cluster():
    ctx, algo = make_ctx(), Oracle(k=4)
    state = algo.init(ctx)
    _, chosen = algo.select(state, ctx, view(1))
    m, cl = as_mask(chosen), ctx.clusters
    assert (m.sum(1) == 4).all()
    assert (cl[m.nonzero()[:, 0]] == cl[m.nonzero()[:, 1]]).all()
    for lists in (m, chosen):   # the mask and the index lists score the same
        p, r = neighbor_precision_recall(lists, cl, ctx.client_ids)
        assert torch.allclose(p, torch.ones(12, dtype=torch.float64))
        assert torch.allclose(r, torch.full((12,), 4 / 5, dtype=torch.float64))


def test_oracle_fewer_peers_than_k_takes_all():
    ctx = make_ctx(n=6, clusters=torch.tensor([0, 0, 1, 1, 1, 1]))
    algo = Oracle(k=4)
    m = as_mask(algo.select(algo.init(ctx), ctx, view(1, 6))[1])
    assert m[0].tolist() == [False, True, False, False, False, False]
    assert m[2].sum() == 3


@pytest.mark.parametrize("algo", [RandomPeers(k=3), FixTopology(k=3), Oracle(k=3)])
def test_draws_do_not_depend_on_sharding(algo):
    """Rows computed for all clients equal rows computed for two shards."""
    full_ctx = make_ctx()
    full = as_mask(algo.select(algo.init(full_ctx), full_ctx, view(4))[1])
    parts = []
    for ids in (range(0, 5), range(5, 12)):
        ctx = make_ctx(ids=list(ids))
        parts.append(as_mask(algo.select(algo.init(ctx), ctx, view(4))[1]))
    assert torch.equal(full, torch.cat(parts))


def test_local_never_averages():
    ctx = make_ctx()
    _, m = Local().select(None, ctx, view(1))
    assert m.shape == (12, 12) and not as_mask(m).any()


def test_mixing_matrix_by_hand():
    nb = torch.tensor([[False, True, True], [False, False, False], [True, False, False]])
    self_mask = torch.eye(3, dtype=torch.bool)
    m = mixing_matrix(nb, self_mask)
    expected = torch.tensor([[1 / 3, 1 / 3, 1 / 3], [0, 1, 0], [0.5, 0, 0.5]])
    assert torch.allclose(m, expected)
    w = torch.tensor([[3.0, 0.0], [6.0, 3.0], [0.0, 9.0]])
    for path in ("dense", "sparse"):
        for choice in (nb, PeerIndex.from_mask(nb)):
            assert torch.allclose(gossip(choice, torch.arange(3), w, path),
                                  torch.tensor([[3.0, 4.0], [6.0, 3.0], [1.5, 4.5]]))


def test_gossip_for_a_shard_uses_global_columns():
    """Rows of a shard (clients 2,3 of 4) average with global models."""
    nb = torch.tensor([[True, False, False, False], [False, False, True, False]])
    w = torch.arange(4.0)[:, None]
    for path in ("dense", "sparse"):
        for choice in (nb, PeerIndex.from_mask(nb)):
            out = gossip(choice, torch.tensor([2, 3]), w, path)
            assert out.flatten().tolist() == [1.0, 2.5]  # (2+0)/2, (3+2)/2


def test_mask_indices_by_hand():
    mask = torch.tensor([[False, True, False, True], [False, False, False, False], [True, True, True, False]])
    idx, valid = mask_indices(mask)
    assert valid.tolist() == [[True, True, False], [False, False, False], [True, True, True]]
    assert idx[valid].tolist() == [1, 3, 0, 1, 2]


def test_sparse_gossip_equals_the_mixing_matrix_product_and_a_shards_rows_equal_the_whole_runs():
    g = torch.Generator().manual_seed(0)
    n, P = 40, 33
    w = torch.randn(n, P, generator=g)
    nb = torch.rand(n, n, generator=g) < torch.rand(n, 1, generator=g) * 0.3     # rows of 0 to ~12 peers
    nb[5] = False                                                                 # one client alone
    eye, ids = torch.eye(n, dtype=torch.bool), torch.arange(n)
    whole = gossip(nb, ids, w, "sparse")
    assert torch.allclose(whole, gossip(nb, ids, w, "dense"), atol=1e-6)
    assert torch.equal(gossip(PeerIndex.from_mask(nb & ~eye), ids, w, "sparse"), whole)   # the index form: same bits
    assert torch.equal(whole[5], w[5])
    members = (nb & ~eye) | eye                                                  # the plain definition
    for c in (0, 17, 39):
        assert torch.allclose(whole[c], w[members[c]].mean(0), atol=1e-6)
    for lo, hi in ((0, 13), (13, 40)):                                            # two ranks' shards
        assert torch.equal(gossip(nb[lo:hi], ids[lo:hi], w, "sparse"), whole[lo:hi])
    assert gossip_path(SPARSE_GOSSIP_MIN_CLIENTS - 1) == "dense" and gossip_path(SPARSE_GOSSIP_MIN_CLIENTS) == "sparse"


def test_precision_recall_by_hand():
    clusters = torch.tensor([0, 0, 0, 1, 1])
    lists = torch.tensor([[False, True, False, True, False],   # 1 of 2 same: p=.5, r=.5
                          [False, False, False, False, False]])  # empty: p=nan, r=0
    p, r = neighbor_precision_recall(lists, clusters, torch.tensor([0, 1]))
    assert p[0] == 0.5 and r[0] == 0.5 and torch.isnan(p[1]) and r[1] == 0


def test_ari_against_hand_values():
    assert adjusted_rand_index([0, 0, 1, 1], [1, 1, 0, 0]) == pytest.approx(1.0)
    # contingency [[2,1],[0,1]]... labels true 0,0,0,1 pred 0,0,1,1:
    # index = C(2,2) + 0 + 0 + C(1,2)=1; a = C(3,2)+C(1,2)=3; b = C(2,2)+C(2,2)=2; total=6
    # expected = 3*2/6 = 1; max = 2.5 -> ari = (1-1)/(2.5-1) = 0
    assert adjusted_rand_index([0, 0, 0, 1], [0, 0, 1, 1]) == pytest.approx(0.0)
    # true 0,0,1,1,1 pred 0,0,1,1,2: index=1+1=2; a=1+3=4; b=1+1+0=2; total=10; exp=.8; max=3
    assert adjusted_rand_index([0, 0, 1, 1, 1], [0, 0, 1, 1, 2]) == pytest.approx((2 - 0.8) / (3 - 0.8))


def test_cluster_recovery_from_directed_lists():
    adj = np.zeros((6, 6), dtype=bool)
    adj[0, 1] = adj[2, 1] = True   # 0-1-2 linked only through symmetrisation
    adj[3, 4] = adj[5, 3] = True
    rec = cluster_recovery(adj, [0, 0, 0, 1, 1, 1])
    assert rec == {"num_clusters": 2, "ari": pytest.approx(1.0)}


def test_fixtopology_keeps_index_lists_and_resumes_from_a_mask_checkpoint():
    """Its state is [C, k] indices; a checkpoint of the earlier form (the [C, n] bool mask) loads to the same."""
    ctx, algo = make_ctx(), FixTopology(k=3)
    state = algo.init(ctx)
    assert state.peers.shape == (12, 3) and state.peers.dtype == torch.int64
    mask = as_mask(algo.select(state, ctx, view(1))[1])
    old = algo.load_state_dict(ctx, upgrade.algorithm_state({"clients": {"peers": mask}, "server": {}}, algo, 12))
    assert torch.equal(old.peers, state.peers)
    again = algo.load_state_dict(ctx, algo.state_dict(state))
    assert torch.equal(again.peers, state.peers)
