"""End to end: outputs, 1 vs 2 processes, real Fashion-MNIST, bad input."""

import json
import sys
from pathlib import Path

import pytest

from fedclust.cli import main
from fedclust.config import load_config
from fedclust.errors import ConfigError, DivergenceError
from fedclust.runner import prepare, run

SMALL = ["data.name=synthetic", "data.train_size=40", "data.test_size=20", "clients=8", "rounds=3",
         "stage1_rounds=2", "algorithm.k=2", "algorithm.l=3", "progress=false", "seed=5"]


def small_run(tmp_path, *extra, name="run"):
    cfg = load_config(None, SMALL + [f"out={tmp_path / name}", *extra])
    return cfg, run(cfg, prepare(cfg))


def read_metrics(path):
    return [json.loads(line) for line in Path(path, "metrics.jsonl").read_text().splitlines()]


def test_outputs_of_a_run(tmp_path):
    cfg, summary = small_run(tmp_path, "algorithm.name=random")
    out = tmp_path / "run"
    assert (out / "config.yaml").is_file()
    lines = read_metrics(out)
    assert [r["round"] for r in lines] == [1, 2, 3]
    for r in lines:
        assert len(r["client_accuracy"]) == 8
        assert r["accuracy"] == pytest.approx(sum(r["client_accuracy"]) / 8, abs=0.01)
        assert 0 <= r["neighbor_precision"] <= 1 and 0 <= r["neighbor_recall"] <= 1
    saved = json.loads((out / "summary.json").read_text())
    for key in ("algorithm", "final_accuracy", "best_accuracy", "rounds_completed", "neighbor_precision",
                "neighbor_recall", "wall_seconds"):
        assert key in saved
    assert saved["rounds_completed"] == 3
    assert saved["final_accuracy"] == pytest.approx(lines[-1]["accuracy"])
    assert saved["best_accuracy"] == pytest.approx(max(r["accuracy"] for r in lines))
    assert load_config(out / "config.yaml") == cfg
    for fig in ("accuracy.png", "heatmap_stage1.png", "neighbor_graph.png"):
        assert (out / "figures" / fig).stat().st_size > 1000
    assert saved["models_received_total"] == 8 * 2 * 3  # k = 2 peers per client per round
    assert saved["max_models_received_per_round"] == 2


def test_panm_run_writes_its_figures_and_cluster_recovery(tmp_path):
    _, s = small_run(tmp_path, "algorithm.name=panm_grad", "rounds=4", name="panm")
    figs = tmp_path / "panm" / "figures"
    for fig in ("similarity_hist.png", "cni_precision.png", "heatmap_stage1.png", "neighbor_graph.png"):
        assert (figs / fig).is_file()
    assert s["num_clusters"] >= 1 and -1.0 <= s["ari"] <= 1.0
    # a client fetches at least its l = 3 candidates a round, at most every other client (HNM: l + l + k)
    assert 3 <= s["max_models_received_per_round"] <= 7


def test_oracle_precision_is_one_and_local_has_no_list(tmp_path):
    _, s = small_run(tmp_path, "algorithm.name=oracle", name="oracle")
    assert s["neighbor_precision"] == pytest.approx(1.0)
    _, s = small_run(tmp_path, "algorithm.name=local", name="local")
    assert s["neighbor_precision"] is None


def test_existing_run_is_not_overwritten(tmp_path):
    _, first = small_run(tmp_path, "algorithm.name=local")
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError) as e:
        small_run(tmp_path, "algorithm.name=local", "resume=never")
    assert e.value.field == "out"
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    _, again = small_run(tmp_path, "algorithm.name=local")     # resumes from the final checkpoint: nothing to do
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    assert again["final_accuracy"] == first["final_accuracy"]


def test_divergence_names_round_and_clients_and_keeps_metrics(tmp_path):
    with pytest.raises(DivergenceError) as e:
        # the MLP (synthetic's default, logreg, keeps finite losses at this lr: log-softmax of huge logits)
        small_run(tmp_path, "algorithm.name=local", "train.lr=1e30", "rounds=5", "train.lr_decay=1.0", "model=mlp")
    assert "round" in str(e.value) and e.value.clients
    written = read_metrics(tmp_path / "run")
    assert [r["round"] for r in written] == list(range(1, e.value.round))


