"""Similarity metrics (papers/001 Eq. 3-6) against plain per-pair loops."""

import math

import torch

from fedclust.algorithms.similarity import NOT_COMPUTED, grad_similarity, loss_similarity, padded_pools


def plain_cos(u, v):
    nu, nv = math.sqrt(sum(x * x for x in u)), math.sqrt(sum(x * x for x in v))
    if nu == 0 or nv == 0:
        return 0.0
    return sum(x * y for x, y in zip(u, v)) / (nu * nv)


def world(n=7, P=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    w0 = torch.randn(P, generator=g, dtype=torch.float64)
    before = w0 + torch.randn(n, P, generator=g, dtype=torch.float64)
    after = before + torch.randn(n, P, generator=g, dtype=torch.float64)
    after[2] = before[2]          # client 2 did not move this round: Δ = 0
    after[4] = w0                 # client 4 is back at w0: w - w0 = 0
    before[4] = w0 + 1.0
    return w0, before, after


def test_grad_similarity_equals_per_pair_cosines():
    w0, before, after = world()
    n = after.shape[0]
    alpha = 0.3
    got = grad_similarity(after, before, w0, alpha, own=slice(2, 6))   # a rank holding clients 2..5
    assert got.shape == (4, n)
    for block in (1, 4, 10):                     # parameter blocks of every size give the same matrix
        assert torch.allclose(grad_similarity(after, before, w0, alpha, own=slice(2, 6), block=block), got,
                              atol=1e-12)
    for r, i in enumerate(range(2, 6)):
        for j in range(n):
            d_i, d_j = (after[i] - before[i]).tolist(), (after[j] - before[j]).tolist()
            t_i, t_j = (after[i] - w0).tolist(), (after[j] - w0).tolist()
            want = alpha * plain_cos(d_i, d_j) + (1 - alpha) * plain_cos(t_i, t_j)
            assert abs(got[r, j].item() - want) < 1e-12, (i, j)


def test_grad_similarity_is_symmetric_and_finite():
    w0, before, after = world(n=9, P=5, seed=1)
    s = grad_similarity(after, before, w0, 0.5)
    assert torch.isfinite(s).all()
    assert torch.allclose(s, s.T, atol=1e-12)
    assert s.abs().max() <= 1 + 1e-12


def make_pair_loss(targets, own_ids, calls):
    """Fake engine: loss of model m on client c's data = squared distance to c's target, plus 0.5."""
    def pair_loss(models, local_index):
        calls.append(models.shape[0])
        t = targets[own_ids[local_index]]
        return ((models - t) ** 2).sum(1) + 0.5
    return pair_loss


def test_loss_similarity_equals_per_pair_call():
    g = torch.Generator().manual_seed(3)
    n, P = 8, 6
    all_after = torch.randn(n, P, generator=g)
    targets = torch.randn(n, P, generator=g)
    own = torch.tensor([3, 4, 5])
    mask = torch.rand(3, n, generator=g) < 0.5
    mask[own - 3, own] = False
    calls = []
    got = loss_similarity(make_pair_loss(targets, own, calls), all_after, mask)
    for r in range(3):
        for j in range(n):
            if mask[r, j]:
                loss = ((all_after[j] - targets[own[r]]) ** 2).sum() + 0.5
                assert torch.allclose(got[r, j], 1.0 / loss, rtol=1e-6), (r, j)
            else:
                assert got[r, j].item() == NOT_COMPUTED
    assert calls == [int(mask.sum())]          # one vectorized call for all pairs

    chunked_calls = []
    chunked = loss_similarity(make_pair_loss(targets, own, chunked_calls), all_after, mask, chunk=3)
    assert torch.equal(chunked, got)
    assert max(chunked_calls) <= 3 and sum(chunked_calls) == int(mask.sum())


def test_loss_similarity_zero_loss_and_empty_mask():
    all_after = torch.zeros(3, 2)
    zero_loss = lambda models, idx: torch.zeros(models.shape[0])  # noqa: E731
    mask = torch.tensor([[False, True, True]])
    s = loss_similarity(zero_loss, all_after, mask)
    assert torch.isfinite(s[0, 1:]).all() and s[0, 0].item() == NOT_COMPUTED
    empty = loss_similarity(zero_loss, all_after, torch.zeros(1, 3, dtype=torch.bool))
    assert (empty == NOT_COMPUTED).all()


def test_padded_pools_by_hand():
    mask = torch.tensor([[False, True, False, True], [True, True, True, False], [False, False, False, False]])
    peers, valid = padded_pools(mask)
    assert peers.tolist() == [[1, 3, 1], [0, 1, 2], [0, 0, 0]]
    assert valid.tolist() == [[True, True, False], [True, True, True], [False, False, False]]


def test_loss_similarity_pool_path_equals_pair_path():
    """The grouped pool_loss path gives the pairwise path's matrix, padding never written."""
    g = torch.Generator().manual_seed(4)
    n, P = 9, 5
    all_after = torch.randn(n, P, generator=g)
    targets = torch.randn(n, P, generator=g)
    own = torch.tensor([2, 3, 4, 5])
    mask = torch.rand(4, n, generator=g) < 0.4
    mask[0] = False
    mask[0, 8] = True                        # a row of one peer: padded with column 8 twice
    mask[torch.arange(4), own] = False

    def pool_loss(models, peers):
        return ((models[peers] - targets[own][:, None, :]) ** 2).sum(2) + 0.5

    want = loss_similarity(make_pair_loss(targets, own, []), all_after, mask)
    got = loss_similarity(None, all_after, mask, pool_loss=pool_loss)
    assert torch.allclose(got, want, rtol=1e-6) and torch.equal(got == NOT_COMPUTED, ~mask)


def test_grad_similarity_on_the_pools_equals_the_dense_one_there_and_a_shards_rows_the_whole_runs():
    from fedclust.algorithms.similarity import POOL_BLOCK, grad_similarity_pool

    g = torch.Generator().manual_seed(4)
    n, P = 30, POOL_BLOCK + 123                               # two parameter blocks
    before = torch.randn(n, P, generator=g)
    after = before + 0.1 * torch.randn(n, P, generator=g)
    w0 = torch.randn(P, generator=g)
    pool = torch.rand(n, n, generator=g) < 0.25
    pool &= ~torch.eye(n, dtype=torch.bool)
    pool[3] = False                                           # a client with an empty pool
    dense = grad_similarity(after, before, w0, 0.3)
    full_rows = torch.zeros(n, dtype=torch.bool)
    full_rows[0] = True
    got = grad_similarity_pool(after, before, w0, 0.3, pool, full_rows=full_rows)
    assert torch.allclose(got[pool], dense[pool], atol=1e-5)
    assert torch.isnan(got[1:][~pool[1:]]).all()              # nothing else computed ...
    assert torch.allclose(got[0], dense[0], atol=1e-5)        # ... but client 0's whole row
    whole = grad_similarity_pool(after, before, w0, 0.3, pool)
    for lo, hi in ((0, 11), (11, 30)):                       # two ranks' shards, pools of other widths
        part = grad_similarity_pool(after, before, w0, 0.3, pool[lo:hi], own=slice(lo, hi))
        assert torch.equal(part[pool[lo:hi]], whole[lo:hi][pool[lo:hi]])


def test_pool_scores_hold_the_matrix_on_the_pool_and_feed_hnm_alike():
    """The scores PANM and PENS use (C·m values) are the [C, n] similarity on the pool: the same top k, the
    same HNM step, the same record; client 0's row is whole where the similarity computed it."""
    from fedclust.algorithms.cni import top_k_in_mask, top_k_of_pool
    from fedclust.algorithms.hnm import hnm_update
    from fedclust.algorithms.similarity import PoolScores, client0_similarity, pool_similarity, similarity_matrix

    g = torch.Generator().manual_seed(4)
    C, n = 6, 15
    sim = torch.randn(C, n, generator=g)
    neighbors = torch.rand(C, n, generator=g) < 0.3
    cand = (torch.rand(C, n, generator=g) < 0.3) & ~neighbors
    sample = neighbors & (torch.rand(C, n, generator=g) < 0.7)
    pool = cand | sample
    scores = PoolScores.from_matrix(sim, pool)
    assert torch.equal(scores.matrix(n)[pool], sim[pool]) and torch.isnan(scores.matrix(n)[~pool]).all()
    assert torch.equal(top_k_of_pool(scores.values, scores.idx, scores.valid, 2, n), top_k_in_mask(sim, pool, 2))
    a, b = hnm_update(neighbors, cand, sample, sim), hnm_update(neighbors, cand, sample, scores)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    kept = similarity_matrix(pool, pool_similarity(scores))
    assert torch.equal(kept[pool], sim[pool]) and torch.isnan(kept[~pool]).all()
    ids = torch.arange(C)
    row = client0_similarity(scores, ids, n)                     # the pool of client 0 only
    want = torch.where(pool[0], sim[0], torch.full_like(sim[0], float("nan")))
    want[0] = float("nan")
    assert torch.allclose(row, want, equal_nan=True)
    whole = client0_similarity(PoolScores.from_matrix(sim, pool, row0=sim[0]), ids, n)
    assert torch.isnan(whole[0]) and torch.equal(whole[1:], sim[0, 1:])
    assert client0_similarity(scores, ids + 1, n) is None       # client 0 is on another rank
