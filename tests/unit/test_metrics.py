"""The adjusted Rand index against a plain reference: pairs of clients counted one by one."""

from itertools import combinations

import numpy as np
import pytest

from fedclust.metrics import adjusted_rand_index


def ari_by_pairs(a, b):
    """Hubert and Arabie's index from pair counts taken pair by pair: together in both, in a, in b."""
    both = in_a = in_b = total = 0
    for i, j in combinations(range(len(a)), 2):
        same_a, same_b = a[i] == a[j], b[i] == b[j]
        both += same_a and same_b
        in_a += same_a
        in_b += same_b
        total += 1
    expected = in_a * in_b / total
    top = (in_a + in_b) / 2
    return 1.0 if top == expected else (both - expected) / (top - expected)


def test_ari_equals_the_pair_by_pair_count():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 40))
        a = rng.integers(0, int(rng.integers(1, 6)), n)
        b = rng.integers(0, int(rng.integers(1, 6)), n)
        assert adjusted_rand_index(a, b) == pytest.approx(ari_by_pairs(a, b), abs=1e-12)


def test_ari_hand_values():
    assert adjusted_rand_index([0, 0, 1, 1], [5, 5, 2, 2]) == 1.0        # labels' names do not matter
    assert adjusted_rand_index([0, 0, 0, 0], [0, 0, 0, 0]) == 1.0        # one cluster on both sides
    assert adjusted_rand_index([0, 1, 2], [2, 0, 1]) == 1.0              # everyone alone on both sides
    # [0,0,1,1] vs [0,1,0,1]: no pair together in both; 2 pairs in each; expected 2*2/6: (0 - 2/3) / (2 - 2/3)
    assert adjusted_rand_index([0, 0, 1, 1], [0, 1, 0, 1]) == pytest.approx(-0.5)


def test_index_lists_by_hand_and_from_an_adjacency():
    from fedclust.lists import index_lists, list_edges

    adj = np.array([[0, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 1], [0, 0, 1, 0]], dtype=bool)
    idx = index_lists(adj)
    assert idx.dtype == np.int32 and idx.tolist() == [[1, 2], [-1, -1], [0, 3], [2, -1]]
    assert index_lists(idx) is idx                                   # index lists are kept as they are
    i, j = list_edges(idx)
    assert list(zip(i.tolist(), j.tolist())) == [(0, 1), (0, 2), (2, 0), (2, 3), (3, 2)]
    assert index_lists(np.zeros((3, 3), dtype=bool)).shape == (3, 0)   # no lists: no columns
    assert list_edges(np.full((3, 0), -1, dtype=np.int32))[0].size == 0


def test_graph_components_of_index_lists_equal_the_dense_symmetrised_graphs():
    """Against scipy on the dense symmetrised adjacency (the plain reference), on random lists."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    from fedclust.lists import graph_components, index_lists

    rng = np.random.default_rng(0)
    for n, p in ((1, 0.0), (7, 0.1), (40, 0.03), (40, 0.2)):
        adj = rng.random((n, n)) < p
        np.fill_diagonal(adj, False)
        _, want = connected_components(csr_matrix(adj | adj.T), directed=False)
        assert np.array_equal(graph_components(index_lists(adj)), want)
        assert np.array_equal(graph_components(adj), want)
    # by hand: 0-1 (1 lists 0), 2-3-4 (2 lists 3, 4 lists 3), 5 alone
    lists = np.array([[-1, -1], [0, -1], [3, -1], [-1, -1], [3, -1], [-1, -1]], dtype=np.int32)
    assert graph_components(lists).tolist() == [0, 0, 1, 1, 1, 2]
