"""slurm/ scripts and launch.submit against a real one-node Slurm cluster
(Debian's slurm-wlm + munge, started by tests/slurm/start_cluster.sh; skipped
with the reason printed where it cannot start)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_cluster as sc
import wandb_offline as wo
from run_files import metrics, summary

# One cluster for all of them: one pytest-xdist worker (--dist loadgroup), marked here at collection so that the
# grouping does not depend on the order in which conftest's and xdist's collection hooks run.
pytestmark = pytest.mark.xdist_group("slurm")

ROOT = sc.ROOT
# Long enough to be stopped mid-run: 20 rounds, each followed by a 0.5 s sleep on the job's first start (the
# plug-in's SLOW_ROUND_SECONDS, in the job's environment: SLOW); the requeued job and the reference run at full speed.
LONG = ["rounds=20", "plugins=[tests/plugins/slow_rounds.py]"]
SLOW = {"SLOW_ROUND_SECONDS": "0.5"}


def test_smoke_job_matches_one_process(slurm_env, tmp_path):
    out, log = tmp_path / "slurm", tmp_path / "job.log"
    proc, job = sc.sbatch(slurm_env, f"--output={log}", "slurm/smoke_cpu.sh", f"out={out}", wait=True)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "2 tasks" in text and "rank 0 of 2" in text and "rank 1 of 2" in text   # srun started 2 ranks; both joined
    ref = tmp_path / "ref"
    sc.run_one_process(out / "config.yaml", ref)
    assert summary(out) == summary(ref)
    assert metrics(out) == metrics(ref)


def test_preempted_job_checkpoints_requeues_and_resumes(slurm_env, tmp_path):
    """Also tracked by W&B (offline): the W&B run hears it is preempted before
    the requeue ends the job, and the requeued job continues the same W&B run."""
    out, log = tmp_path / "slurm", tmp_path / "job.log"
    env = dict(slurm_env, WANDB_MODE="offline", WANDB_SILENT="true", **SLOW)
    _, job = sc.sbatch(env, f"--output={log}", "slurm/smoke_cpu.sh", f"out={out}", "wandb.enabled=true", *LONG)
    sc.preempt(env, job, out)
    first, second = [wo.records(f) for f in wo.run_file(out)]
    assert "preempting" in [r.WhichOneof("record_type") for r in first]
    assert wo.run_info(first).run_id == wo.run_info(second).run_id
    text = log.read_text()
    assert f"Slurm job {job} requeued" in text and "restart 1" in text, text[-3000:]
    assert "resuming" in text and (out / "summary.json").exists(), text[-3000:]
    stopped = int(text.split("stopped on SIGUSR1 after round ")[1].split(";")[0])
    assert 5 <= stopped < 20   # stopped mid-run, at a round boundary
    ref = tmp_path / "ref"
    sc.run_one_process(out / "config.yaml", ref, "wandb.enabled=false")
    assert metrics(out) == metrics(ref)   # every round once, as if never stopped
    assert summary(out) == summary(ref)


def test_cifar_script_passes_arguments_and_names_out_by_job(slurm_env, tmp_path):
    """slurm/cifar_rotation4.sh with its GPU requests swapped for 2 CPU tasks:
    KEY=VALUE arguments reach the run (the last word wins), and the run
    directory is runs/slurm/<job name>-<job id> under the job's directory."""
    env = dict(slurm_env, CONFIG=str(ROOT / "configs" / "synthetic_cluster4.yaml"))
    proc, job = sc.sbatch(env, "--gres=none", "--ntasks-per-node=2", "--cpus-per-task=1", "--time=10",
                          f"--chdir={tmp_path}", f"--output={tmp_path / 'job.log'}", "slurm/cifar_rotation4.sh",
                          "seed=3", "algorithm.name=ifca", "ifca.restarts=1", "clients=8", "rounds=2", "device=cpu", "figures=false",
                          wait=True)
    assert proc.returncode == 0, (tmp_path / "job.log").read_text()[-3000:]
    got = json.loads((tmp_path / "runs" / "slurm" / f"fedclust-cifar4-{job}" / "summary.json").read_text())
    assert (got["seed"], got["algorithm"], got["clients"], got["rounds_completed"]) == (3, "ifca", 8, 2)


