"""FPFC math (fedclust.algorithms.fpfc) against hand values, brute-force
minimisation, a literal [n, n, P] loop of Algorithm 1 and a plain BFS."""

import numpy as np
import pytest
import torch

from fedclust.algorithms import fpfc
from fedclust.config import load_config
from fedclust.errors import ConfigError

LAM, A, XI, RHO = 1.0, 3.7, 0.2, 12.0


def test_scad_by_hand():
    t = torch.tensor([0.0, 0.5, -0.5, 2.0, 5.0, -5.0], dtype=torch.float64)
    out = fpfc.scad(t, 1.0, 3.7)
    ref = [0.0, 0.5, 0.5, (3.7 * 2 - 0.5 * (4 + 1)) / 2.7, 4.7 / 2, 4.7 / 2]
    assert out.tolist() == pytest.approx(ref)


def test_scad_and_surrogate_continuity():
    for knot in (LAM, A * LAM, XI):
        t = torch.tensor([knot - 1e-9, knot + 1e-9], dtype=torch.float64)
        for f in (lambda x: fpfc.scad(x, LAM, A), lambda x: fpfc.scad_surrogate(x, LAM, A, XI)):
            y = f(t)
            assert abs(float(y[1] - y[0])) < 1e-7
            # derivative continuity (both are C^1 at these knots)
            h = 1e-6
            dl = (f(t[:1]) - f(t[:1] - h)) / h
            dr = (f(t[1:] + h) - f(t[1:])) / h
            assert abs(float(dr - dl)) < 1e-4


def test_surrogate_by_hand():
    t = torch.tensor([0.0, 0.1, 0.2, 0.7, 3.0], dtype=torch.float64)
    out = fpfc.scad_surrogate(t, LAM, A, XI)
    ref = [XI * LAM / 2, LAM * 0.01 / (2 * XI) + XI * LAM / 2, LAM * XI, 0.7, (3.7 * 3 - 0.5 * 10) / 2.7]
    assert out.tolist() == pytest.approx(ref)


def test_theta_shrink_matches_brute_force_1d():
    r = torch.cat([torch.linspace(0, 6, 121, dtype=torch.float64),
                   torch.tensor([XI + LAM / RHO, LAM + LAM / RHO, A * LAM], dtype=torch.float64)])
    s = fpfc.theta_shrink(r, LAM, A, XI, RHO)

    def argmin_on(grid):                           # [R, G] candidate s values -> best per row
        obj = fpfc.scad_surrogate(grid, LAM, A, XI) + RHO / 2 * (r[:, None] - grid) ** 2
        return grid.gather(1, obj.argmin(dim=1, keepdim=True))

    coarse = argmin_on(torch.linspace(0, 7, 7001, dtype=torch.float64).expand(len(r), -1))
    fine = argmin_on((coarse + torch.linspace(-2e-3, 2e-3, 4001, dtype=torch.float64)).clamp_min(0))
    assert torch.allclose(s, fine[:, 0], atol=1e-6)


def test_theta_update_is_the_minimiser():
    # scipy imported where used: at module level every collecting worker pays for it
    from scipy.optimize import minimize

    g = torch.Generator().manual_seed(0)
    P = 5

    def objective(th, d):
        th = torch.as_tensor(th, dtype=torch.float64)
        return float(fpfc.scad_surrogate(th.norm()[None], LAM, A, XI)[0] + RHO / 2 * ((d - th) ** 2).sum())

    for scale in (0.05, 0.3, 1.0, 2.0, 6.0):                  # every piece of the shrink map
        d = torch.randn(P, generator=g, dtype=torch.float64)
        d = d / d.norm() * scale
        th = fpfc.theta_update(d[None], LAM, A, XI, RHO)[0]
        best = min((minimize(objective, x0, args=(d,), method="Nelder-Mead",
                             options={"xatol": 1e-10, "fatol": 1e-14, "maxiter": 20000})
                    for x0 in (d.numpy(), np.zeros(P), -d.numpy())), key=lambda res: res.fun)
        assert objective(th, d) <= best.fun + 1e-9
        assert np.allclose(th.numpy(), best.x, atol=1e-4)
    assert torch.equal(fpfc.theta_update(torch.zeros(2, 3), LAM, A, XI, RHO), torch.zeros(2, 3))


def test_pair_update_by_hand():
    wi, wj = torch.tensor([[10.0, 0.0]]), torch.tensor([[0.0, 0.0]])
    th, v = fpfc.pair_update(wi, wj, torch.zeros(1, 2), torch.zeros(1, 2), LAM, A, XI, RHO)
    assert th.tolist() == [[10.0, 0.0]] and v.tolist() == [[0.0, 0.0]]   # r > a*lam: no shrink
    wi = torch.tensor([[0.5, 0.0]])                                        # lam/rho + xi < 0.5 <= lam + lam/rho
    th, v = fpfc.pair_update(wi, wj, torch.zeros(1, 2), torch.zeros(1, 2), LAM, A, XI, RHO)
    assert th[0, 0].item() == pytest.approx(0.5 - LAM / RHO) and v[0, 0].item() == pytest.approx(LAM)