def test_cli_check_and_bad_key(tmp_path, capsys):
    assert main(["check", "configs/fmnist_rotation2.yaml", "algorithm.k=4"]) == 0
    assert "k: 4" in capsys.readouterr().out
    assert main(["check", "configs/fmnist_rotation2.yaml", "algorithm.kk=4"]) == 2
    err = capsys.readouterr().err
    assert "algorithm.kk" in err and "algorithm.k" in err


def _without_times(records):
    return [{k: v for k, v in r.items() if k != "round_seconds"} for r in records]


@pytest.mark.xdist_group("one_and_two")   # launched with the other 1-and-2-process runs (conftest.py)
def test_one_and_two_processes_agree(one_and_two):
    """9 clients over 2 ranks (5 + 4), every process on one thread: every number and neighbour list identical
    (docs/what-it-does.md's claim; tests/unit/test_plugins.py, tests/integration/test_resume.py and tests/unit/test_network.py check it
    for every algorithm on 8 clients, PANMLoss under faults)."""
    import numpy as np

    dirs = [one_and_two[n] / "run" / "panm_grad" for n in (1, 2)]
    assert all("FutureWarning" not in one_and_two["stderr"][n] for n in (1, 2))   # the gather uses torch's API
    one, two = (read_metrics(d) for d in dirs)
    assert _without_times(one) == _without_times(two)
    l1, l2 = (np.load(d / "neighbors.npz") for d in dirs)
    assert (l1["final_lists"] >= 0).any()
    assert np.array_equal(l1["final_lists"], l2["final_lists"])
    assert np.array_equal(l1["stage1_counts"], l2["stage1_counts"])


def _fmnist_available():
    try:
        from fedclust.data import sources

        return any(sources.read_idx_folder(f) is not None for f in sources.fmnist_folders("data"))
    except Exception:
        return False


def test_short_run_on_real_fashion_mnist(tmp_path):
    if not _fmnist_available():
        pytest.skip("Fashion-MNIST IDX files not installed (apt-get install dataset-fashion-mnist)")
    cfg = load_config("configs/fmnist_rotation2.yaml",
                      ["clients=20", "rounds=3", "algorithm.name=oracle", "progress=false",
                       f"out={tmp_path / 'fm'}"])
    summary = run(cfg, prepare(cfg))
    assert summary["rounds_completed"] == 3
    assert summary["final_accuracy"] > 50.0  # 10 classes: chance is 10%
    assert summary["neighbor_precision"] == pytest.approx(1.0)


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "ifca", "cfl", "fedgroup", "fedgrouprox", "fpfc"])
def test_only_participants_train_and_nothing_else_changes(tmp_path, monkeypatch, name):
    """participation=0.5: the algorithms train only the round's participants (RoundPlan.trains; FedGroup's
    cold-start subset too in round 1).  Every metric but train_loss equals the run where every client trains
    and the aggregate drops the others' models; train_loss is the participants' mean."""
    import torch

    import fedclust.round as runner   # where the round step calls the engine
    from fedclust.algorithms.aggregation import participants

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
    from record import GOLDEN_OVERRIDES

    calls = []

    def everyone(*args, train=None, **kwargs):      # as before RoundPlan.trains: every client trains
        calls.append(train)
        return real(*args, **kwargs)

    def records(out):
        cfg = load_config(None, GOLDEN_OVERRIDES + [f"algorithm.name={name}", "participation=0.5", "rounds=7",
                                                    f"out={out}"])
        run(cfg, prepare(cfg))
        return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]

    real = runner.train_round
    monkeypatch.setattr(runner, "train_round", everyone)
    old = records(tmp_path / "all")
    assert len(calls) == 7 and all(c is not None for c in calls)   # the algorithm asked for participants only
    trains = calls
    monkeypatch.setattr(runner, "train_round", real)
    new = records(tmp_path / "participants")
    for t, (a, b) in enumerate(zip(old, new), start=1):
        skip = {"train_loss", "round_seconds"}
        assert {k: v for k, v in a.items() if k not in skip} == {k: v for k, v in b.items() if k not in skip}
        assert b["train_loss"] == b["train_loss"]      # finite: the skipped clients' NaN are left out
        share = participants(3, t, 8, 0.5)
        assert int(trains[t - 1].sum()) >= int(share.sum()) and bool(trains[t - 1][share].all())
        if name not in ("fedgroup", "fedgrouprox") or t > 1:
            assert torch.equal(trains[t - 1], share)
