"""The whole-run tests of tests/unit/test_centralized.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import numpy as np
import pytest
from test_centralized import read_metrics, run_cfg, same_partition  # noqa: E402


@pytest.mark.parametrize("extra", [
    ["algorithm.name=ifca", "ifca.restarts=2", "ifca.restart_rounds=3"],
    ["algorithm.name=cfl", "cfl.warmup=4", "cfl.eps1=1.5"],
    ["algorithm.name=fedgroup"],
    # FPFC with its defaults on what papers/004 trains: logistic regression, FedProx-style SGD, and inputs
    # that do not tell the clients apart (data.synthetic_inputs=shared)
    ["algorithm.name=fpfc", "rounds=20", "model=logreg", "data.synthetic_inputs=shared", "data.synthetic_dim=60",
     "train.lr=0.01", "train.momentum=0", "train.batch_size=10", "train.local_epochs=5"],
], ids=["ifca", "cfl", "fedgroup", "fpfc"])
def test_clustering_methods_recover_the_true_clusters(tmp_path, extra):
    cfg, s = run_cfg(tmp_path, *extra)
    assert s["num_clusters"] == 2 and s["ari"] == pytest.approx(1.0)
    n, T = cfg.clients, cfg.rounds
    # every client takes part: it receives its model (IFCA: all K), uploads one
    per_client = cfg.ifca.clusters if cfg.algorithm.name == "ifca" else 1
    assert s["models_received_total"] == T * n * (per_client + 1)
    assert s["max_models_received_per_round"] == n  # the server, each round
    saved = np.load(tmp_path / "run" / "neighbors.npz")
    assert same_partition(saved["assignment"], saved["clusters"])


@pytest.mark.parametrize("name", ["fedavg", "ifca", "cfl", "fedgroup", "fedgrouprox", "fpfc"])
def test_partial_participation_runs(tmp_path, name):
    """participation=0.5: 6 of 12 clients upload per round (server_received)."""
    cfg, s = run_cfg(tmp_path, f"algorithm.name={name}", "participation=0.5", "rounds=6", "cfl.warmup=2",
                     "cfl.eps1=1.5", "ifca.restart_rounds=1", "other_sections=true")   # one line for six methods
    assert s["rounds_completed"] == 6 and s["num_clusters"] >= 1
    sent = cfg.ifca.clusters if name == "ifca" else 1
    if name != "cfl":   # CFL's pending clients receive two models
        extra_round1 = 0
        if name in ("fedgroup", "fedgrouprox"):   # round 1 also trains the cold-start set S (all 12 here)
            extra_round1 = 12 - 6
        assert s["models_received_total"] == (6 * 6 + extra_round1) * (sent + 1)


@pytest.mark.xdist_group("one_and_two")   # launched with the other 1-and-2-process runs (conftest.py)
def test_one_and_two_processes_agree(one_and_two):
    """IFCA on 11 clients over 2 ranks (6 + 5): every client's choice crosses
    ranks through the gathered start models, and the restarts' objective
    through one all-reduce; half the clients take part, so each rank trains
    only its participants (RoundPlan.trains); same clusters and accuracies."""
    one, two = (read_metrics(one_and_two[n] / "centralized" / "ifca") for n in (1, 2))
    assert len(one) == len(two) == 4
    for a, b in zip(one, two):
        assert a["ari"] == pytest.approx(b["ari"], abs=1e-12) and a["num_clusters"] == b["num_clusters"]
        assert a["client_accuracy"] == pytest.approx(b["client_accuracy"], abs=0.01)
        assert a["models_received_total"] == b["models_received_total"]
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