def _literal_round(omega, Theta, V, active, lam, a, xi, rho):
    """Algorithm 1's server step on full antisymmetric [n, n, P] tensors, plain loops."""
    n = omega.shape[0]
    Theta, V = Theta.clone(), V.clone()
    for i in range(n):
        for j in range(i + 1, n):
            if not (active[i] or active[j]):
                continue
            delta = omega[i] - omega[j] + V[i, j] / rho
            r = float(delta.norm())
            s = float(fpfc.theta_shrink(torch.tensor([r], dtype=torch.float64), lam, a, xi, rho)[0])
            th = delta * (s / r) if r > 0 else torch.zeros_like(delta)
            Theta[i, j], Theta[j, i] = th, -th
            V[i, j] = V[i, j] + rho * (omega[i] - omega[j] - th)
            V[j, i] = -V[i, j]
    Z = torch.stack([sum(omega[j] + Theta[i, j] - V[i, j] / rho for j in range(n)) / n for i in range(n)])
    return Theta, V, Z


def _to_pairs(T):
    i, j = fpfc.pair_index(T.shape[0])
    return T[i, j].clone()


@pytest.mark.parametrize("chunk", [None, 1, 4])
def test_server_update_and_zeta_match_literal_loop(chunk):
    g = torch.Generator().manual_seed(2)
    n, P = 6, 4
    Theta = torch.zeros(n, n, P, dtype=torch.float64)
    V = torch.zeros(n, n, P, dtype=torch.float64)
    theta, v = fpfc.init_pair_state(n, P, torch.float64)
    for k, active in enumerate([torch.ones(n, dtype=torch.bool),
                                torch.tensor([1, 0, 0, 1, 0, 0], dtype=torch.bool),
                                torch.tensor([0, 0, 0, 0, 0, 1], dtype=torch.bool)]):
        omega = torch.randn(n, P, generator=g, dtype=torch.float64) * (0.3 + k)
        Theta, V, Z = _literal_round(omega, Theta, V, active, LAM, A, XI, RHO)
        fpfc.server_update_(omega, theta, v, LAM, A, XI, RHO, active=active, chunk_pairs=chunk)
        assert torch.allclose(theta, _to_pairs(Theta)) and torch.allclose(v, _to_pairs(V))
        assert torch.allclose(fpfc.zeta(omega, theta, v, RHO, chunk_pairs=chunk), Z)


def test_zeta_at_init_is_omega():
    omega = torch.ones(4, 3) * torch.tensor([1.0, 2.0, 3.0])
    theta, v = fpfc.init_pair_state(4, 3)
    assert torch.allclose(fpfc.zeta(omega, theta, v, RHO), omega)


def test_theta_norm_matrix():
    theta = torch.tensor([[3.0, 4.0], [0.0, 1.0], [1.0, 0.0]])   # pairs (0,1), (0,2), (1,2)
    N = fpfc.theta_norm_matrix(theta, 3)
    assert N.tolist() == [[0.0, 5.0, 1.0], [5.0, 0.0, 1.0], [1.0, 1.0, 0.0]]


def _bfs_labels(adj):
    n = len(adj)
    lab = [-1] * n
    nxt = 0
    for s in range(n):
        if lab[s] >= 0:
            continue
        lab[s], stack = nxt, [s]
        while stack:
            u = stack.pop()
            for w in range(n):
                if adj[u][w] and lab[w] < 0:
                    lab[w] = nxt
                    stack.append(w)
        nxt += 1
    return lab


def test_clusters_from_theta_by_hand_and_bfs():
    N = torch.tensor([[0.0, 0.1, 9.0, 9.0, 9.0],
                      [0.1, 0.0, 9.0, 9.0, 0.2],
                      [9.0, 9.0, 0.0, 9.0, 9.0],
                      [9.0, 9.0, 9.0, 0.0, 9.0],
                      [9.0, 0.2, 9.0, 9.0, 0.0]])
    assert fpfc.clusters_from_theta(N, 0.2).tolist() == [0, 0, 1, 2, 0]   # chain 0-1-4, ≤ ν inclusive
    assert fpfc.clusters_from_theta(N, 0.15).tolist() == [0, 0, 1, 2, 3]
    g = torch.Generator().manual_seed(4)
    for _ in range(5):
        R = torch.rand(30, 30, generator=g)
        R = (R + R.T) / 2
        R.fill_diagonal_(0)
        adj = (R <= 0.05).tolist()
        assert fpfc.clusters_from_theta(R, 0.05).tolist() == _bfs_labels(adj)


def test_cluster_models_by_hand():
    omega = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 5.0]])
    out = fpfc.cluster_models(omega, torch.tensor([0, 0, 1]), torch.tensor([1.0, 3.0, 2.0]))
    assert out.tolist() == [[2.5, 0.0], [0.0, 5.0]]


