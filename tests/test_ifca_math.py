"""IFCA math (fedclust.algorithms.ifca) against hand values and plain loops."""

import pytest
import torch

from fedclust.algorithms.ifca import assign_clusters, cluster_average, cluster_counts


def test_assign_by_hand_ties_and_nan():
    losses = torch.tensor([
        [0.5, 0.2, 0.9],
        [0.3, 0.3, 0.1],
        [0.7, 0.7, 0.7],                       # tie: lowest index
        [float("nan"), 0.4, 0.4],              # NaN never wins; tie 1/2 -> 1
        [float("nan"), float("nan"), float("nan")],
    ])
    assert assign_clusters(losses).tolist() == [1, 2, 0, 1, 0]
    assert assign_clusters(losses).dtype == torch.int64


def test_assign_matches_loop():
    g = torch.Generator().manual_seed(0)
    losses = torch.randint(0, 4, (50, 4), generator=g).double()    # many ties
    ref = []
    for row in losses.tolist():
        best = 0
        for j, v in enumerate(row):
            if v < row[best]:
                best = j
        ref.append(best)
    assert assign_clusters(losses).tolist() == ref


def _loop_average(models, assign, K, previous, weights):
    out = previous.clone()
    for k in range(K):
        num = torch.zeros(models.shape[1], dtype=models.dtype)
        den = 0.0
        for i in range(models.shape[0]):
            if int(assign[i]) == k:
                num += weights[i] * models[i]
                den += float(weights[i])
        if den > 0:
            out[k] = num / den
    return out


@pytest.mark.parametrize("weighted", [False, True])
def test_cluster_average_matches_loop(weighted):
    g = torch.Generator().manual_seed(3)
    C, P, K = 20, 6, 5
    models = torch.randn(C, P, generator=g, dtype=torch.float64)
    assign = torch.randint(0, K - 1, (C,), generator=g)              # cluster K-1 stays empty
    previous = torch.randn(K, P, generator=g, dtype=torch.float64)
    w = torch.rand(C, generator=g, dtype=torch.float64) + 0.1 if weighted else None
    out = cluster_average(models, assign, K, previous, w)
    ref = _loop_average(models, assign, K, previous, w if weighted else torch.ones(C, dtype=torch.float64))
    assert torch.allclose(out, ref)
    assert torch.equal(out[K - 1], previous[K - 1])


def test_cluster_average_by_hand_and_zero_weight_cluster():
    models = torch.tensor([[0.0, 0.0], [2.0, 4.0], [10.0, 10.0]])
    assign = torch.tensor([0, 0, 1])
    previous = torch.tensor([[9.0, 9.0], [7.0, 7.0], [5.0, 5.0]])
    out = cluster_average(models, assign, 3, previous)
    assert out.tolist() == [[1.0, 2.0], [10.0, 10.0], [5.0, 5.0]]
    # cluster 1 has a client but zero weight: keeps its previous model
    out = cluster_average(models, assign, 3, previous, torch.tensor([1.0, 3.0, 0.0]))
    assert out.tolist() == [[1.5, 3.0], [7.0, 7.0], [5.0, 5.0]]
    assert cluster_counts(assign, 3).tolist() == [2.0, 1.0, 0.0]


def test_cluster_average_no_clients_keeps_all():
    previous = torch.randn(3, 4)
    out = cluster_average(torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), 3, previous)
    assert torch.equal(out, previous)


def test_cluster_average_bad_inputs():
    with pytest.raises(ValueError, match="assign values"):
        cluster_average(torch.zeros(2, 3), torch.tensor([0, 3]), 3, torch.zeros(3, 3))
    with pytest.raises(ValueError, match="previous"):
        cluster_average(torch.zeros(2, 3), torch.tensor([0, 1]), 3, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="int64"):
        cluster_average(torch.zeros(2, 3), torch.tensor([0, 1], dtype=torch.int32), 3, torch.zeros(3, 3))
