"""The data and the CNN of FPFC's official MNIST/FMNIST code, rebuilt for fedclust (issue 21 part 4):
``experiments/fpfc_official_fmnist_data.py`` (Dirichlet(1) label shares over devices, the code's p <-> 8 - p label
swap, pixels in [0, 1]) and ``experiments/fpfc_official_convnet.py`` (its 2-convolution CNN, as a model of your own).
Checked against the code's rule recomputed here by hand, and by a short fedclust run on such a file."""


import numpy as np
import pytest
import torch
from run_files import experiment

data = experiment("fpfc_official_fmnist_data")


def _pool(n, seed):
    rs = np.random.RandomState(seed)
    return rs.randint(0, 256, (n, 28, 28)).astype(np.uint8), rs.randint(0, 10, n)


def test_swap_table_by_hand():
    assert data.swap_table(0).tolist() == [8, 1, 2, 3, 4, 5, 6, 7, 0, 9]
    assert data.swap_table(1).tolist() == [0, 7, 2, 3, 4, 5, 6, 1, 8, 9]
    assert data.swap_table(3).tolist() == [0, 1, 2, 5, 4, 3, 6, 7, 8, 9]
    with pytest.raises(ValueError, match="clusters 0..3"):
        data.swap_table(4)


def test_dirichlet_split_cuts_each_class_at_the_cumulative_shares():
    """Every index in exactly one device; device i's images of class c are the c-images of the permuted pool
    between floor(n_c * S_{i-1}) and floor(n_c * S_i), S the cumulative shares of class c."""
    _, y = _pool(3000, 0)
    parts = data.dirichlet_split(y, 7, np.random.RandomState(5))
    assert sorted(np.concatenate(parts).tolist()) == list(range(3000))
    rs = np.random.RandomState(5)
    perm = rs.permutation(3000)
    shares = rs.dirichlet([1.0] * 7, 10)
    for c in range(10):
        of_class = [int(i) for i in perm if y[i] == c]
        bounds = [0] + [int(len(of_class) * s) for s in np.cumsum(shares[c])[:-1]] + [len(of_class)]
        for i in range(7):
            got = [int(j) for j in parts[i] if y[j] == c]
            assert got == of_class[bounds[i]:bounds[i + 1]]


def test_build_uses_every_image_once_swaps_per_cluster_and_scales_to_unit():
    xtr, ytr = _pool(2000, 1)
    xte, yte = _pool(600, 2)
    out = data.build(xtr, ytr, xte, yte, devices=8, clusters=4, seed=9)
    assert out["cluster"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    rs = np.random.RandomState(9)
    for name, x, y in (("train", xtr, ytr), ("test", xte, yte)):
        parts = data.dirichlet_split(y, 8, rs)   # the same generator, in the code's order: train, then test
        want_x = np.concatenate([x[p] for p in parts]).reshape(-1, 1, 28, 28) / 255.0
        want_y = np.concatenate([[(8 - v if v == i // 2 else i // 2 if v == 8 - i // 2 else v) for v in y[p]]
                                 for i, p in enumerate(parts)])
        np.testing.assert_allclose(out[f"x_{name}"], want_x, rtol=0, atol=1e-7)
        assert out[f"y_{name}"].tolist() == [int(v) for v in want_y]
        assert out[f"client_{name}"].tolist() == sum(([i] * len(p) for i, p in enumerate(parts)), [])
        assert 0.0 <= out[f"x_{name}"].min() and out[f"x_{name}"].max() <= 1.0
    with pytest.raises(ValueError, match="multiple of clusters"):
        data.build(xtr, ytr, xte, yte, devices=10, clusters=4)


def test_convnet_is_the_codes_shape():
    conv = experiment("fpfc_official_convnet")
    net = conv.ConvNet((1, 28, 28), 10)
    assert [(k, tuple(v.shape)) for k, v in net.named_parameters()] == [
        ("conv1.weight", (6, 1, 5, 5)), ("conv1.bias", (6,)), ("conv2.weight", (16, 6, 5, 5)),
        ("conv2.bias", (16,)), ("fc1.weight", (10, 400)), ("fc1.bias", (10,))]
    assert net(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    with pytest.raises(ValueError, match="28x28"):
        conv.ConvNet((3, 32, 32), 10)


def test_probe_pair_step_is_the_official_server_and_reset_zeroes_the_unstepped_pairs():
    """experiments/probe_fpfc_reset.py's pair step (every j of a participant at once) against test_fpfc_official's
    plain loop of the code's server(), θ kept; with reset, the pairs neither of whose ends took part are 0."""
    from test_fpfc_official import LAM, RHO, XI, A, official_server

    probe = experiment("probe_fpfc_reset")
    g = torch.Generator().manual_seed(1)
    n, P = 6, 5
    heads = torch.randn(n, P, generator=g, dtype=torch.float64) * 0.4
    theta0 = torch.randn(n, n, P, generator=g, dtype=torch.float64) * 0.1
    V0 = torch.randn(n, n, P, generator=g, dtype=torch.float64) * 0.1
    theta0, V0 = theta0 - theta0.transpose(0, 1), V0 - V0.transpose(0, 1)   # antisymmetric, as the code keeps them
    selected = [4, 1, 2]
    want_theta, want_V = theta0.clone(), V0.clone()
    official_server(heads, want_theta, want_V, selected, LAM, A, XI, RHO)
    theta, V = theta0.clone(), V0.clone()
    probe.step_pairs(heads, theta, V, selected, LAM, A, XI, RHO, reset=False)
    assert torch.allclose(theta, want_theta, rtol=0, atol=1e-12) and torch.allclose(V, want_V, rtol=0, atol=1e-12)
    theta, V = theta0.clone(), V0.clone()
    probe.step_pairs(heads, theta, V, selected, LAM, A, XI, RHO, reset=True)
    assert torch.allclose(V, want_V, rtol=0, atol=1e-12)             # v is kept either way
    for i in range(n):
        for j in range(n):
            if i in selected or j in selected:
                assert torch.allclose(theta[i, j], want_theta[i, j], rtol=0, atol=1e-12)
            else:
                assert not theta[i, j].any()
