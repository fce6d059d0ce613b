"""FedAvg / FedProx math (fedclust.algorithms.fedavg) against hand values,
plain loops and autograd."""

import pytest
import torch

from fedclust.algorithms.aggregation import (
    average_rows,
    cluster_average,
    cluster_average_rows,
    pairwise_sum,
    weighted_average,
)
from fedclust.algorithms.base import RoundView
from fedclust.dist import ColumnBlocks, OneProcess


def test_weighted_average_by_hand():
    models = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = weighted_average(models, torch.tensor([1.0, 3.0]))
    assert torch.allclose(out, torch.tensor([2.5, 3.5]))          # (1*[1,2] + 3*[3,4]) / 4
    assert torch.allclose(weighted_average(models), torch.tensor([2.0, 3.0]))


def test_weighted_average_matches_loop_and_update_form():
    g = torch.Generator().manual_seed(0)
    models = torch.randn(7, 11, generator=g, dtype=torch.float64)
    w = torch.rand(7, generator=g, dtype=torch.float64) * 10
    ref = torch.zeros(11, dtype=torch.float64)
    for i in range(7):
        ref += w[i] * models[i]
    ref /= w.sum()
    out = weighted_average(models, w)
    assert torch.allclose(out, ref)
    # papers/003 Algorithm 1 line 8: w_t + sum n_i/n dw_i is the same thing
    w_t = torch.randn(11, generator=g, dtype=torch.float64)
    assert torch.allclose(w_t + (w / w.sum()) @ (models - w_t), out)


def test_weighted_average_zero_weight_client_is_ignored():
    models = torch.tensor([[1.0, 1.0], [100.0, -100.0], [3.0, 5.0]])
    out = weighted_average(models, torch.tensor([1.0, 0.0, 1.0]))
    assert torch.allclose(out, torch.tensor([2.0, 3.0]))


@pytest.mark.parametrize("weights", [torch.tensor([0.0, 0.0]), torch.tensor([1.0, -1.0]),
                                     torch.tensor([1.0, float("nan")]), torch.tensor([1.0])])
def test_weighted_average_bad_weights(weights):
    with pytest.raises(ValueError, match="weights"):
        weighted_average(torch.ones(2, 3), weights)


def test_weighted_average_empty():
    with pytest.raises(ValueError, match="non-empty"):
        weighted_average(torch.ones(0, 3))

def test_pairwise_sum_by_hand_and_against_float64():
    rows = torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0], [4.0, 40.0], [5.0, 50.0]])
    # ((1 + 2) + (3 + 4)) + 5: pairs, the odd last row carried
    assert pairwise_sum(rows).tolist() == [15.0, 150.0]
    assert pairwise_sum(rows[:1]).tolist() == [1.0, 10.0]
    g = torch.Generator().manual_seed(3)
    for m in (2, 3, 7, 64, 1001):
        x = torch.randn(m, 50, generator=g)
        torch.testing.assert_close(pairwise_sum(x).double(), x.double().sum(0), rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match="non-empty"):
        pairwise_sum(torch.ones(0, 3))


@pytest.mark.parametrize("m", [1, 2, 7, 50, 333])
@pytest.mark.parametrize("columns", [1, 7, 64, 1000, 5000])
def test_an_average_from_column_blocks_equals_the_whole_bit_for_bit(m, columns):
    """FedAvg's average read a column block at a time (exchange_mb) gives the whole models' bits, whatever the
    block width (so any number of processes, whose budgets give other widths, agree); torch's mean(0) would not.
    Narrow blocks on a narrower model (200 columns a block of width 1: one Python step each, not 5,000)."""
    n, P = 400, min(5000, 200 * columns)
    g = torch.Generator().manual_seed(m)
    after = torch.randn(n, P, generator=g)
    active = torch.zeros(n, dtype=torch.bool)
    active[torch.randperm(n, generator=g)[:m]] = True
    whole = average_rows(RoundView(round=1, before=None, after=after, all_after=after), active)
    assert torch.equal(whole, weighted_average(after[active]))
    blocks = ColumnBlocks(OneProcess("cpu"), {"after": after}, n, columns)
    got = average_rows(RoundView(round=1, before=None, after=after, all_after=None, columns=blocks), active)
    assert torch.equal(got, whole)
    assert blocks.passes == pytest.approx(1.0)
    torch.testing.assert_close(whole.double(), after[active].double().mean(0), rtol=1e-5, atol=1e-6)
    w = torch.rand(m, generator=g) + 0.5
    blocks = ColumnBlocks(OneProcess("cpu"), {"after": after}, n, columns)
    got_w = average_rows(RoundView(round=1, before=None, after=after, all_after=None, columns=blocks), active, w)
    assert torch.equal(got_w, weighted_average(after[active], w))


@pytest.mark.parametrize("columns", [1, 7, 64, 1000, 5000])
def test_cluster_averages_from_column_blocks_equal_the_whole_bit_for_bit(columns):
    """IFCA's per-cluster averages (index_add_ over the participants) read in column blocks give the whole
    models' bits; a cluster no participant chose keeps its model.  Narrow blocks on a narrower model, as above."""
    n, P, K = 300, min(5000, 200 * columns), 4
    g = torch.Generator().manual_seed(columns)
    after = torch.randn(n, P, generator=g)
    assign = torch.randint(0, K - 1, (n,), generator=g)   # cluster K - 1: nobody
    active = torch.rand(n, generator=g) < 0.5
    previous = torch.randn(K, P, generator=g)
    whole = cluster_average_rows(RoundView(round=1, before=None, after=after, all_after=after), active, assign, K,
                                 previous)
    assert torch.equal(whole, cluster_average(after[active], assign[active], K, previous))
    blocks = ColumnBlocks(OneProcess("cpu"), {"after": after}, n, columns)
    got = cluster_average_rows(RoundView(round=1, before=None, after=after, all_after=None, columns=blocks), active,
                               assign, K, previous)
    assert torch.equal(got, whole) and torch.equal(got[K - 1], previous[K - 1])
    for k in range(K - 1):   # a plain mean of the cluster's participants
        torch.testing.assert_close(got[k], after[active & (assign == k)].mean(0), rtol=1e-5, atol=1e-6)
