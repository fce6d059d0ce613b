"""panm.em_input: PANMLoss's HNM runs its EM on -F (default) or on 1/F (SPEC §4)."""

import math

import pytest
import torch
from panm_build import make_panm_grad, make_panm_loss

from fedclust.algorithms import registry
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.hnm import hnm_update
from fedclust.algorithms.similarity import NOT_COMPUTED, loss_em_input, similarity_matrix
from fedclust.config import Config
from fedclust.errors import ConfigError

# Hand-made losses F_i(w_j) of one client: its five neighbours (all same-cluster) and
# five candidates (all from the other cluster).  Two neighbours are nearly equal to the
# client (tiny losses), three are ordinary same-cluster peers; the candidates are far.
SAME = [0.01, 0.02, 0.3, 0.35, 0.4]
OTHER = [2.0, 2.2, 2.4, 2.6, 2.8]


def hand_case():
    n = 11
    neighbors = torch.zeros(1, n, dtype=torch.bool)
    neighbors[0, 1:6] = True                                  # N = {1..5}, all sampled (S = N)
    cand = torch.zeros(1, n, dtype=torch.bool)
    cand[0, 6:11] = True                                      # C = {6..10}
    sim = torch.full((1, n), NOT_COMPUTED)
    sim[0, 1:11] = 1.0 / torch.tensor(SAME + OTHER)           # s = 1/F on M = C ∪ S
    return neighbors, cand, neighbors.clone(), sim


def test_em_input_values_by_hand():
    _, _, _, sim = hand_case()
    neg = loss_em_input(sim, "neg_loss")
    assert torch.allclose(neg[0, 1:], -torch.tensor(SAME + OTHER), rtol=1e-6, atol=0)
    assert neg[0, 0] == NOT_COMPUTED                           # not computed stays so
    assert torch.equal(loss_em_input(sim, "inverse"), sim)
    with pytest.raises(ValueError):
        loss_em_input(sim, "loss")


def plain_em(y, in_a, tied=False):
    """Reference hard-assignment EM for two 1-D Gaussians, one value at a time
    (population variances floored at 1e-3 * Var(y) + 1e-12; tied: both use the
    count-weighted mean of the two, floored; ties to A); returns the indices in
    the higher-mean component."""
    m = len(y)
    mu = sum(y) / m
    floor = 1e-3 * sum((v - mu) ** 2 for v in y) / m + 1e-12

    def stats(members):
        vals = [y[j] for j in members]
        mean = sum(vals) / len(vals)
        return len(vals), mean, max(sum((v - mean) ** 2 for v in vals) / len(vals), floor)

    a = set(in_a)
    for _ in range(100):
        b = set(range(m)) - a
        if not a or not b:
            break
        (na, ma, va), (nb, mb, vb) = stats(a), stats(b)
        if tied:
            va = vb = max((na * va + nb * vb) / (na + nb), floor)

        def logp(v, cnt, mean, var):
            return math.log(cnt / m) - 0.5 * math.log(2 * math.pi * var) - (v - mean) ** 2 / (2 * var)

        new = {j for j in range(m) if logp(y[j], na, ma, va) >= logp(y[j], nb, mb, vb)}
        if new == a:
            break
        a = new
    b = set(range(m)) - a
    return sorted(a if stats(a)[1] >= stats(b)[1] else b)


@pytest.mark.parametrize("tied", [False, True])
def test_plain_em_on_the_hand_values(tied):
    inv = [1.0 / f for f in SAME + OTHER]
    neg = [-f for f in SAME + OTHER]
    assert plain_em(inv, range(5), tied) == [0, 1]            # 1/F: only the two near-self peers
    assert plain_em(neg, range(5), tied) == [0, 1, 2, 3, 4]   # -F: all five neighbours


@pytest.mark.parametrize("variance", ["separate", "tied"])
def test_em_on_inverse_splits_the_cluster_em_on_neg_loss_keeps_it(variance):
    """Hand-worked: on 1/F = (100, 50, 3.3, 2.9, 2.5 | 0.5 .. 0.36) the two near-self
    values form the high component by themselves and three same-cluster neighbours
    are dropped; on -F = (-0.01 .. -0.4 | -2.0 .. -2.8) the neighbours stay together."""
    neighbors, cand, sample, sim = hand_case()
    new_inv, failed_inv = hnm_update(neighbors, cand, sample, loss_em_input(sim, "inverse"), variance=variance)
    new_neg, failed_neg = hnm_update(neighbors, cand, sample, loss_em_input(sim, "neg_loss"), variance=variance)
    assert failed_inv.tolist() == [False] and failed_neg.tolist() == [False]
    assert torch.nonzero(new_inv[0]).flatten().tolist() == [1, 2]            # list collapses to 2
    assert torch.nonzero(new_neg[0]).flatten().tolist() == [1, 2, 3, 4, 5]   # N kept


