"""FedAvg / FedProx math (fedclust.algorithms.fedavg) against hand values,
plain loops and autograd."""

import pytest
import torch

from fedclust.algorithms.fedavg import prox_grad, prox_penalty, weighted_average
from fedclust.errors import ConfigError


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


@pytest.mark.parametrize("per_client_anchor", [False, True])
def test_prox_grad_matches_autograd(per_client_anchor):
    g = torch.Generator().manual_seed(1)
    C, P, mu = 5, 9, 0.3
    params = torch.randn(C, P, generator=g, dtype=torch.float64, requires_grad=True)
    anchor = torch.randn(C, P, generator=g, dtype=torch.float64) if per_client_anchor else torch.randn(P, generator=g, dtype=torch.float64)
    target = torch.randn(C, P, generator=g, dtype=torch.float64)
    loss_f = 0.5 * ((params - target) ** 2).sum()                 # f_i with gradient params - target
    (grad_total,) = torch.autograd.grad(loss_f + prox_penalty(params, anchor, mu).sum(), params)
    out = prox_grad((params - target).detach(), params.detach(), anchor, mu)
    assert torch.allclose(out, grad_total)


def test_prox_grad_by_hand_and_mu_zero():
    grads = torch.tensor([[1.0, 0.0]])
    params = torch.tensor([[2.0, 3.0]])
    anchor = torch.tensor([1.0, 1.0])
    assert torch.allclose(prox_grad(grads, params, anchor, 0.5), torch.tensor([[1.5, 1.0]]))
    assert torch.equal(prox_grad(grads, params, anchor, 0.0), grads)   # FedAvg
    assert torch.allclose(prox_penalty(params, anchor, 0.5), torch.tensor([0.25 * (1 + 4)]))


@pytest.mark.parametrize("mu", [-0.1, float("nan"), float("inf")])
def test_prox_grad_bad_mu(mu):
    with pytest.raises(ConfigError, match="algorithm.mu"):
        prox_grad(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(2), mu)


def test_prox_grad_bad_anchor_shape():
    with pytest.raises(ValueError, match="anchor"):
        prox_grad(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3, 3), 0.1)
