"""What a launched job runs, and where it runs: one fedclust run per grid
point, sent to Slurm as a submitit job array (with fedclust's own
checkpoint / USR1 / requeue rules) or run on this machine in sequence."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fedclust.errors import FedclustError
from fedclust.stopping import EXIT_REQUEUE
from launch.grid import Point

# Job states in which a submitted run is still the queue's business.
ACTIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED",
                 "CONFIGURING", "COMPLETING", "STAGE_OUT", "SIGNALING", "PREEMPTED"}


@dataclass(frozen=True)
class RunPoint:
    """``fedclust run CONFIG OVERRIDES out=DIR`` in this process: the callable
    submitit pickles and every task of the job calls (Lightning Fabric takes
    rank and world size from Slurm).  A run stopped by USR1/SIGTERM has
    written its checkpoint and requeued the job; it then leaves through
    SystemExit, so submitit records no result and the requeued job calls this
    again, which resumes the run (``resume=auto``)."""

    config: str | None
    overrides: tuple[str, ...]
    out: str

    def argv(self) -> list[str]:
        return ["run", *([self.config] if self.config else []), *self.overrides, f"out={self.out}"]

    def __call__(self) -> str:
        from fedclust.cli import main

        rc = main(self.argv())
        if rc == EXIT_REQUEUE:
            sys.exit(rc)
        if rc != 0:
            raise RuntimeError(f"fedclust run into {self.out} failed with exit status {rc}; its error is in this "
                               "job's log")
        return self.out


TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (as sbatch --time; e.g. 90, 2:00:00, 1-12)"


def parse_time(text: str) -> int:
    """A time limit as sbatch's ``--time`` takes it, in whole minutes (what
    submitit asks for): ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM``, ``D-HH:MM:SS``.  Seconds round up to the next minute, as
    Slurm rounds them.  Minutes and seconds after a colon must be below 60,
    hours after a day below 24 (Slurm would add ``1:75`` up to 2:15; here it
    is taken for a typo); the first number is not bounded (``48:00:00``)."""
    value = str(text).strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)((?::\d+){0,2})", value)
    if m is None:
        raise FedclustError(f"--time {text!r}: not a time limit; write {TIME_FORMS}")
    days, first, rest = m.group(1), int(m.group(2)), [int(x) for x in m.group(3).split(":")[1:]]
    if days is not None:   # D-HH[:MM[:SS]]
        hours, minutes, seconds = first, *(rest + [0, 0])[:2]
        bounded = [("hours", hours, 24)] + [(n, v, 60) for n, v in zip(("minutes", "seconds"), rest)]
        total = ((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds
    elif len(rest) == 2:   # HH:MM:SS
        total = (first * 60 + rest[0]) * 60 + rest[1]
        bounded = [("minutes", rest[0], 60), ("seconds", rest[1], 60)]
    else:   # MM[:SS]
        total = first * 60 + (rest[0] if rest else 0)
        bounded = [("seconds", rest[0], 60)] if rest else []
    for name, v, limit in bounded:
        if v >= limit:
            raise FedclustError(f"--time {text!r}: {name} must be 0-{limit - 1} there, got {v}; write {TIME_FORMS}")
    if total == 0:
        raise FedclustError(f"--time {text!r}: must be at least 1 minute (a run needs a time limit to checkpoint "
                            f"before it; sbatch's 0, no limit, is not taken); write {TIME_FORMS}")
    return -(-total // 60)


def format_time(minutes: int) -> str:
    """Minutes as sbatch and squeue write a time limit: ``HH:MM:SS``, or
    ``D-HH:MM:SS`` from a day on."""
    days, rest = divmod(int(minutes), 24 * 60)
    text = f"{rest // 60:02d}:{rest % 60:02d}:00"
    return f"{days}-{text}" if days else text


@dataclass
class Resources:
    """What each run of a grid asks of Slurm.  ``gpus`` > 0 gives one task per
    GPU (``--gres=gpu:N``, ``--ntasks-per-node=N``); 0 gives ``tasks`` CPU tasks."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpus: int = 0
    tasks: int = 1
    cpus_per_task: int = 1
    nodes: int = 1
    time_min: int = 60
    signal_seconds: int = 180
    parallel: int = 256
    mem: str | None = None

    def tasks_per_node(self) -> int:
        return self.gpus if self.gpus > 0 else self.tasks

    def describe(self, jobs: int) -> list[str]:
        """What each of ``jobs`` array jobs asks Slurm for, one line a resource,
        as :func:`slurm_executor` asks for it."""
        def unset(option: str) -> str:
            return f"(not set: the cluster's default; {option} to choose)"

        if self.gpus > 0:
            gpus = f"{self.gpus} per node (--gres=gpu:{self.gpus}), one task each"
            tasks = f"{self.tasks_per_node()} (one per GPU)"
        else:
            gpus = "0: CPU tasks only, no GPU; --gpus N asks for N GPUs per node, one task each"
            tasks = f"{self.tasks_per_node()} (CPU tasks, --tasks)"
        rows = [("partition", self.partition or unset("--partition")),
                ("account", self.account or unset("--account")),
                ("qos", self.qos or unset("--qos")),
                ("nodes", str(self.nodes)),
                ("tasks per node", tasks),
                ("gpus", gpus),
                ("cpus per task", str(self.cpus_per_task)),
                ("mem", f"{self.mem} per node" if self.mem else unset("--mem")),
                ("time", f"{format_time(self.time_min)} ({self.time_min} min)"),
                ("signal", f"USR1 {self.signal_seconds} s before the time limit: checkpoint, requeue, resume"),
                ("array size", f"{jobs} job{'s' if jobs != 1 else ''}, at most {min(self.parallel, jobs)} "
                               "running at once (--parallel)")]
        return [f"  {name + ':':<15} {value}" for name, value in rows]

    def check(self) -> None:
        for name in ("tasks", "cpus_per_task", "nodes", "parallel"):
            if getattr(self, name) < 1:
                raise FedclustError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        if self.time_min < 1:
            raise FedclustError(f"--time: {self.time_min} minutes: must be at least 1 minute (a run needs a time "
                                f"limit to checkpoint before it); write it as {TIME_FORMS}")
        if self.gpus < 0:
            raise FedclustError(f"--gpus {self.gpus}: must be 0 (CPU) or more")
        if not 0 < self.signal_seconds < self.time_min * 60:
            raise FedclustError(f"--signal-seconds {self.signal_seconds}: must be above 0 and below the time limit "
                                f"({self.time_min * 60} s), so the run can checkpoint before Slurm stops it")


