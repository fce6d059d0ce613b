"""Counts of (client, peer) pairs as per-client lists (fedclust.algorithms.peer_counts), against the [C, n]
table they replace; the figure's table from them (fedclust.lists.count_table); state a checkpoint no longer
keeps."""

import numpy as np
import pytest
import torch

from fedclust import upgrade
from fedclust.algorithms.peer_counts import (
    add_counts,
    add_mask,
    counted_more_than,
    counts_matrix,
    empty_counts,
    from_matrix,
)
from fedclust.lists import count_table


def test_lists_by_hand():
    peers, counts = empty_counts(3)
    assert peers.shape == (3, 0)
    idx = torch.tensor([[4, 1, 0], [2, 0, 0], [0, 0, 0]])
    valid = torch.tensor([[True, True, False], [True, False, False], [False, False, False]])
    peers, counts = add_counts(peers, counts, idx, valid)
    assert peers.tolist() == [[1, 4], [2, -1], [-1, -1]] and counts.tolist() == [[1, 1], [1, 0], [0, 0]]
    peers, counts = add_counts(peers, counts, torch.tensor([[4, 3], [0, 0], [1, 5]]),
                               torch.tensor([[True, True], [True, False], [True, True]]))
    assert peers.tolist() == [[1, 3, 4], [0, 2, -1], [1, 5, -1]]
    assert counts.tolist() == [[1, 1, 2], [1, 1, 0], [1, 1, 0]]
    assert counts_matrix(peers, counts, 6).tolist() == [[0, 1, 0, 1, 2, 0], [1, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 1]]
    assert counted_more_than(peers, counts, 1, 6).nonzero().tolist() == [[0, 4]]


def test_lists_equal_the_table_over_many_rounds():
    g = torch.Generator().manual_seed(0)
    C, n = 9, 17
    table = torch.zeros(C, n, dtype=torch.int64)
    peers, counts = empty_counts(C)
    fixed = empty_counts(C, n)
    for r in range(30):
        mask = torch.rand(C, n, generator=g) < 0.15
        mask[2] = False                       # a row that never counts anybody
        table += mask
        peers, counts = add_mask(peers, counts, mask)
        fixed = add_mask(*fixed, mask, width=n)
        assert torch.equal(counts_matrix(peers, counts, n), table), r
        assert torch.equal(counts_matrix(*fixed, n), table) and fixed[0].shape == (C, n)
        assert peers.shape[1] == int((table > 0).sum(1).max())   # as wide as the fullest row needs
        real = peers >= 0
        assert torch.equal(real, torch.arange(peers.shape[1])[None, :] < real.sum(1, keepdim=True))  # padding last
        ordered = peers[:, 1:] > peers[:, :-1]
        assert ordered[real[:, 1:]].all()      # ascending
        for threshold in (0, 2, 5):
            assert torch.equal(counted_more_than(peers, counts, threshold, n), table > threshold)
    back = from_matrix(table)
    assert torch.equal(counts_matrix(*back, n), table) and torch.equal(back[0], peers)
    wide = from_matrix(table, width=n)
    assert wide[0].shape == (C, n) and torch.equal(counts_matrix(*wide, n), table)


def test_a_fixed_width_too_small_is_an_error():
    peers, counts = empty_counts(1, 2)
    with pytest.raises(ValueError, match="3 distinct peers, more than the 2 slots"):
        add_mask(peers, counts, torch.tensor([[True, True, True, False]]), width=2)
    with pytest.raises(ValueError, match="more than the 1 slots"):
        from_matrix(torch.tensor([[0, 1, 2]]), width=1)


def test_count_table_whole_and_in_blocks():
    peers = np.array([[1, 3, -1], [0, -1, -1], [2, 3, 4], [-1, -1, -1], [0, 1, 2]])
    counts = np.array([[2, 1, 0], [5, 0, 0], [1, 1, 1], [0, 0, 0], [3, 1, 4]])
    dense = np.zeros((5, 5), dtype=np.int64)
    for i in range(5):
        for p, c in zip(peers[i], counts[i]):
            if p >= 0:
                dense[i, p] += c
    table, block = count_table(peers, counts, 5)
    assert block == 1 and np.array_equal(table, dense)
    table, block = count_table(peers, counts, 5, max_side=2)   # blocks of 3 clients: {0, 1, 2}, {3, 4}
    assert block == 3 and table.tolist() == [[dense[:3, :3].sum(), dense[:3, 3:].sum()],
                                              [dense[3:, :3].sum(), dense[3:, 3:].sum()]]


def test_state_an_earlier_version_kept_is_dropped_and_unknown_state_refused():
    from panm_build import make_panm_grad
    from test_cni_hnm import config, make_ctx

    n = 6
    alg = make_panm_grad(config(T1=2))
    ctx = make_ctx(range(n), n, torch.arange(n) // 3, 4, 2)
    saved = alg.state_dict(alg.init(ctx))
    assert sorted(saved["clients"]) == ["hnm_failed", "neighbors"]   # the round's similarities are not saved
    saved["clients"]["last_similarity"] = torch.zeros(n, n)          # as checkpoints before this version
    assert torch.equal(alg.load_state_dict(ctx, upgrade.algorithm_state(saved, alg, n)).neighbors,
                       saved["clients"]["neighbors"])
    saved["clients"]["mystery"] = torch.zeros(n)
    with pytest.raises(ValueError, match=r"fields \['mystery'\] that this version does not know"):
        alg.load_state_dict(ctx, upgrade.algorithm_state(saved, alg, n))


def test_row_counts_in_chunks_equal_the_sum(monkeypatch):
    from fedclust import peers

    g = torch.Generator().manual_seed(3)
    mask = torch.rand(37, 11, generator=g) < 0.3
    want = mask.sum(1)
    for chunk in (1, 11, 50, 2**22):   # one row at a time, a row per chunk, several rows, all at once
        monkeypatch.setattr(peers, "ROW_COUNT_CHUNK_ELEMENTS", chunk)
        assert torch.equal(peers.row_counts(mask), want)
    assert peers.row_counts(torch.zeros(0, 5, dtype=torch.bool)).shape == (0,)


def test_masks_packed_eight_columns_a_byte_for_checkpoints():
    from fedclust.checkpoint import pack_bits, unpack_bits

    mask = torch.tensor([[True, False, False, False, False, False, False, False, True, True],
                         [False] * 9 + [True]])
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.tolist() == [[1, 3], [0, 2]]   # column 8b + k is bit k of byte b
    assert torch.equal(unpack_bits(packed, 10), mask)
    g = torch.Generator().manual_seed(5)
    for rows, width in ((0, 7), (4, 0), (6, 8), (5, 33)):
        m = torch.rand(rows, width, generator=g) < 0.4
        assert pack_bits(m).shape == (rows, (width + 7) // 8) and torch.equal(unpack_bits(pack_bits(m), width), m)
