"""Stopping on request: SIGUSR1 / SIGTERM (Slurm's ``--signal``, a
preemption, ``kill``) ask the run to stop at the next round boundary after
a checkpoint; inside Slurm, rank 0 requeues the job so that it continues."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from fedclust.errors import FedclustError

EXIT_REQUEUE = 75   # exit status of a run stopped by SIGUSR1/SIGTERM after its checkpoint (EX_TEMPFAIL)



class StopRequest:
    """Set by SIGUSR1 or SIGTERM; read at each round boundary."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self):
        self.signal: int | None = None
        self._previous: dict = {}

    def install(self) -> "StopRequest":
        for s in self.SIGNALS:
            try:
                self._previous[s] = signal.signal(s, self._handle)
            except ValueError:   # not the main thread: signals cannot be caught here
                pass
        return self

    def _handle(self, signum, frame) -> None:
        self.signal = signum

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def restore(self) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous = {}


def slurm_job() -> str | None:
    """The Slurm job to requeue: ``<array job>_<task>`` for an array task, else the job id; None outside Slurm."""
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return None
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env["SLURM_JOB_ID"]


def requeue() -> str | None:
    """``scontrol requeue`` this Slurm job (if in one); returns the job id, or
    None outside Slurm.  A failing scontrol is reported, not raised: the
    checkpoint is on disk either way."""
    job = slurm_job()
    if job is None:
        return None
    exe = shutil.which("scontrol")
    if exe is None:
        print(f"fedclust: cannot requeue Slurm job {job}: scontrol is not on PATH; resubmit it to continue",
              file=sys.stderr)
        return job
    proc = subprocess.run([exe, "requeue", job], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"fedclust: scontrol requeue {job} failed ({proc.stderr.strip()}); resubmit the job to continue",
              file=sys.stderr)
    return job


class Stopped(FedclustError):
    """The run stopped on request after writing its checkpoint."""

    exit_code = EXIT_REQUEUE

    def __init__(self, round_: int, signum: int | None, path: Path, job: str | None):
        self.round, self.signal, self.path, self.job = round_, signum, path, job
        name = signal.Signals(signum).name if signum else "a signal to another rank"
        again = f"Slurm job {job} requeued" if job else "run the same command again to continue"
        super().__init__(f"stopped on {name} after round {round_}; checkpoint {path}; {again}")
