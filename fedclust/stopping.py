"""Stopping on request: SIGUSR1 / SIGTERM (Slurm's ``--signal``, a
preemption, ``kill``) ask the run to stop.  What a signal does depends on
where the run is (:class:`StopRequest`'s phase):

- starting (config, data, process group, the checkpoint read): the process
  stops at once, writing nothing (:class:`StartupSignal`, reported as
  :class:`Stopped`, exit 75);
- running: the run stops at the next round boundary, after a checkpoint;
- finished (the summary is written): nothing; the process exits 0.

Inside Slurm, rank 0 requeues the job so that it continues; a process
started by torchrun stops the same way when torchrun itself dies
(:func:`stop_with_parent`)."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from fedclust.errors import FedclustError

EXIT_REQUEUE = 75   # exit status of a run stopped by SIGUSR1/SIGTERM (EX_TEMPFAIL): run it again to continue

Phase = Literal["starting", "stopping", "running", "finished"]


class StartupSignal(BaseException):
    """Raised by the signal handler while the run starts: unwinds start-up at
    once (a BaseException, so that no ``except Exception`` on the way keeps
    it).  :func:`fedclust.runner.run` and the command line turn it into
    :class:`Stopped`."""

    def __init__(self, signum: int):
        self.signal = signum
        super().__init__(signal.Signals(signum).name)


class StopRequest:
    """The process's answer to SIGUSR1 and SIGTERM (one per process:
    :data:`REQUEST`).  ``install`` and ``restore`` nest: the command line
    installs it for the whole process, :func:`fedclust.runner.run` for the
    run, and the handlers go back to what they were only when the outermost
    ``restore`` runs, so a signal after the run's last line still finds them
    (phase finished: exit 0)."""

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

    def __init__(self) -> None:
        self.signal: int | None = None
        self.phase: Phase = "starting"
        self.started = time.time()   # when the run began (begin)
        self._previous: dict = {}
        self._depth = 0

    def install(self) -> "StopRequest":
        if self._depth == 0:
            for s in self.SIGNALS:
                try:
                    self._previous[s] = signal.signal(s, self._handle)
                except ValueError:   # not the main thread: signals cannot be caught here
                    pass
        self._depth += 1
        return self

    def restore(self) -> None:
        self._depth = max(0, self._depth - 1)
        if self._depth == 0:
            for s, h in self._previous.items():
                signal.signal(s, h)
            self._previous = {}

    def begin(self) -> None:
        """A run starts: no signal seen, and one now stops start-up at once."""
        self.signal, self.phase, self.started = None, "starting", time.time()

    def running(self) -> None:
        """From here a signal stops the run at the next round boundary, after a checkpoint."""
        self.phase = "running"

    def finished(self) -> None:
        """The run is complete: a signal from here on changes nothing."""
        self.phase = "finished"

    def _handle(self, signum, frame) -> None:
        if self.phase in ("finished", "stopping"):   # complete, or already leaving start-up
            return
        self.signal = signum
        if self.phase == "starting":
            self.phase = "stopping"
            raise StartupSignal(signum)

    @property
    def requested(self) -> bool:
        return self.signal is not None and self.phase == "running"


REQUEST = StopRequest()


def slurm_job() -> str | None:
    """The Slurm job to requeue: ``<array job>_<task>`` for an array task, else the job id; None outside Slurm."""
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        return None
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env["SLURM_JOB_ID"]


def requeue() -> tuple[str | None, bool]:
    """``scontrol requeue`` this Slurm job (if in one): (the job id or None
    outside Slurm, whether it was requeued).  A failing scontrol is reported,
    not raised: the checkpoint is on disk either way."""
    job = slurm_job()
    if job is None:
        return None, False
    exe = shutil.which("scontrol")
    if exe is None:
        print(f"fedclust: cannot requeue Slurm job {job}: scontrol is not on PATH", file=sys.stderr)
        return job, False
    proc = subprocess.run([exe, "requeue", job], capture_output=True, text=True)
    if proc.returncode != 0:
        why = proc.stderr.strip() or f"exit status {proc.returncode}"
        print(f"fedclust: scontrol requeue {job} failed ({why})", file=sys.stderr)
        return job, False
    return job, True


def continue_hint(job: str | None, requeued: bool | None) -> str:
    """How the run goes on: ``requeued`` True/False on the rank that asked
    Slurm (rank 0), None on the others."""
    if job is None:
        return "run the same command again to continue"
    if requeued:
        return f"Slurm job {job} requeued"
    if requeued is None:
        return f"rank 0 requeues Slurm job {job}"
    return f"Slurm job {job} was not requeued: resubmit it (or run the same command again) to continue"


class Stopped(FedclustError):
    """The run stopped on request: after writing its checkpoint, or during
    start-up before writing anything."""

    exit_code = EXIT_REQUEUE

    def __init__(self, round_: int, signum: int | None, path: Path | None, job: str | None,
                 requeued: bool | None = None, starting: bool = False):
        """``round_``: the last round completed (its checkpoint ``path``; None: none yet)."""
        self.round, self.signal, self.path, self.job, self.requeued = round_, signum, path, job, requeued
        name = signal.Signals(signum).name if signum else "a signal to another rank"
        again = continue_hint(job, requeued)
        if starting:
            kept = f"it continues from {path} (round {round_})" if path else "it starts from round 1"
            super().__init__(f"stopped on {name} during start-up, before round {round_ + 1}; nothing was written "
                             f"({kept}); {again}")
        else:
            super().__init__(f"stopped on {name} after round {round_}; checkpoint {path}; {again}")


def stopped_at_startup(signum: int, rank: int, round_: int = 0, path: Path | None = None) -> Stopped:
    """:class:`Stopped` for a signal during start-up; rank 0 requeues a Slurm job."""
    job, requeued = requeue() if rank == 0 else (slurm_job(), None)
    return Stopped(round_, signum, path, job, requeued if job else None, starting=True)


PR_SET_PDEATHSIG = 1


def stop_with_parent() -> bool:
    """Under torchrun (``TORCHELASTIC_RUN_ID`` set), ask Linux to send this
    process SIGTERM when torchrun dies: a torchrun killed by a signal it does
    not handle (SIGUSR1, SIGKILL) then leaves no worker running on without a
    parent; each stops as on SIGTERM (a checkpoint at the round boundary,
    exit 75).  Returns whether it was set."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() == 1:   # torchrun died before the request: it would never come
        os.kill(os.getpid(), signal.SIGTERM)
    return True