def test_array_script_runs_the_grid(slurm_env, tmp_path):
    env = dict(slurm_env, CONFIG=str(ROOT / "configs" / "synthetic_cluster4.yaml"), SEEDS="0 1",
               ALGORITHMS="local random")
    common = ["--gres=none", "--cpus-per-task=1", "--time=10", f"--chdir={tmp_path}",
              f"--output={tmp_path / 'task-%a.log'}", "slurm/array.sh", "clients=8", "rounds=2", "device=cpu",
              "figures=false"]
    proc, job = sc.sbatch(env, "--array=0-3", *common, wait=True)
    logs = "".join(p.read_text() for p in tmp_path.glob("task-*.log"))
    assert proc.returncode == 0, logs[-3000:]
    root = tmp_path / "runs" / "slurm" / f"fedclust-array-{job}"
    for alg in ("local", "random"):
        for seed in (0, 1):
            got = json.loads((root / f"{alg}-s{seed}" / "summary.json").read_text())
            assert (got["algorithm"], got["seed"]) == (alg, seed)
    assert len(list(root.iterdir())) == 4

    # An --array that does not cover SEEDS x ALGORITHMS fails, saying what to submit.
    for p in tmp_path.glob("task-*.log"):
        p.unlink()
    proc, _ = sc.sbatch(env, "--array=0-2", *common, wait=True)
    assert proc.returncode != 0
    assert "--array must be 0-3 for 2 seeds x 2 algorithms" in (tmp_path / "task-0.log").read_text()


def submit(env: dict, out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launch.submit", "configs/synthetic_cluster4.yaml", "clients=8",
                           "rounds=3", "figures=false", "--out", str(out), "--tasks", "1", "--time", "10",
                           "--signal-seconds", "60", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)


def test_launch_submit_grid_then_submit_again_submits_nothing(slurm_env, tmp_path):
    grid = ["--grid", "seed=0,1", "algorithm.name=local,random"]
    proc = submit(slurm_env, tmp_path, *grid, "--wait")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    dirs = sorted(p for p in tmp_path.iterdir() if (p / "summary.json").exists())
    assert [d.name for d in dirs] == ["seed=0,algorithm.name=local", "seed=0,algorithm.name=random",
                                      "seed=1,algorithm.name=local", "seed=1,algorithm.name=random"]
    for d in dirs:
        got = json.loads((d / "summary.json").read_text())
        assert f"seed={got['seed']},algorithm.name={got['algorithm']}" == d.name
    assert proc.stdout.count("submit ") == 4 and "| local | 2 |" in proc.stdout   # the report table over the grid
    submitted = (tmp_path / "submitted.jsonl").read_text()

    again = submit(slurm_env, tmp_path, *grid)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "nothing to submit" in again.stdout and again.stdout.count("(finished)") == 4
    assert (tmp_path / "submitted.jsonl").read_text() == submitted   # no job was sent


def test_launch_submit_task_is_requeued_and_resumes(slurm_env, tmp_path):
    grid = tmp_path / "grid"
    proc = submit(dict(slurm_env, **SLOW), grid, "clients=16", *LONG, "--tasks", "2", "--grid", "seed=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = json.loads((grid / "submitted.jsonl").read_text().splitlines()[-1])["job"]
    out = grid / "seed=0"
    # Submitting while the job is queued or running sends nothing.
    again = submit(slurm_env, grid, "clients=16", *LONG, "--tasks", "2", "--grid", "seed=0")
    assert "nothing to submit" in again.stdout or "(finished)" in again.stdout, again.stdout + again.stderr
    sc.preempt(slurm_env, job, out)
    logs = "".join(p.read_text() for p in (grid / ".submitit").glob("*_log.*"))
    assert f"Slurm job {job} requeued" in logs and "resuming" in logs, logs[-3000:]
    ref = tmp_path / "ref"
    sc.run_one_process(out / "config.yaml", ref)
    assert metrics(out) == metrics(ref)
    assert summary(out) == summary(ref)
