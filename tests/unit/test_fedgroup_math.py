"""FedGroup math (fedclust.algorithms.fedgroup) against numpy SVD, plain
loops, scipy's K-means and hand values."""

import numpy as np
import pytest
import torch

from fedclust import rng
from fedclust.algorithms.fedgroup import (
    KMEANS_STREAM,
    base_directions,
    decomposed_cosine,
    global_aggregate,
    group_cold_start,
    inter_group_aggregate,
    kmeans,
    kmeans_pp,
    lloyd,
    newcomer_distance,
    place_newcomers,
    ternary_similarity,
)
from fedclust.errors import ConfigError


def _updates(seed, per_group=8, groups=3, P=50, noise=0.3):
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(groups, P, generator=g, dtype=torch.float64)
    rows = [dirs[k] + noise * torch.randn(P, generator=g, dtype=torch.float64)
            for k in range(groups) for _ in range(per_group)]
    truth = torch.arange(groups).repeat_interleave(per_group)
    return torch.stack(rows), truth


def test_base_directions_match_numpy_svd_of_transpose():
    dW, _ = _updates(0)
    V = base_directions(dW)
    U, s, _ = np.linalg.svd(dW.numpy().T, full_matrices=False)      # SVD(ΔWᵀ): left vectors in R^P
    for k in range(3):
        ref = U[:, k] * np.sign(np.sum(dW.numpy() @ U[:, k]))         # documented sign rule
        assert np.allclose(V[k].numpy(), ref, atol=1e-10)
    assert torch.allclose(V @ V.T, torch.eye(3, dtype=torch.float64), atol=1e-12)
    assert ((dW @ V.T).sum(dim=0) >= 0).all()


def test_ternary_similarity_matches_eq7_loop():
    dW, _ = _updates(1)
    V = base_directions(dW)
    dW[3] = 0.0
    # authors' code keeps the unnormalised U·Σ columns; Eq. 7 divides by ‖v_k‖
    scaled = V * torch.tensor([5.0, 0.5, 2.0], dtype=torch.float64)[:, None]
    out = ternary_similarity(dW, scaled)
    for i in range(dW.shape[0]):
        for k in range(3):
            ni, nv = float(dW[i].norm()), float(scaled[k].norm())
            zeta_p = float(dW[i] @ scaled[k]) / (ni * nv) if ni > 0 else 0.0
            assert out[i, k].item() == pytest.approx((1.0 - zeta_p) / 2.0, abs=1e-12)
    assert torch.allclose(out, ternary_similarity(dW, V))
    assert torch.allclose(decomposed_cosine(dW), ternary_similarity(dW, base_directions(dW)))
    assert ((out >= 0) & (out <= 1)).all() and torch.allclose(out[3], torch.full((3,), 0.5, dtype=torch.float64))


def test_sign_flip_is_a_reflection():
    dW, _ = _updates(2)
    V = base_directions(dW)
    M = ternary_similarity(dW, V)
    Vf = V.clone()
    Vf[1] = -Vf[1]
    Mf = ternary_similarity(dW, Vf)
    assert torch.allclose(Mf[:, 1], 1 - M[:, 1])
    assert torch.allclose(torch.cdist(M, M), torch.cdist(Mf, Mf))


def test_base_directions_need_three_clients():
    with pytest.raises(ConfigError, match="fedgroup.pretrain_scale"):
        base_directions(torch.randn(2, 10))


def _ref_kmeans_pp(x, k, seed, restart):
    """Plain-loop k-means++ on the same uniform draws."""
    x = x.numpy()
    m = len(x)
    u = [rng.uniform(seed, 0, KMEANS_STREAM, torch.tensor(restart), torch.tensor(j)).item() for j in range(k)]
    chosen = [min(int(u[0] * m), m - 1)]
    for j in range(1, k):
        d2 = [min(float(np.sum((x[i] - x[c]) ** 2)) for c in chosen) for i in range(m)]
        total = sum(d2)
        target, acc = u[j] * total, 0.0
        for i in range(m):
            acc += d2[i]
            if acc > target:
                chosen.append(i)
                break
    return chosen


@pytest.mark.parametrize("restart", [0, 1, 2, 3])
def test_kmeans_pp_matches_loop(restart):
    dW, _ = _updates(3, groups=4)
    M = ternary_similarity(dW, base_directions(dW))
    assert kmeans_pp(M, 4, seed=7, restart=restart).tolist() == _ref_kmeans_pp(M, 4, 7, restart)


def test_kmeans_pp_never_repeats_a_point_with_duplicates():
    x = torch.tensor([[0.0, 0.0]] * 5 + [[1.0, 1.0]] * 5 + [[5.0, 0.0]], dtype=torch.float64)
    for r in range(20):
        idx = kmeans_pp(x, 3, seed=0, restart=r)
        assert len({tuple(x[i].tolist()) for i in idx.tolist()}) == 3


def test_lloyd_matches_scipy_kmeans2_from_same_start():
    # scipy imported where used: at module level every collecting worker pays for it
    from scipy.cluster.vq import kmeans2

    g = torch.Generator().manual_seed(5)
    centers = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    x = torch.cat([c + 0.6 * torch.randn(30, 2, generator=g, dtype=torch.float64) for c in centers])
    init = x[[0, 1, 2]]                                             # a poor start: all in one blob
    labels, c, inertia = lloyd(x, init)
    ref_c, ref_l = kmeans2(x.numpy(), init.numpy().copy(), iter=300, minit="matrix", missing="raise")
    assert labels.tolist() == ref_l.tolist()
    assert np.allclose(c.numpy(), ref_c)
    assert inertia == pytest.approx(float(((x.numpy() - ref_c[ref_l]) ** 2).sum()))


