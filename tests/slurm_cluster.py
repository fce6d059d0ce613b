"""A one-node Slurm cluster for the tests (tests/slurm/start_cluster.sh), and
helpers to submit to it and wait for its jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "tests" / "slurm" / "start_cluster.sh"
CLUSTER_DIR = Path(tempfile.gettempdir()) / "fedclust-test-slurm"


def start() -> dict:
    """Start the cluster (or find it up); the environment to talk to it.
    Skips, printing why, where Slurm cannot start, unless the environment
    says FEDCLUST_REQUIRE_SLURM=1 (CI, which installs it), where it fails."""
    proc = subprocess.run(["bash", str(START), str(CLUSTER_DIR)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or [f"start_cluster.sh exited {proc.returncode}"])[-1]
        if os.environ.get("FEDCLUST_REQUIRE_SLURM") == "1":
            pytest.fail(f"FEDCLUST_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    env = dict(os.environ, SLURM_CONF=str(CLUSTER_DIR / "slurm.conf"), OMP_NUM_THREADS="1",
               FEDCLUST_PYTHON=sys.executable)
    env.pop("PAUSE_AFTER_ROUND", None)
    return env


def stop() -> None:
    subprocess.run(["bash", str(START), "--stop", str(CLUSTER_DIR)], capture_output=True, timeout=300)


def sbatch(env: dict, *args: str, wait: bool = False, timeout: float = 600) -> tuple[subprocess.CompletedProcess, str]:
    """Submit from the repository root; (the finished sbatch, job id).  With ``wait``, return once every task of
    the job has ended, the returned process's returncode then being the job's highest exit code, as
    ``sbatch --wait`` gives it; polled here every 0.3 s because ``sbatch --wait`` sleeps 2, 8, then 32 s between
    its looks (a 10-second job returned after 42 s)."""
    cmd = ["sbatch", "--parsable", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    job = proc.stdout.strip().split(";")[0] if proc.stdout.strip() else ""
    assert job, f"sbatch printed no job id: {proc.stderr}"
    if wait:
        codes = wait_until(lambda: ended(env, job), timeout, f"job {job} to end")
        proc = subprocess.CompletedProcess(proc.args, max(codes), proc.stdout, proc.stderr)
    return proc, job


ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def ended(env: dict, job: str) -> list[int] | None:
    """Each task's exit status once every task of ``job`` (one, or an array's) has ended (a signal counts as
    128 + its number, as a shell gives it), else None.  The controller keeps ended jobs for MinJobAge (600 s
    here: tests/slurm/start_cluster.sh)."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job], env=env, capture_output=True, text=True).stdout
    fields = [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.splitlines() if line.strip()]
    if not fields or any(f.get("JobState") not in ENDED for f in fields):
        return None
    codes = []
    for f in fields:
        status, _, sig = f.get("ExitCode", "0:0").partition(":")
        codes.append(128 + int(sig) if int(sig or 0) else int(status))
    if any(f.get("JobState") != "COMPLETED" for f in fields) and not any(codes):
        codes.append(1)   # ended otherwise than completed (cancelled before it ran, say): a failure
    return codes


def squeue_state(env: dict, job: str) -> str:
    """'' once the job has left the queue."""
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T %r"], env=env, capture_output=True,
                          text=True).stdout.strip()


def wait_until(predicate, timeout: float, what: str, poll: float = 0.3):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def metric_lines(out: Path) -> int:
    path = out / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def preempt(env: dict, job: str, out: Path, after_lines: int = 5, timeout: float = 300) -> None:
    """Send the running job USR1 (as ``--signal=USR1@..`` or a preemption
    would) once its run has written ``after_lines`` rounds, wait for it to
    requeue itself, start it again at once (Slurm holds a requeued job for
    about two minutes) and wait until it has left the queue."""
    wait_until(lambda: metric_lines(out) >= after_lines, timeout, f"{after_lines} rounds in {out}")
    subprocess.run(["scancel", "--signal=USR1", job], env=env, check=True)
    wait_until(lambda: squeue_state(env, job).startswith("PENDING"), 120, f"job {job} to be requeued")
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, check=True)
    wait_until(lambda: squeue_state(env, job) == "", timeout, f"job {job} to finish", poll=1.0)


def run_one_process(config: Path, out: Path, *overrides: str) -> None:
    """The reference: the same resolved config run on one process, this one, on one thread (a launched run equals
    it bit for bit: tests/integration/test_golden_runs.py; a fresh process would cost 3 s of CPU importing torch)."""
    from record import run_on_one_thread

    from fedclust.config import load_config

    run_on_one_thread(load_config(str(config), [f"out={out}", *overrides]))


