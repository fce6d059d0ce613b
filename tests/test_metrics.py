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
