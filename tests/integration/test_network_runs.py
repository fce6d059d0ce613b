"""The whole-run tests of tests/unit/test_network.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

from __future__ import annotations

import pytest
import torch
from run_files import FAULT_RUNS

from fedclust.config import load_config


def test_a_round_with_nobody_online_is_skipped_and_said_and_changes_nothing(tmp_path):
    import json

    import numpy as np
    from test_resume import launch, overrides

    trace = np.ones((8, 8), dtype=bool)
    trace[2] = False                      # round 3: nobody
    trace[4, :3] = False                  # round 5: clients 0-2 offline
    np.save(tmp_path / "on.npy", trace)
    out = tmp_path / "r"
    proc = launch(1, overrides("random", out, f"network.availability={tmp_path / 'on.npy'}", "checkpoint_every=0"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "round 3: no client online (network.availability); skipped" in proc.stderr
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[2]["train_loss"] is None and records[2]["client_accuracy"] == records[1]["client_accuracy"]
    assert records[2]["models_received_total"] == records[1]["models_received_total"]
    assert records[4]["models_received_total"] - records[3]["models_received_total"] < 8 * 2   # fewer delivered


@pytest.mark.parametrize("kind,scale", [("sign_flip", 3.0), ("gaussian", 0.3)])
def test_a_model_poisoning_attacker_keeps_its_own_trained_model(tmp_path, kind, scale):
    """A sign_flip or gaussian attacker under Random takes in nothing: each round its accuracy is that of the
    same client under Local with no attack (same init, same batches); the honest clients do take in its poison."""
    import json

    from test_resume import overrides

    from fedclust.attack import attackers
    from fedclust.runner import prepare, run

    runs = {"attacked": ("random", "attack.fraction=0.25", f"attack.kind={kind}", f"attack.scale={scale}"),
            "local": ("local",)}
    acc = {}
    for name, (algo, *extra) in runs.items():   # in this process: the processes' question is tested elsewhere
        config = load_config(None, overrides(algo, tmp_path / name, *extra, "progress=false", "figures=false"))
        run(config, prepare(config))
        acc[name] = torch.tensor([json.loads(x)["client_accuracy"]
                                  for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()])
    bad = attackers(config.seed, config.clients, 0.25)
    assert bad is not None and int(bad.sum()) == -(-config.clients // 4)
    assert torch.equal(acc["attacked"][:, bad], acc["local"][:, bad])
    assert not torch.equal(acc["attacked"][:, ~bad], acc["local"][:, ~bad])


def test_a_run_under_every_fault_killed_on_two_processes_resumes_exactly(tmp_path):
    """A graph redrawn every 2 rounds, clients offline, lost messages, stragglers and attackers at once: killed
    after round 5 on 2 processes, resumed on 1, it ends as the uninterrupted run."""
    from test_resume import assert_same_run, killed_run, launch, overrides, sub_run

    faults = ("algorithm.k=2", "network.graph=regular", "network.degree=4", "network.redraw_every=2",
              "network.p_offline=0.2", "network.p_drop=0.2", "network.stragglers=0.3", "attack.fraction=0.25")
    killed_run(2, "panm_grad", tmp_path / "killed", *faults)
    sub_run("panm_grad", tmp_path / "killed", *faults)
    whole = launch(2, overrides("panm_grad", tmp_path / "whole", *faults))
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert_same_run(tmp_path / "whole", tmp_path / "killed")


@pytest.mark.xdist_group("one_and_two")   # one worker launches the two jobs for all of them (conftest.py)
@pytest.mark.parametrize("name,faults", FAULT_RUNS, ids=[name for name, _ in FAULT_RUNS])
def test_runs_under_faults_are_identical_on_one_and_two_processes(one_and_two, name, faults):
    import json

    from test_resume import assert_same_run

    assert_same_run(one_and_two[1] / "faults" / name, one_and_two[2] / "faults" / name)
    if any(f.startswith("attack.") for f in faults):
        summary = json.loads((one_and_two[1] / "faults" / name / "summary.json").read_text())
        assert summary["honest_accuracy"] != summary["final_accuracy"]          # the attackers are left out
        assert summary["worst_cluster_accuracy"] <= summary["honest_accuracy"]


@pytest.mark.xdist_group("one_and_two")   # launched with the other 1-and-2-process runs (conftest.py)
def test_panm_dropping_silent_neighbours_is_identical_on_one_and_two_processes(one_and_two):
    from test_resume import assert_same_run

    assert_same_run(one_and_two[1] / "silent" / "panm_grad", one_and_two[2] / "silent" / "panm_grad")
