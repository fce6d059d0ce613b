"""The model you would deploy (issue 36, part 2): ``data.validation`` for every algorithm, each client's test
accuracy at its best-validation round, and the accuracy weighted by test examples beside the mean over clients."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.evaluation import best_validation
from fedclust.runner import prepare, run

SMALL = ["clients=6", "rounds=4", "data.train_size=40", "data.test_size=20", "progress=false", "figures=false",
         "checkpoint_every=0"]


def records(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_best_validation_by_hand():
    history = [{"round": 1, "client_accuracy": [50.0, 60.0, 70.0], "client_validation_accuracy": [40.0, 90.0, 10.0]},
               {"round": 2, "client_accuracy": [55.0, 20.0, 75.0], "client_validation_accuracy": [45.0, 90.0, 30.0]},
               {"round": 3, "client_accuracy": [52.0, 30.0, 71.0], "client_validation_accuracy": [44.0, 80.0, 30.0]}]
    got = best_validation(history)
    # client 0: round 2 (45); client 1: round 1 (90, the earliest of the tie); client 2: round 2 (30, earliest)
    assert got["best_validation_rounds"] == [2, 1, 2]
    assert got["best_validation_accuracy"] == pytest.approx((55.0 + 60.0 + 75.0) / 3)
    assert best_validation([{"round": 1, "client_accuracy": [1.0]}]) == {}


@pytest.mark.parametrize("algorithm", ["random", "fedavg", "panm_loss"])
def test_a_run_with_data_validation_reports_each_clients_best_validation_round(tmp_path, algorithm):
    out = tmp_path / algorithm
    cfg = load_config("configs/fmnist_rotation2.yaml", SMALL + [f"algorithm.name={algorithm}", "algorithm.l=2",
                                                                 "algorithm.k=2", "stage1_rounds=2",
                                                                 "data.validation=0.25", f"out={out}"])
    summary = run(cfg, prepare(cfg))
    recs = records(out)
    val = np.array([r["client_validation_accuracy"] for r in recs])
    test = np.array([r["client_accuracy"] for r in recs])
    assert val.shape == (4, 6)
    for r in recs:   # the mean is the clients' mean (to their 2 decimals)
        assert r["validation_accuracy"] == pytest.approx(float(np.mean(r["client_validation_accuracy"])), abs=0.01)
    # a plain loop over clients: the first round of the highest validation accuracy
    rounds, accs = [], []
    for c in range(6):
        best = max(range(4), key=lambda i: (val[i, c], -i))
        rounds.append(recs[best]["round"])
        accs.append(test[best, c])
    assert summary["best_validation_rounds"] == rounds
    assert summary["best_validation_accuracy"] == pytest.approx(float(np.mean(accs)))
    assert summary["train_size"] == 40   # the setting: 30 train and 10 validate
    # equal clients: the weighted accuracy is the mean
    assert summary["final_weighted_accuracy"] == pytest.approx(summary["final_accuracy"])


def test_without_a_split_nothing_is_added(tmp_path):
    cfg = load_config("configs/fmnist_rotation2.yaml", SMALL + ["algorithm.name=random", "algorithm.k=2",
                                                                 f"out={tmp_path / 'r'}"])
    summary = run(cfg, prepare(cfg))
    assert "best_validation_accuracy" not in summary and "client_validation_accuracy" not in records(tmp_path / "r")[0]


def test_weighted_accuracy_counts_test_examples(tmp_path):
    """Clients of 1, 3 and 6 test examples (a natural-form file): the weighted accuracy is the share of all test
    examples right, from each client's accuracy times its examples."""
    r = np.random.default_rng(0)
    train_owner = np.repeat([0, 1, 2], 8)
    test_owner = np.repeat([0, 1, 2], [1, 3, 6])
    arrays = {"x_train": r.normal(size=(24, 5)).astype(np.float32), "y_train": np.arange(24) % 3,
              "x_test": r.normal(size=(10, 5)).astype(np.float32), "y_test": np.arange(10) % 3,
              "client_train": train_owner, "client_test": test_owner}
    path = tmp_path / "natural.npz"
    np.savez(path, **arrays)
    out = tmp_path / "w"
    cfg = load_config(None, ["data.name=npz", f"data.path={path}", "clients=3", "algorithm.name=local", "rounds=3",
                             "progress=false", "figures=false", "checkpoint_every=0", f"out={out}"])
    summary = run(cfg, prepare(cfg))
    for rec in records(out):
        acc = np.array(rec["client_accuracy"]) / 100.0
        right = np.round(acc * np.array([1, 3, 6]))          # whole examples right per client
        assert rec["weighted_accuracy"] == pytest.approx(100.0 * right.sum() / 10, abs=1e-4)
        assert rec["accuracy"] == pytest.approx(100.0 * acc.mean(), abs=0.01)
    assert summary["final_weighted_accuracy"] == records(out)[-1]["weighted_accuracy"]


@pytest.mark.parametrize("extra,words", [
    (["data.validation=1.0"], "must lie in [0, 1)"),
    (["data.validation=0.999", "data.train_size=20"], "each part needs at least one"),
    (["algorithm.name=cfl", "data.validation=0.3"], "cfl.validation = 0.2"),
])
def test_bad_validation_shares_are_refused_naming_the_key(extra, words):
    with pytest.raises(ConfigError) as e:
        load_config("configs/fmnist_rotation2.yaml", extra)
    assert e.value.field == "data.validation" and words in str(e.value)


def test_cfl_and_data_validation_of_the_same_share_carve_one_split():
    cfg = load_config("configs/fmnist_rotation2.yaml", ["algorithm.name=cfl", "data.validation=0.2"])
    assert cfg.data.validation == 0.2