def test_kmeans_recovers_blobs_and_is_seeded():
    dW, truth = _updates(4, groups=3)
    M = ternary_similarity(dW, base_directions(dW))
    labels, centers = kmeans(M, 3, seed=0)
    perm = {int(t): int(l) for t, l in zip(truth, labels)}
    assert len(set(perm.values())) == 3 and all(perm[int(t)] == int(l) for t, l in zip(truth, labels))
    for k in range(3):
        assert torch.allclose(centers[k], M[labels == k].mean(dim=0))
    labels2, _ = kmeans(M, 3, seed=0)
    assert torch.equal(labels, labels2)


def test_group_cold_start_algorithm4():
    dW, truth = _updates(6, groups=2, per_group=10)
    w0 = torch.linspace(-1, 1, dW.shape[1], dtype=torch.float64)
    out = group_cold_start(dW, w0, groups=2, seed=3)
    a = out["assign"]
    assert torch.equal(a == a[0], truth == truth[0])                 # the two true groups
    for k in range(2):
        members = (a == k).nonzero().flatten()
        pre_models = w0 + dW[members]                              # models after pre-training
        assert torch.allclose(out["models"][k], pre_models.mean(dim=0))
        assert torch.allclose(out["updates"][k], out["models"][k] - w0)
        assert torch.allclose(out["centroids"][k], out["similarity"][members].mean(dim=0))
    assert out["similarity"].shape == (20, 3) and out["directions"].shape == (3, dW.shape[1])


def test_place_newcomers_by_hand():
    groups = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])     # group 2: zero update
    pre = torch.tensor([[2.0, 0.1], [-1.0, 0.0], [0.1, 3.0], [1.0, 1.0], [-1.0, -1.0]])
    assert place_newcomers(pre, groups).tolist() == [0, 1, 1, 0, 2]   # row 1: tie 0.5/0.5 -> lower
    d = newcomer_distance(pre, groups)
    assert d[1].tolist() == pytest.approx([1.0, 0.5, 0.5])
    assert d[3].tolist() == pytest.approx([(1 - 2 ** -0.5) / 2, (1 - 2 ** -0.5) / 2, 0.5])


def test_newcomer_distance_matches_loop():
    g = torch.Generator().manual_seed(8)
    pre, grp = torch.randn(9, 7, generator=g, dtype=torch.float64), torch.randn(4, 7, generator=g, dtype=torch.float64)
    d = newcomer_distance(pre, grp)
    for i in range(9):
        for j in range(4):
            cos = float(pre[i] @ grp[j]) / float(pre[i].norm() * grp[j].norm())
            assert d[i, j].item() == pytest.approx((1 - cos) / 2, abs=1e-12)


def _code_inter_group(models, eta):
    """GrouProx aggregate_groups as a plain loop."""
    K = len(models)
    scale = [float(np.sqrt(np.sum(m.astype(np.float64) ** 2))) for m in models]
    out = []
    for idx in range(K):
        weights = [eta / s for s in scale]
        weights[idx] = 1.0
        base = sum(w * m for w, m in zip(weights, models))
        out.append(base / sum(weights))
    return np.stack(out)


def test_inter_group_aggregate_matches_authors_code_and_literal():
    g = torch.Generator().manual_seed(9)
    W = torch.randn(4, 6, generator=g, dtype=torch.float64) * 3
    out = inter_group_aggregate(W, 0.01)
    assert np.allclose(out.numpy(), _code_inter_group(list(W.numpy()), 0.01))
    lit = inter_group_aggregate(W, 0.01, normalized=False)
    for j in range(4):                                              # Alg. 2 line 22-23 as printed
        ref = W[j] + 0.01 * sum(W[l] / W[l].norm() for l in range(4) if l != j)
        assert torch.allclose(lit[j], ref)


def test_inter_group_aggregate_edge_cases():
    W = torch.tensor([[3.0, 4.0], [3.0, 4.0]])
    assert torch.allclose(inter_group_aggregate(W, 0.5), W)          # identical groups stay put
    assert torch.allclose(inter_group_aggregate(W, 0.5, normalized=False), W + 0.5 * torch.tensor([0.6, 0.8]))
    assert torch.equal(inter_group_aggregate(W, 0.0), W)
    Z = torch.tensor([[0.0, 0.0], [3.0, 4.0]])                        # a zero model adds nothing
    out = inter_group_aggregate(Z, 0.5)
    assert torch.allclose(out[1], Z[1]) and torch.allclose(out[0], (0.5 * torch.tensor([0.6, 0.8])) / (1 + 0.5 / 5))
    with pytest.raises(ConfigError, match="fedgroup.inter_lr"):
        inter_group_aggregate(W, -1.0)


def test_global_aggregate_is_unweighted_mean():
    W = torch.tensor([[1.0, 2.0], [3.0, 6.0], [5.0, 1.0]])
    assert global_aggregate(W).tolist() == [3.0, 3.0]
