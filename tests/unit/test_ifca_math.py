"""IFCA math (fedclust.algorithms.ifca) against hand values and plain loops."""

import pytest
import torch

from fedclust.algorithms.aggregation import cluster_average, cluster_counts
from fedclust.algorithms.ifca import assign_clusters


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


# ---------------------------------------------------------------- restarts

def test_ifca_objective_by_hand():
    from fedclust.algorithms.ifca import ifca_objective

    losses = torch.tensor([[0.5, 0.2], [0.3, 0.9], [float("nan"), 0.4]])
    total, count = ifca_objective(losses)
    assert float(total) == pytest.approx(0.2 + 0.3 + 0.4) and count == 3
    total, _ = ifca_objective(torch.tensor([[float("nan"), float("nan")]]))
    assert float(total) == float("inf")
    with pytest.raises(ValueError):
        ifca_objective(torch.zeros(3))


def test_global_mean_single_process():
    from fedclust.algorithms.ifca import global_mean

    assert global_mean(torch.tensor(0.9, dtype=torch.float64), 3) == pytest.approx(0.3)
    assert global_mean(torch.tensor(0.0), 0) == float("inf")


def test_pick_restart_by_hand():
    from fedclust.algorithms.ifca import pick_restart

    assert pick_restart([0.9, 0.4, 0.7]) == 1
    assert pick_restart([0.4, 0.4, 0.7]) == 0          # tie: the earliest
    assert pick_restart([float("nan"), 0.8]) == 1      # NaN never wins
    assert pick_restart([float("nan")]) == 0
    with pytest.raises(ValueError):
        pick_restart([])


def test_restart_boundary_by_hand():
    from fedclust.algorithms.ifca import restart_boundary

    # R = 3, T0 = 2: restart 0 trains rounds 1-2, restart 1 rounds 3-4, restart 2 rounds 5-6
    got = {t: restart_boundary(t, 3, 2) for t in range(1, 10)}
    assert got == {1: None, 2: None, 3: 0, 4: None, 5: 1, 6: None, 7: 2, 8: None, 9: None}
    assert all(restart_boundary(t, 1, 2) is None for t in range(1, 10))   # one restart: never


def test_restart_inits_are_keyed_on_seed_and_restart():
    from fedclust import rng
    from fedclust.algorithms.ifca import cluster_inits
    from fedclust.models import initial_weights

    def model_init(arch, shape, classes, seed):
        return initial_weights(arch, shape, classes, seed)[1]

    init = lambda seed: model_init("logreg", (3,), 4, seed)  # noqa: E731
    w0 = model_init("logreg", (3,), 4, 11)
    r0 = cluster_inits(w0, 2, 11, init, restart=0)
    r2 = cluster_inits(w0, 2, 11, init, restart=2)
    assert torch.equal(r0[0], w0)
    for k in range(2):
        s = int(rng.hash_ints(11, 2, "ifca_init", torch.tensor(k), 0))
        assert torch.equal(r2[k], model_init("logreg", (3,), 4, s))
    assert not torch.equal(r2[0], w0) and not torch.equal(r0, r2)
    assert torch.equal(r2, cluster_inits(w0, 2, 11, init, restart=2))   # a pure function


def test_ifca_restarts_run_in_turn_and_the_lowest_objective_wins():
    """R = 3 restarts of T0 = 1 round on a stand-in loss (distance to the
    client's target): restart r's models are its inits moved towards the
    targets by hand; the run goes on with the restart of lowest mean min loss."""
    from fedclust.algorithms import ifca
    from fedclust.algorithms.base import Context, RoundView

    n, P, K = 4, 3, 2
    targets = torch.tensor([[1.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0], [0, 1.0, 0]])

    def pair_loss(models, owner):
        return (models - targets[owner]).pow(2).sum(1)

    ctx = Context(n=n, client_ids=torch.arange(n), clusters=torch.zeros(n, dtype=torch.int64), seed=5,
                  stage1_rounds=0, w0=torch.zeros(P), device=torch.device("cpu"), pair_loss=pair_loss)
    init = lambda seed: initial_weights("logreg", (1,), 2, seed)[1]  # noqa: E731
    algo = ifca.Ifca(init, ifca.IfcaConfig(clusters=K, restarts=3, restart_rounds=1), participation=1.0)
    # stand-in inits (no model builds): restart r's K models
    inits = {0: torch.tensor([[0.0, 0, 0], [5.0, 5, 5]]), 1: torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]),
             2: torch.tensor([[3.0, 3, 3], [4.0, 4, 4]])}
    algo._inits = lambda ctx, r: inits[r].clone()
    state = algo.init(ctx)
    seen = []
    for t in range(1, 6):
        state, plan = algo.plan(state, ctx, t, torch.zeros(n, P))
        seen.append(plan.start.clone())
        after = plan.start.clone()   # no training: the models stay
        view = RoundView(round=t, before=plan.start, after=after, all_after=after, all_labels=plan.labels)
        state, res = algo.aggregate(state, ctx, view)
    # round 1 from restart 0, round 2 from restart 1, round 3 from restart 2, then restart 1 (objective 0)
    assert torch.equal(seen[0], inits[0][[0, 0, 0, 0]])
    assert torch.equal(seen[1], inits[1][[0, 0, 1, 1]])
    assert torch.equal(seen[2][0], inits[2][0])
    # restart 0: every client 1 from (0,0,0); restart 1: 0; restart 2: (3,3,3) is 4 + 9 + 9 = 22 from each target
    assert state.objectives == pytest.approx([1.0, 0.0, 22.0])
    assert state.picked == 1 and state.ended == []
    assert torch.equal(seen[3], inits[1][[0, 0, 1, 1]]) and torch.equal(seen[4], seen[3])


@pytest.mark.parametrize("overrides,field", [
    (["ifca.restarts=0"], "ifca.restarts"),
    (["ifca.restarts=3", "ifca.restart_rounds=0"], "ifca.restart_rounds"),
    (["ifca.restarts=3", "ifca.restart_rounds=10", "rounds=30"], "ifca.restarts"),
])
def test_restart_config_errors_name_field_and_fix(overrides, field):
    from fedclust.config import load_config
    from fedclust.errors import ConfigError

    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as err:
        load_config(None, ["algorithm.name=ifca", "data.name=synthetic", "clients=8", *overrides])
    assert "ifca." in str(err.value)


def test_restart_config_accepts_one_restart_with_few_rounds():
    from fedclust.config import load_config

    cfg = load_config(None, ["algorithm.name=ifca", "data.name=synthetic", "clients=8", "rounds=5", "ifca.restarts=1"])
    assert cfg.ifca.restarts == 1
