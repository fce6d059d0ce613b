"""CFL math (fedclust.algorithms.cfl) against hand values, plain loops and
scipy's complete-linkage clustering."""

import numpy as np
import pytest
import torch

from fedclust.algorithms.cfl import (
    REFERENCE_ROUND1_NORM,
    bipartition,
    check_gamma_max,
    cross_similarity,
    pairwise_cosine,
    scaled_thresholds,
    separation_bound,
    should_split,
    split_cluster,
    split_is_separated,
    update_norms,
)
from fedclust.errors import ConfigError


def test_pairwise_cosine_matches_reference_loop():
    g = torch.Generator().manual_seed(0)
    u = torch.randn(6, 13, generator=g, dtype=torch.float64)
    u[4] = 0.0                                                      # zero update: cosine 0
    ref = torch.zeros(6, 6, dtype=torch.float64)
    for i in range(6):                                              # CFL reference code's pairwise_angles
        for j in range(6):
            ref[i, j] = torch.sum(u[i] * u[j]) / (torch.norm(u[i]) * torch.norm(u[j]) + 1e-12)
    assert torch.allclose(pairwise_cosine(u), ref)
    assert torch.allclose(torch.diag(pairwise_cosine(u))[[0, 1, 2, 3, 5]], torch.ones(5, dtype=torch.float64))


def test_update_norms_by_hand():
    u = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 0.3]])
    mean_norm, max_norm = update_norms(u)
    assert mean_norm.item() == pytest.approx(0.1)
    assert max_norm.item() == pytest.approx(2.0)
    mean_norm, _ = update_norms(u, torch.tensor([1.0, 0.0, 1.0]))  # weighted: mean of rows 0 and 2
    assert mean_norm.item() == pytest.approx(np.hypot(1.0, 0.15))


def test_should_split_by_hand():
    u = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 0.3]])         # mean 0.1 < 0.4, max 2 > 1.6
    assert should_split(u, 0.4, 1.6)
    assert not should_split(u[:2], 0.4, 1.6)                        # only 2 clients: never
    assert not should_split(u, 0.4, 1.6, min_clients=4)
    assert not should_split(u, 0.05, 1.6)                           # mean not small enough
    assert not should_split(u, 0.4, 2.5)                            # no client large enough
    assert not should_split(u + torch.tensor([1.0, 0.0]), 0.4, 1.6)  # mean norm 1 > 0.4
    assert not should_split(torch.zeros(0, 2), 0.4, 1.6)


@pytest.mark.parametrize("eps1,eps2", [(0.0, 1.6), (0.4, -1.0), (float("nan"), 1.6)])
def test_should_split_bad_thresholds(eps1, eps2):
    with pytest.raises(ConfigError, match="cfl.eps"):
        should_split(torch.ones(3, 2), eps1, eps2)


def test_scaled_thresholds_by_hand():
    assert REFERENCE_ROUND1_NORM == 3.2
    assert scaled_thresholds(3.2) == pytest.approx((0.4, 1.6))     # the reference's u_1: its absolute values
    assert scaled_thresholds(1.6) == pytest.approx((0.2, 0.8))     # half its round-1 update: half the thresholds
    assert scaled_thresholds(1.12) == pytest.approx((0.14, 0.56))  # u_1 / 8 and u_1 / 2
    assert scaled_thresholds(6.4, eps1=0.1, eps2=1.0) == pytest.approx((0.2, 2.0))
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="round1_norm"):
            scaled_thresholds(bad)


def test_cross_similarity_by_hand():
    S = torch.tensor([[1.0, 0.9, -0.2, 0.1],
                      [0.9, 1.0, 0.3, -0.5],
                      [-0.2, 0.3, 1.0, 0.8],
                      [0.1, -0.5, 0.8, 1.0]])
    a, b = torch.tensor([0, 1]), torch.tensor([2, 3])
    assert cross_similarity(S, a, b) == pytest.approx(0.3)          # pair (1, 2)
    assert cross_similarity(S, torch.tensor([0]), torch.tensor([1, 2, 3])) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="non-empty"):
        cross_similarity(S, a, torch.tensor([], dtype=torch.int64))


def test_separation_bound_by_hand():
    assert separation_bound(-1.0) == pytest.approx(1.0)             # opposite updates: any gamma < 1 passes
    assert separation_bound(0.0) == pytest.approx(np.sqrt(0.5))
    assert separation_bound(0.5) == pytest.approx(0.5)
    assert separation_bound(1.0) == pytest.approx(0.0)
    # the bound is cos(2 arcsin gamma) = 1 - 2 gamma^2 solved for gamma
    for g in (0.1, 0.3, 0.6):
        assert separation_bound(np.cos(2 * np.arcsin(g))) == pytest.approx(g)
    with pytest.raises(ValueError, match="cosine"):
        separation_bound(1.5)