# ---------------------------------------------------------------- through PANMLoss

N, K = 10, 4


def loss_table():
    """Clusters {0..4} and {5..9}.  Client i's losses of its same-cluster peers, in
    index order, are 0.01, 0.02, 0.3, 0.4; of the other cluster 2.0 .. 2.8."""
    table = torch.full((N, N), 9.0, dtype=torch.float64)
    for i in range(N):
        same = [j for j in range(N) if j // 5 == i // 5 and j != i]
        other = [j for j in range(N) if j // 5 != i // 5]
        table[i, same] = torch.tensor([0.01, 0.02, 0.3, 0.4], dtype=torch.float64)
        table[i, other] = torch.tensor([2.0, 2.2, 2.4, 2.6, 2.8], dtype=torch.float64)
    return table


def run_panm_loss(em_input, rounds=2, em_variance="tied"):
    """T1 = 1, k = 4, l = 9 >= n - 1: CNI ranks everyone (list = the 4 same-cluster
    peers) and HNM samples all of N and all non-neighbours, so nothing is random."""
    cfg = Config()
    cfg.algorithm.k, cfg.algorithm.l, cfg.panm.tau = K, N - 1, 1
    cfg.stage1_rounds = 1
    cfg.panm.em_input, cfg.panm.em_variance = em_input, em_variance
    alg = make_panm_loss(cfg)
    ids = torch.arange(N)
    table = loss_table()

    def pair_loss(models, local_index):
        return table[ids[local_index], models.argmax(1)].to(torch.float32)   # model j = unit vector j

    ctx = Context(n=N, client_ids=ids, clusters=ids // 5, seed=3, stage1_rounds=1, w0=torch.zeros(N),
                  device=torch.device("cpu"), pair_loss=pair_loss)
    models = torch.eye(N)
    state = alg.init(ctx)
    out = []
    for t in range(1, rounds + 1):
        state, _ = alg.select(state, ctx, RoundView(round=t, before=models, after=models, all_after=models))
        out.append(state)
    return out


@pytest.mark.parametrize("em_variance", ["separate", "tied"])
def test_panm_loss_stage_two_by_em_input(em_variance):
    same = [[j for j in range(N) if j // 5 == i // 5 and j != i] for i in range(N)]
    for em_input in ("neg_loss", "inverse"):
        one, two = run_panm_loss(em_input, em_variance=em_variance)
        for i in range(N):   # CNI: top 4 by 1/F = the 4 same-cluster peers, either way
            assert torch.nonzero(one.neighbors[i]).flatten().tolist() == same[i]
        assert not two.hnm_failed.any()
        for i in range(N):
            got = torch.nonzero(two.neighbors[i]).flatten().tolist()
            want = same[i] if em_input == "neg_loss" else same[i][:2]   # inverse keeps the near-self two
            assert got == want, (em_input, i, got)
        # what the state records is s = 1/F either way
        assert math.isclose(float(similarity_matrix(two.pool, two.similarity)[0, 1]), 1.0 / 0.01, rel_tol=1e-5)


def test_em_input_config():
    registry.load_builtin()   # every built-in section in the Config, also where this module runs alone
    cfg = Config()
    assert cfg.panm.em_input == "neg_loss"
    assert make_panm_loss(cfg).panm.em_input == "neg_loss"
    cfg.panm.em_input = "inverse"
    assert make_panm_loss(cfg).panm.em_input == "inverse"
    cfg.panm.em_input = "1/F"
    for make in (make_panm_loss, make_panm_grad):
        with pytest.raises(ConfigError) as err:
            make(cfg)
        assert err.value.field == "panm.em_input" and "neg_loss" in str(err.value)
    with pytest.raises(ConfigError):
        registry.get("panm_loss").check(cfg)
    registry.get("pens").check(cfg)     # other methods ignore the panm section