def slurm_executor(folder: Path, name: str, res: Resources, env: dict | None = None):
    """A submitit executor for Slurm: USR1 ``signal_seconds`` before the time
    limit (fedclust's signal; submitit's own USR2 handler is left unused),
    ``--requeue``, ``--gres=gpu:N`` rather than ``--gpus-per-task``."""
    if shutil.which("sbatch") is None:
        raise FedclustError("Slurm is not available here (no sbatch on PATH); run the grid on this machine with "
                            "--local")
    import submitit

    executor = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
    extra: dict = {"requeue": True, "signal": f"USR1@{res.signal_seconds}"}
    if res.gpus > 0:
        extra["gres"] = f"gpu:{res.gpus}"
    params = dict(name=name, timeout_min=res.time_min, nodes=res.nodes, tasks_per_node=res.tasks_per_node(),
                  cpus_per_task=res.cpus_per_task, slurm_array_parallelism=res.parallel,
                  slurm_additional_parameters=extra,
                  slurm_setup=["export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}",
                               "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}",   # Slurm >= 22.05
                               *(f"export {k}={shlex.quote(str(v))}" for k, v in (env or {}).items())])
    for key in ("partition", "account", "qos", "mem"):
        if getattr(res, key):
            params[f"slurm_{key}"] = getattr(res, key)
    executor.update_parameters(**params)
    return executor


def submit_slurm(points: list[Point], config: str | None, fixed: list[str], folder: Path, name: str,
                 res: Resources, env: dict | None = None) -> list[tuple[Point, str, str]]:
    """Submit the points as one job array; returns (point, job id, log path)
    each.  ``env``: variables exported in the jobs."""
    executor = slurm_executor(folder, name, res, env)
    calls = [RunPoint(config, tuple(fixed + p.overrides), str(p.out)) for p in points]
    with executor.batch():
        jobs = [executor.submit(call) for call in calls]
    return [(p, j.job_id, str(j.paths.stdout)) for p, j in zip(points, jobs)]


def job_state(job_id: str) -> str | None:
    """The job's state as squeue knows it (None: no longer in the queue)."""
    if shutil.which("squeue") is None:
        return None
    proc = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True)
    lines = proc.stdout.split()
    return lines[0] if proc.returncode == 0 and lines else None


class Ledger:
    """``<grid folder>/submitted.jsonl``: which job each run was last sent to,
    so that a grid submitted again skips runs still queued or running."""

    def __init__(self, folder: Path):
        self.path = Path(folder) / "submitted.jsonl"

    def last_jobs(self) -> dict[str, str]:
        jobs: dict[str, str] = {}
        if self.path.is_file():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    jobs[rec["out"]] = rec["job"]
        return jobs

    def record(self, entries: list[tuple[Point, str, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            for point, job, log in entries:
                f.write(json.dumps({"out": str(point.out), "job": job, "log": log, "time": time.time()}) + "\n")


def run_local(point: Point, config: str | None, fixed: list[str], processes: int, env: dict | None = None) -> int:
    """One run on this machine, in a child process (``torchrun`` for several)."""
    argv = RunPoint(config, tuple(fixed + point.overrides), str(point.out)).argv()
    if processes > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}",
                   "-m", "fedclust", *argv]
    else:
        command = [sys.executable, "-m", "fedclust", *argv]
    return subprocess.run(command, env={**os.environ, **{k: str(v) for k, v in (env or {}).items()}}).returncode


def wait_for(entries: list[tuple[Point, str, str]], poll: float = 5.0) -> list[tuple[Point, str]]:
    """Wait until every submitted run has finished or left the queue; returns
    (point, problem) for those that left without a summary."""
    pending = list(entries)
    failed: list[tuple[Point, str]] = []
    while pending:
        still = []
        for point, job, log in pending:
            if point.finished:
                continue
            if job_state(job) is None:
                time.sleep(1.0)   # the summary is written before the job leaves the queue; allow for the file system
                if not point.finished:
                    failed.append((point, f"job {job} left the queue without a summary.json; see {log}"))
                continue
            still.append((point, job, log))
        pending = still
        if pending:
            time.sleep(poll)
    return failed