def test_pairwise_state_bytes():
    """The compact layout's bytes, by hand: θ for the largest shard's rows (K = (n-1)//2 pairs a client) and
    the n/2 diametric pairs, plus c and ||θ|| (float64) for every pair."""
    assert fpfc.pairwise_state_bytes(3, 10) == 3 * 1 * 10 * 4 + 16 * 3                # K = 1, no diametric pair
    assert fpfc.pairwise_state_bytes(4, 10) == (4 * 1 + 2) * 10 * 4 + 16 * 6          # K = 1, D = 2
    assert fpfc.pairwise_state_bytes(4, 10, world=3) == (2 * 1 + 2) * 10 * 4 + 16 * 6
    assert fpfc.pairwise_state_bytes(1, 10) == 0
    E, P = 100 * 99 // 2, 199_210
    literal = 2 * E * P * 4                                                       # θ and v [E, P], float32
    assert literal == 7_888_716_000
    assert fpfc.pairwise_state_bytes(100, P) == E * P * 4 + 16 * E == 3_944_437_200   # half, plus 79 kB
    assert fpfc.pairwise_state_bytes(100, P, world=2) == (50 * 49 + 50) * P * 4 + 16 * E == 1_992_179_200


@pytest.mark.parametrize("kw,field", [(dict(lam=0.0), "fpfc.lam"), (dict(a=1.0), "fpfc.a"),
                                      (dict(xi=1.5), "fpfc.xi"), (dict(rho=0.3), "fpfc.rho")])
def test_bad_hyperparameters(kw, field):
    p = dict(lam=LAM, a=A, xi=XI, rho=RHO) | kw
    with pytest.raises(ConfigError, match=field):
        fpfc.theta_shrink(torch.ones(1), **p)


def test_algorithm1_recovers_two_clusters_on_quadratics():
    """End to end on f_i(ω) = ½‖ω − c_i‖²: Algorithm 1 with exact-ish local GD."""
    g = torch.Generator().manual_seed(0)
    n, P = 8, 3
    truth = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    centers = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, 0.5]], dtype=torch.float64)
    c = centers[truth] + 0.05 * torch.randn(n, P, generator=g, dtype=torch.float64)
    lam, a, xi, rho = 0.4, 3.7, 0.05, 20.0
    omega = torch.zeros(n, P, dtype=torch.float64)
    theta, v = fpfc.init_pair_state(n, P, torch.float64)
    z = omega.clone()
    for _ in range(200):
        for _ in range(10):
            omega = omega - 0.5 / (1 + rho) * ((omega - c) + rho * (omega - z))
        fpfc.server_update_(omega, theta, v, lam, a, xi, rho)
        z = fpfc.zeta(omega, theta, v, rho)
    labels = fpfc.clusters_from_theta(fpfc.theta_norm_matrix(theta, n), 0.1)
    assert labels.tolist() == truth.tolist()
    models = fpfc.cluster_models(omega, labels)
    assert torch.allclose(models, torch.stack([c[truth == k].mean(0) for k in range(2)]), atol=0.05)


def test_theorem1_rho_bound_by_hand():
    # max(2 lam/xi, 2/(a-1))
    assert fpfc.theorem1_rho_bound(1.0, 3.7, 0.2) == pytest.approx(10.0)
    assert fpfc.theorem1_rho_bound(0.1, 1.5, 0.09) == pytest.approx(4.0)          # 2/(a-1) = 4 > 2.22
    assert fpfc.theorem1_rho_bound(2.0, 3.7, 0.4) == pytest.approx(10.0)          # scale-free in (lam, xi)
    assert fpfc.theorem1_rho_bound(LAM, A, XI) < RHO                              # this file's values comply


def test_check_theorem1_names_field_value_and_fix():
    fpfc.check_theorem1(1.0, 3.7, 0.2, 10.01)
    with pytest.raises(ConfigError) as err:
        fpfc.check_theorem1(1.0, 3.7, 0.2, 10.0)                                  # strict: rho > 10
    text = str(err.value)
    assert "fpfc.rho" in text and "10" in text and "Theorem 1" in text and "raise fpfc.rho" in text
    with pytest.raises(ConfigError, match="xi"):
        fpfc.check_theorem1(1.0, 3.7, 1.0, 50.0)                                  # xi < lam
    with pytest.raises(ConfigError, match="fpfc.rho"):                            # 2 lam/xi = 20 > rho
        load_config(None, ["algorithm.name=fpfc", "data.name=synthetic", "clients=8", "fpfc.lam=0.5",
                           "fpfc.xi=0.05", "fpfc.rho=1.0"])


def test_default_config_satisfies_theorem1():
    from fedclust.algorithms.fpfc import FpfcConfig

    f = FpfcConfig()
    assert f.rho > fpfc.theorem1_rho_bound(f.lam, f.a, f.xi)
    assert f.xi <= f.nu                                                           # papers/004: nu in [xi, 0.5]
    load_config(None, ["algorithm.name=fpfc", "data.name=synthetic", "clients=8"])