def test_split_is_separated_by_hand():
    assert split_is_separated(-0.1, 0.5)                # sqrt(0.55) = 0.74 > 0.5
    assert split_is_separated(0.49, 0.5)                # sqrt(0.255) = 0.505 > 0.5
    assert not split_is_separated(0.5, 0.5)             # bound 0.5 is not > 0.5
    assert not split_is_separated(0.6, 0.5)
    assert not split_is_separated(0.1, 0.7)             # sqrt(0.45) = 0.67 < 0.7
    assert split_is_separated(0.99, 0.0)                # gamma_max = 0: the reference code's (no) test
    assert not split_is_separated(1.0, 0.0)


@pytest.mark.parametrize("gamma", [-0.1, 1.0, 2.0, float("nan")])
def test_gamma_max_out_of_range(gamma):
    with pytest.raises(ConfigError, match="cfl.gamma_max"):
        check_gamma_max(gamma)
    with pytest.raises(ConfigError, match="cfl.gamma_max"):
        split_is_separated(0.0, gamma)


def test_split_cluster_by_hand():
    d = torch.tensor([1.0, 0.0, 0.0])
    e = torch.tensor([0.0, 1.0, 0.0])
    u = torch.stack([d, -d + 0.1 * e, d + 0.2 * e, -d])
    side, alpha = split_cluster(u)
    assert side.tolist() == [False, True, False, True]
    S = pairwise_cosine(u)
    assert alpha == pytest.approx(float(S[[0, 2]][:, [1, 3]].max()))
    assert alpha < 0 and split_is_separated(alpha, 0.5)


def _scipy_labels(S, k):
    # scipy imported where used: at module level every collecting worker pays for it
    from scipy.cluster.hierarchy import cut_tree, linkage
    from scipy.spatial.distance import squareform

    D = np.clip(1.0 - S, 0.0, None)                 # monotone in -S: same complete-linkage tree
    np.fill_diagonal(D, 0.0)
    Z = linkage(squareform(D, checks=False), method="complete")
    return cut_tree(Z, n_clusters=k).flatten()


def _same_partition(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return all(len(set(b[a == x])) == 1 for x in set(a)) and len(set(a)) == len(set(b))


@pytest.mark.parametrize("seed", range(8))
def test_bipartition_matches_scipy(seed):
    g = torch.Generator().manual_seed(seed)
    m = 3 + seed * 4
    u = torch.randn(m, 20, generator=g, dtype=torch.float64)
    u[: m // 2] += 1.5 * torch.randn(20, generator=g, dtype=torch.float64)   # two loose groups
    S = pairwise_cosine(u)
    a, b = bipartition(S)
    ours = np.zeros(m, dtype=int)
    ours[b.numpy()] = 1
    assert _same_partition(ours, _scipy_labels(S.numpy(), 2))
    assert 0 in a.tolist() and sorted(a.tolist() + b.tolist()) == list(range(m))
    assert a.dtype == torch.int64 and len(a) > 0 and len(b) > 0


def test_bipartition_by_hand():
    # rotation-like: clients 0, 2, 3 push one way, 1 and 4 the opposite way
    d = torch.tensor([1.0, 0.0, 0.0])
    u = torch.stack([d, -d, d + 0.1, d - 0.05, -d + 0.2])
    a, b = bipartition(pairwise_cosine(u))
    assert a.tolist() == [0, 2, 3] and b.tolist() == [1, 4]
    a, b = bipartition(torch.tensor([[1.0, 0.2], [0.2, 1.0]]))
    assert a.tolist() == [0] and b.tolist() == [1]


def test_bipartition_rejects_one_client():
    with pytest.raises(ValueError, match="m >= 2"):
        bipartition(torch.ones(1, 1))


def _least_cross_similarity(S):
    """The least α_max^cross over every bipartition of ``S`` (brute force)."""
    m = S.shape[0]
    best = float("inf")
    for mask in range(1, 2 ** (m - 1)):                  # client m-1 always on side 0: each bipartition once
        side = np.array([(mask >> i) & 1 for i in range(m)], dtype=bool)
        best = min(best, float(S[side][:, ~side].max()))
    return best


def _linkage_cross(S, method):
    from scipy.cluster.hierarchy import cut_tree, linkage
    from scipy.spatial.distance import squareform

    D = np.clip(1.0 - S, 0.0, None)
    np.fill_diagonal(D, 0.0)
    side = cut_tree(linkage(squareform(D, checks=False), method=method), n_clusters=2).flatten() == 1
    return float(S[side][:, ~side].max())


def test_single_linkage_is_the_optimal_bipartition_complete_linkage_is_not():
    """The paper's bipartition is the one of least α_max^cross; merging the
    most similar groups until two remain (single linkage) finds it.  The
    reference code's complete linkage (fedclust's bipartition) never does
    better and sometimes worse, so its γ_max test is the stricter."""
    worse = 0
    for seed in range(40):
        g = torch.Generator().manual_seed(seed)
        m = 4 + seed % 5
        S = pairwise_cosine(torch.randn(m, 6, generator=g, dtype=torch.float64)).numpy()
        least = _least_cross_similarity(S)
        assert _linkage_cross(S, "single") == pytest.approx(least)
        ours = cross_similarity(torch.from_numpy(S), *bipartition(torch.from_numpy(S)))
        assert ours == pytest.approx(_linkage_cross(S, "complete")) and ours >= least - 1e-12
        worse += ours > least + 1e-9
    assert worse > 0
