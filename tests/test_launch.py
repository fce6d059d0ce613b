"""launch.grid and launch.submit without Slurm: grid expansion, run
directories, what a resubmission skips, the job callable's exits, --local."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedclust.errors import FedclustError
from launch import jobs, submit
from launch.grid import Point, dir_name, expand, parse_axes

ROOT = Path(__file__).resolve().parents[1]


def test_expand_is_the_product_in_order_with_named_dirs(tmp_path):
    points = expand(parse_axes(["seed=0,1,2", "algorithm.name=panm_loss,panm_grad"]), tmp_path)
    assert [p.overrides for p in points] == [[f"seed={s}", f"algorithm.name={a}"]
                                             for s in "012" for a in ("panm_loss", "panm_grad")]
    assert points[1].out == tmp_path / "seed=0,algorithm.name=panm_grad"
    assert len({p.out for p in points}) == 6
    assert dir_name((("data.root", "/x y"),)) == "data.root=_x_y"
    assert expand([], tmp_path) == [Point((), tmp_path / "run")]


@pytest.mark.parametrize("spec, words", [
    (["seed"], "KEY=V1,V2"), (["seed=0,,1"], "no empty value"), (["seed=0", "seed=1"], "given twice"),
    (["out=a,b"], "--out"), (["seed=1,1"], "repeated"),
])
def test_bad_axes_are_refused_naming_the_fix(spec, words):
    with pytest.raises(FedclustError, match=words):
        parse_axes(spec)


def test_every_point_is_checked_before_anything_runs(tmp_path):
    with pytest.raises(FedclustError, match=r"grid point seed=1,algorithm.name=lcal: .*did you mean 'local'"):
        submit.submit_grid("configs/synthetic_cluster4.yaml", ["seed=1", "algorithm.name=local,lcal"],
                           out=str(tmp_path), local=True, echo=lambda *_: None)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FedclustError, match="--out"):
        submit.submit_grid("configs/synthetic_cluster4.yaml", ["seed=1"], ["out=x"], out=str(tmp_path))
    with pytest.raises(FedclustError, match="--signal-seconds 7200"):
        submit.submit_grid("configs/synthetic_cluster4.yaml", ["seed=1"], out=str(tmp_path),
                           resources=jobs.Resources(time_min=60, signal_seconds=7200))


def test_plan_skips_finished_and_queued_runs(tmp_path, monkeypatch):
    a, b, c = expand(parse_axes(["seed=0,1,2"]), tmp_path)
    a.out.mkdir()
    (a.out / "summary.json").write_text("{}")
    ledger = jobs.Ledger(tmp_path)
    ledger.record([(b, "7_1", "log"), (c, "7_2", "log")])
    monkeypatch.setattr(submit, "job_state", {"7_1": "RUNNING", "7_2": None}.get)
    todo, skipped = submit.plan([a, b, c], ledger)
    assert todo == [c]   # its job left the queue without finishing: submit again (it resumes)
    assert skipped == [(a, "finished"), (b, "job 7_1 is RUNNING")]


def test_job_callable_leaves_by_systemexit_when_requeued(monkeypatch):
    """Exit 75 (checkpointed and requeued): SystemExit, so submitit writes no
    result and the requeued job runs the callable again; other failures raise."""
    import fedclust.cli

    call = jobs.RunPoint("c.yaml", ("seed=1",), "runs/x")
    assert call.argv() == ["run", "c.yaml", "seed=1", "out=runs/x"]
    for rc, expect in ((75, SystemExit), (2, RuntimeError)):
        monkeypatch.setattr(fedclust.cli, "main", lambda argv, rc=rc: rc)
        with pytest.raises(expect):
            call()
    monkeypatch.setattr(fedclust.cli, "main", lambda argv: 0)
    assert call() == "runs/x"


def test_slurm_executor_asks_for_usr1_requeue_and_gres(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs.shutil, "which", lambda name: f"/usr/bin/{name}")
    import submitit.slurm.slurm as ss

    monkeypatch.setattr(ss.SlurmExecutor, "affinity", staticmethod(lambda: 2))   # as if on a Slurm login node
    ex = jobs.slurm_executor(tmp_path, "fedclust-x", jobs.Resources(gpus=4, partition="gpu", time_min=120))
    script = ex._executor._make_submission_file_text("python -m x", "uid")
    for line in ("--requeue", "--signal=USR1@180", "--gres=gpu:4", "--ntasks-per-node=4", "--partition=gpu",
                 "--time=120"):
        assert f"#SBATCH {line}" in script
    assert "gpus-per-task" not in script


def test_local_grid_runs_in_sequence_and_skips_when_run_again(tmp_path):
    def go():
        return subprocess.run([sys.executable, "-m", "launch.submit", "configs/synthetic_cluster4.yaml",
                               "--grid", "algorithm.name=local,fedavg", "--local", "--out", str(tmp_path),
                               "clients=8", "rounds=2", "figures=false", "progress=false"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    proc = go()
    assert proc.returncode == 0, proc.stderr[-3000:]
    for alg in ("local", "fedavg"):
        got = json.loads((tmp_path / f"algorithm.name={alg}" / "summary.json").read_text())
        assert (got["algorithm"], got["rounds_completed"]) == (alg, 2)
    assert "| fedavg | 1 |" in proc.stdout and f"fedclust report {tmp_path}/*" in proc.stdout
    again = go()
    assert again.returncode == 0 and "nothing to submit" in again.stdout
