"""The run directory: resolved config.yaml, metrics.jsonl (one line per
evaluated round, flushed as written), summary.json.  (The W&B mirror is
fedclust.tracking.)"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from fedclust import schema as config_mod
from fedclust.errors import ConfigError, OutputError

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json")
# What else a run leaves in its directory that a fresh start there removes (W&B's own wandb/ folder is
# kept: it may hold offline runs not yet synced).
RUN_EXTRAS = ("neighbors.npz", "figures", "checkpoints", "wandb.json")


def default_out(cfg, env=os.environ) -> str:
    """``runs/<algorithm>-<data>-s<seed>-<time>``; a run started by a W&B
    sweep agent (WANDB_SWEEP_ID and WANDB_RUN_ID set) takes
    ``runs/sweeps/<sweep id>/<run id>``, so a preempted sweep run handed to
    another agent, under the same run id, continues in the same directory."""
    if env.get("WANDB_SWEEP_ID") and env.get("WANDB_RUN_ID"):
        return f"runs/sweeps/{env['WANDB_SWEEP_ID']}/{env['WANDB_RUN_ID']}"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    data = cfg.data.name.replace(":", "-")   # torchvision:KMNIST -> torchvision-KMNIST, a portable folder name
    return f"runs/{cfg.algorithm.name}-{data}-s{cfg.seed}-{stamp}"


def check_writable(path: str) -> None:
    """Refuse a run directory that cannot be created or written (checked
    before any data is read or process group starts)."""
    p = Path(path).expanduser().absolute()
    if p.exists() and not p.is_dir():
        raise ConfigError("out", path, "is a file; choose a directory path for the run")
    parent = p
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError("out", path, f"cannot be created: {parent} is a file, not a folder; choose another "
                          "out=DIR")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError("out", path, f"cannot be written: no write permission in {parent}; choose another "
                          "out=DIR")


LOCK_NAME = ".fedclust.lock"   # held by the process that writes the run directory, released when it exits


class RunLock:
    """An exclusive lock (``flock``) on ``LOCK_NAME`` in a run directory, held for as long as one run writes it,
    so that a second run started on the same ``out`` (the same command twice, two sweep agents, a job and its
    requeued copy overlapping) is refused instead of writing the same files.  The kernel drops the lock when the
    process ends, however it ends, so a killed run leaves no stale lock; the file stays, naming its last holder."""

    def __init__(self, run_dir: str | Path):
        d = Path(run_dir)
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / LOCK_NAME
        self._file = open(self.path, "a+")
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise ConfigError("out", str(run_dir), f"is in use by another fedclust run ({holder}); wait for it to "
                              "end or stop it (it continues from its checkpoints when run again), or choose "
                              "another out=DIR") from None
        except OSError as exc:   # a file system without locks (Lustre mounted without -o flock): run unguarded
            print(f"fedclust: warning: cannot lock {self.path} ({exc.strerror}); nothing stops a second run from "
                  "writing this directory at the same time", file=sys.stderr, flush=True)
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                         f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        self._file.flush()

    @classmethod
    def for_rank(cls, run_dir: str | Path, rank: int):
        """The lock for the process that writes the directory (rank 0), a context that holds nothing for the
        others."""
        return cls(run_dir) if rank == 0 else contextlib.nullcontext()

    def release(self) -> None:
        if not self._file.closed:
            self._file.close()   # closing drops the lock

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def clear_run(d: Path) -> list[str]:
    """Remove an earlier run's files from ``d``; returns the names removed."""
    removed = []
    for name in RUN_FILES + RUN_EXTRAS:
        p = d / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        else:
            continue
        removed.append(name)
    return removed


def metrics_line(record: dict) -> str:
    """A metrics record as its line in metrics.jsonl (NaN/inf as null)."""
    return json.dumps(json_safe(record)) + "\n"


def sync_metrics(path: Path, history: list[dict]) -> str | None:
    """Make ``metrics.jsonl`` hold exactly the lines of ``history`` (the
    checkpoint's records, the ground truth of a resumed run): lines after
    them (rounds after the checkpoint) are cut; if an earlier line differs
    (edited, corrupted, cut) the file is rewritten from ``history``.
    Returns one line saying what was rebuilt, or None when nothing was."""
    want = [metrics_line(r) for r in history]
    have = path.read_bytes().decode("utf-8", "replace").splitlines(keepends=True) if path.exists() else []
    bad = next((i for i, line in enumerate(want) if i >= len(have) or have[i] != line), None)
    if bad is None:
        size = sum(len(line.encode()) for line in want)
        with open(path, "r+b") as f:
            f.truncate(size)
        return None
    path.write_text("".join(want))
    what = f"line {bad + 1} differed from it" if bad < len(have) else f"it had {len(have)} of its lines"
    return (f"{path} disagreed with the checkpoint ({what}); rebuilt from the checkpoint's "
            f"{len(want)} records")


def json_safe(value):
    """JSON-safe: NaN/inf become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def output_error(path: str | Path, exc: OSError) -> OutputError:
    """One line for a run file that could not be written: the file, the cause, the fix."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    fix = "free space there or choose another out=DIR" if full else "make it writable or choose another out=DIR"
    return OutputError(f"cannot write {path}: {exc.strerror or exc} (errno {exc.errno}); {fix}, then run the same "
                       "command again: the run continues from its newest checkpoint")


def write_atomic(path: Path, write) -> None:
    """``write(tmp_path)`` then rename over ``path``: a reader sees the old file or the whole new one; a write
    that fails (a full disk) leaves no partial file and raises :func:`output_error`'s error."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise output_error(path, exc) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class RunWriter:
    """Writes the run directory (rank 0 only)."""

    def __init__(self, cfg, out: str, history: list[dict] | None = None, say=print):
        """``history``: the records of a resumed run's checkpoint; metrics.jsonl
        is made to hold exactly them (:func:`sync_metrics`).  None: a fresh
        start, which first removes what an earlier run left in ``out``
        (:func:`fedclust.checkpoint.choose` has allowed it: the same config
        that never checkpointed, or ``overwrite=true``)."""
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        if history is None:
            replaced = clear_run(self.dir)
            if replaced:
                say(f"fedclust: starting afresh in {self.dir}; removed the earlier run's {', '.join(replaced)}")
        text = config_mod.dump(cfg)
        write_atomic(self.dir / "config.yaml", lambda tmp: tmp.write_text(text))
        metrics = self.dir / "metrics.jsonl"
        try:
            if history is None:
                metrics.write_text("")
            else:
                rebuilt = sync_metrics(metrics, history)
                if rebuilt:
                    say(f"fedclust: {rebuilt}")
            self._metrics = open(metrics, "a")
        except OSError as exc:
            raise output_error(metrics, exc) from exc

    def log_round(self, record: dict) -> None:
        try:
            self._metrics.write(metrics_line(record))
            self._metrics.flush()
        except OSError as exc:   # a torn last line is rebuilt from the checkpoint when the run continues
            raise output_error(self.dir / "metrics.jsonl", exc) from exc

    def write_summary(self, summary: dict) -> None:
        text = json.dumps(json_safe(summary), indent=2) + "\n"
        write_atomic(self.dir / "summary.json", lambda tmp: tmp.write_text(text))

    def close(self) -> None:
        try:
            self._metrics.close()
        except OSError:   # its last write failed and was reported; the checkpoint holds every record
            pass
