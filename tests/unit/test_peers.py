"""Index lists of a round's choice (fedclust.peers) and the draws that make them (rng.choose_indices): the same
peers, in the same order, as the bool [C, n] masks they replace."""

import pytest
import torch

from fedclust import rng
from fedclust.metrics import neighbor_precision_recall
from fedclust.peers import PeerIndex, as_indices, as_mask, mask_indices, peer_counts


def test_peer_index_by_hand():
    mask = torch.tensor([[False, True, False, True], [False, False, False, False], [True, False, True, False]])
    p = PeerIndex.from_mask(mask)
    assert p.shape == (3, 4)
    assert p.idx.tolist() == [[1, 3], [0, 0], [0, 2]]
    assert p.valid.tolist() == [[True, True], [False, False], [True, True]]
    assert p.counts().tolist() == [2, 0, 2] and peer_counts(mask).tolist() == [2, 0, 2]
    assert torch.equal(p.mask(), mask) and torch.equal(as_mask(p), mask) and as_mask(mask) is mask
    assert torch.equal(as_indices(p)[0], mask_indices(mask)[0])
    e = PeerIndex.empty(2, 5)
    assert e.shape == (2, 5) and e.counts().tolist() == [0, 0] and not e.mask().any()
    with pytest.raises(ValueError, match=r"\[C, m\]"):
        PeerIndex(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 2, dtype=torch.bool), 5)


@pytest.mark.parametrize("chunk", [3, 17, 2**22])   # rows in several chunks, one row per chunk or so, all at once
def test_choose_indices_picks_what_choose_from_mask_picks(monkeypatch, chunk):
    """The reference: choose_from_mask over the whole [C, n] allowed mask (the client itself never allowed)."""
    monkeypatch.setattr(rng, "CHOOSE_CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(0)
    n = 23
    clients = torch.arange(4, 19)
    self_mask = torch.zeros(len(clients), n, dtype=torch.bool)
    self_mask[torch.arange(len(clients)), clients] = True
    allowed = (torch.rand(len(clients), n, generator=g) < 0.4) & ~self_mask
    allowed[0] = False                      # nobody allowed
    allowed[1, :3] = True                   # at least three
    for k, rows in ((5, None), (5, allowed), (1, allowed), (30, allowed)):
        want = rng.choose_from_mask(7, 3, "neighbors", clients, ~self_mask if rows is None else rows, k)
        fn = None if rows is None else (lambda lo, hi: allowed[lo:hi])
        idx, valid = rng.choose_indices(7, 3, "neighbors", clients, n, k, fn)
        assert idx.shape == (len(clients), min(k, n))
        got = PeerIndex(idx, valid, n)
        assert torch.equal(got.mask(), want), (k, rows is None)
        ref_idx, ref_valid = mask_indices(want)
        assert torch.equal(valid.sum(1), ref_valid.sum(1)) and torch.equal(idx[valid], ref_idx[ref_valid])
        ordered = torch.where(valid, idx, torch.full_like(idx, n))
        assert torch.equal(ordered, ordered.sort(1).values)          # ascending, padding last
        assert not (valid & (idx == clients[:, None])).any()           # never the client itself


def test_choose_indices_is_uniform_over_the_others():
    """Each of the n - 1 others is drawn k/(n - 1) of the time (chi-square, 2,000 draws of client 3's row)."""
    from scipy.stats import chisquare

    n, k, draws = 12, 4, 2000
    hits = torch.zeros(n)
    for r in range(draws):
        idx, valid = rng.choose_indices(1, r, "neighbors", torch.tensor([3]), n, k)
        hits.index_add_(0, idx[valid], torch.ones(int(valid.sum())))
    assert hits[3] == 0
    others = torch.cat([hits[:3], hits[4:]]).numpy()
    assert others.sum() == draws * k
    assert chisquare(others).pvalue > 1e-3


def test_precision_recall_of_index_lists_equal_the_masks():
    g = torch.Generator().manual_seed(2)
    n = 30
    clusters = torch.arange(n) % 3
    ids = torch.arange(10, 20)
    mask = torch.rand(len(ids), n, generator=g) < 0.3
    mask[torch.arange(len(ids)), ids] = False
    mask[4] = False
    p1, r1 = neighbor_precision_recall(mask, clusters, ids)
    p2, r2 = neighbor_precision_recall(PeerIndex.from_mask(mask), clusters, ids)
    torch.testing.assert_close(p1, p2, equal_nan=True)
    torch.testing.assert_close(r1, r2, equal_nan=True)
    assert torch.isnan(p2[4]) and r2[4] == 0


def test_received_models_count_the_union_once_and_never_the_client():
    """By index lists equals the plain rule on masks: |(averaged ∪ extra) \\ {i}|."""
    from fedclust.algorithms.base import received_models

    g = torch.Generator().manual_seed(5)
    n, ids = 25, torch.arange(7, 15)
    own = torch.zeros(len(ids), n, dtype=torch.bool)
    own[torch.arange(len(ids)), ids] = True
    averaged = (torch.rand(len(ids), n, generator=g) < 0.2) & ~own
    extra = torch.rand(len(ids), n, generator=g) < 0.3
    extra[0, ids[0]] = True                        # a pool that holds the client itself counts it not
    want = ((averaged | extra) & ~own).sum(1)
    by_index = PeerIndex.from_mask(averaged)
    assert torch.equal(received_models(by_index, extra, ids), want)
    assert torch.equal(received_models(averaged, extra, ids), want)
    assert torch.equal(received_models(by_index, None, ids), averaged.sum(1))
    assert torch.equal(received_models(averaged, None, ids), averaged.sum(1))
