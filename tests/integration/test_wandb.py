"""Weights & Biases tracking, offline (no network): what a run logs, whose
settings win, one W&B run across a kill and a resume, preemption."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import wandb_offline as wo

from fedclust import checkpoint
from fedclust.config import load_config
from fedclust.outputs import default_out
from fedclust.stopping import EXIT_REQUEUE
from fedclust.tracking import init_kwargs, neighbour_rows

ROOT = Path(__file__).resolve().parents[2]
RUN = ["configs/synthetic_cluster4.yaml", "algorithm.name=panm_grad", "algorithm.k=2", "algorithm.l=5", "clients=8",
       "rounds=8", "stage1_rounds=4", "train.local_epochs=2", "progress=false", "wandb.enabled=true"]


def env(**extra):
    base = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return dict(base, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", WANDB_MODE="offline", WANDB_SILENT="true", **extra)


def fedclust(*args, **extra_env):
    return subprocess.Popen([sys.executable, "-m", "fedclust", "run", *RUN, *args], cwd=ROOT, env=env(**extra_env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finished(proc, rc=0):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == rc, err[-3000:]
    return err


def metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_offline_run_logs_rounds_summary_figures_and_lists(tmp_path):
    out = tmp_path / "run"
    finished(fedclust(f"out={out}", WANDB_PROJECT="from-env"))
    files = wo.run_file(out)
    assert len(files) == 1
    recs = wo.records(files[0])
    info = wo.run_info(recs)
    assert info.project == "from-env"            # the environment's project: the config left it unset
    assert info.display_name == "run"            # the run directory's name
    stored = json.loads((out / "wandb.json").read_text())
    assert stored == {"id": info.run_id, "step": 8}
    rows = wo.history(recs)
    assert [r["_step"] for r in rows] == list(range(1, 9))
    for row, rec in zip(rows, metrics(out)):
        assert row["accuracy"] == pytest.approx(rec["accuracy"], rel=1e-12)
        assert row["client_accuracy/_type"] == "histogram"
        assert row["client_accuracy_min"] == pytest.approx(min(rec["client_accuracy"]))
    summary = json.loads((out / "summary.json").read_text())
    assert wo.summary(recs)["final_accuracy"] == pytest.approx(summary["final_accuracy"], rel=1e-12)
    last = rows[-1]
    assert last["neighbours/_type"] == "table-file" and last["neighbours/nrows"] == 8
    assert last["figures/accuracy/_type"] == "image-file"
    _, saved = checkpoint.newest(out)
    assert saved["run_id"] == info.run_id           # a continued run continues this W&B run


def test_disabled_mode_writes_no_wandb_run(tmp_path):
    out = tmp_path / "run"
    finished(fedclust(f"out={out}", "wandb.mode=disabled", "rounds=2", "stage1_rounds=1"))
    assert wo.run_file(out) == [] and (out / "summary.json").exists()


def test_config_values_win_and_unset_ones_are_not_passed(tmp_path):
    cfg = load_config("configs/synthetic_cluster4.yaml", ["wandb.enabled=true", "wandb.project=p", "wandb.tags=[a,b]"])
    kw = init_kwargs(cfg, tmp_path / "r", None, env={"WANDB_MODE": "offline", "WANDB_ENTITY": "lab"})
    assert kw == {"dir": str(tmp_path / "r"), "resume": "allow", "project": "p", "tags": ["a", "b"], "name": "r"}
    cfg = load_config("configs/synthetic_cluster4.yaml", ["wandb.enabled=true", "wandb.mode=online", "wandb.name=x"])
    kw = init_kwargs(cfg, tmp_path / "r", "abc123", env={"WANDB_PROJECT": "q", "WANDB_MODE": "offline"})
    assert kw == {"dir": str(tmp_path / "r"), "resume": "allow", "mode": "online", "name": "x", "id": "abc123"}
    # Nothing set anywhere: fedclust's project, the directory's name; mode left to W&B (online).
    kw = init_kwargs(load_config(None, ["wandb.enabled=true"]), tmp_path / "r", None, env={})
    assert kw == {"dir": str(tmp_path / "r"), "resume": "allow", "project": "fedclust", "name": "r"}


def test_neighbour_table_rows():
    import numpy as np

    lists = np.array([[0, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=bool)
    assert neighbour_rows(lists, None, [0, 0, 1]) == [[0, 0, None, "1 2"], [1, 0, None, "0"], [2, 1, None, ""]]
    assert neighbour_rows(None, np.array([1, 1, 0]), [0, 0, 1]) == [[0, 0, 1, ""], [1, 0, 1, ""], [2, 1, 0, ""]]


def test_sweep_agent_run_takes_its_directory_from_the_run_id():
    cfg = load_config(None, [])
    assert default_out(cfg, env={"WANDB_SWEEP_ID": "sw1", "WANDB_RUN_ID": "r9"}) == "runs/sweeps/sw1/r9"
    assert default_out(cfg, env={"WANDB_RUN_ID": "r9"}).startswith("runs/local-")


def wait_for(path: Path, proc, timeout=240):
    end = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None and time.time() < end, proc.communicate()[1][-3000:]
        time.sleep(0.05)


def _logged(out: Path, step: int) -> bool:
    """Whether the offline W&B file already holds ``step``; a record the service is still writing reads as not yet."""
    from google.protobuf.message import DecodeError

    try:
        return any(r["_step"] == step for f in wo.run_file(out) for r in wo.history(wo.records(f)))
    except DecodeError:
        return False


def test_killed_and_resumed_run_is_one_wandb_run_without_repeated_steps(tmp_path):
    """SIGKILL after round 5 with the newest checkpoint at round 3: the resumed
    run redoes rounds 4 and 5 but does not log them again."""
    out = tmp_path / "run"
    proc = fedclust(f"out={out}", "checkpoint_every=3", "plugins=[tests/plugins/pause_after_round.py]",
                    PAUSE_AFTER_ROUND="5")
    wait_for(out / ".paused", proc)
    end = time.time() + 60   # W&B's service writes the file asynchronously: wait for round 5 in it
    while not _logged(out, 5):
        assert time.time() < end, "round 5 never reached the offline W&B file"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    finished(fedclust(f"out={out}", "checkpoint_every=3"))
    files = wo.run_file(out)
    assert len(files) == 2
    runs = [wo.records(f) for f in files]
    assert len({wo.run_info(r).run_id for r in runs}) == 1   # one W&B run, continued
    steps = [row["_step"] for r in runs for row in wo.history(r)]
    assert steps == list(range(1, 9))                       # every round once
    assert len(metrics(out)) == 8


def test_stopped_run_marks_the_wandb_run_preempting(tmp_path):
    out = tmp_path / "run"
    proc = fedclust(f"out={out}", "rounds=400", "stage1_rounds=10")
    end = time.time() + 240
    while not ((out / "metrics.jsonl").exists() and len((out / "metrics.jsonl").read_text().splitlines()) >= 3):
        assert proc.poll() is None and time.time() < end, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGUSR1)
    finished(proc, rc=EXIT_REQUEUE)
    recs = wo.records(wo.run_file(out)[0])
    kinds = [r.WhichOneof("record_type") for r in recs]
    assert "preempting" in kinds
    assert [r.exit.exit_code for r in recs if r.WhichOneof("record_type") == "exit"] == [EXIT_REQUEUE]
