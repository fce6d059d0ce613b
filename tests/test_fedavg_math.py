"""FedAvg / FedProx math (fedclust.algorithms.fedavg) against hand values,
plain loops and autograd."""

import pytest
import torch

from fedclust.algorithms.aggregation import weighted_average


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