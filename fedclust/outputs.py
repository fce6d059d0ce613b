"""The run directory: its marker (.fedclust-run), resolved config.yaml,
metrics.jsonl (one line per evaluated round, flushed as written),
summary.json.  fedclust writes only into a new or empty folder or a run
directory of its own, and removes only the files it writes.  (The W&B
mirror is fedclust.tracking.)"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import socket
import sys
import time
from pathlib import Path

import yaml

from fedclust import __version__, configfile
from fedclust.errors import ConfigError, OutputError

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json")
# What else a run leaves in its directory that a fresh start there removes: in the two folders, only the files
# fedclust writes there (_OWN_IN); W&B's own wandb/ folder is kept: it may hold offline runs not yet synced.
RUN_EXTRAS = ("neighbors.npz", "figures", "checkpoints", "wandb.json")
MARKER_NAME = ".fedclust-run"   # a run directory's mark, written before anything else: JSON {format, fedclust, created}
MARKER_FORMAT = 1
# What fedclust.figures.write_run_figures writes into figures/ (tests/unit/test_run_dir_marker.py checks the two agree).
FIGURE_FILES = ("accuracy.png", "heatmap_stage1.png", "similarity_hist.png", "neighbor_graph.png", "cni_precision.png",
                "partition.png")
# Keys every config.yaml fedclust has written holds: a directory holding one is an earlier fedclust's run.
_CONFIG_KEYS = {"algorithm", "data", "train", "wandb", "model", "clients", "rounds", "stage1_rounds", "seed", "out",
                "device", "eval_every", "progress"}
_OWN_IN = {"checkpoints": re.compile(r"^round-\d{6,}\.pt(\.tmp\d+)?$"),   # checkpoint.write's files and partials
           "figures": re.compile("^(" + "|".join(re.escape(f) for f in FIGURE_FILES) + ")$")}
# Top-level files a run writes besides RUN_FILES: neighbors.npz, wandb.json, and the partials write_atomic and
# fedclust.tracking.write_state leave when killed mid-write.
_OWN_FILE = re.compile(r"^(neighbors\.npz|wandb\.json|wandb\.tmp"
                       r"|\.(config\.yaml|summary\.json|neighbors\.npz)\.tmp\d+)$")


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
        """Makes the directory, marks it as a run directory (:func:`mark_run_dir`, before the lock file: a run
        killed between the two leaves a marked directory), then takes the lock."""
        d = Path(run_dir)
        d.mkdir(parents=True, exist_ok=True)
        mark_run_dir(d)
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


# ----------------------------------------------------------------------------
# Whose folder: fedclust writes only into a new or empty folder or a run directory of its own


def mark_run_dir(d: Path) -> None:
    """Write ``d``'s :data:`MARKER_NAME` unless it is there (one small file, created exclusively: of two runs
    starting at once one writes it).  Rank 0 calls it, through :class:`RunLock`, before it writes anything else
    into ``d``; a directory of an earlier fedclust gains it when a run next writes there."""
    path = d / MARKER_NAME
    if path.is_file():
        return
    text = json.dumps({"format": MARKER_FORMAT, "fedclust": __version__,
                       "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n"
    try:
        with open(path, "x") as f:
            f.write(text)
    except FileExistsError:
        pass
    except OSError as exc:
        raise output_error(path, exc) from exc


def is_marked(d: Path) -> bool:
    """``d`` is a run directory of this fedclust (its :data:`MARKER_NAME` is there)."""
    return (d / MARKER_NAME).is_file()


def written_by_fedclust(config: object) -> bool:
    """``config`` (a config.yaml as read) is one fedclust wrote, of any version: a mapping holding every key
    fedclust has written since its first version, ``algorithm`` naming one."""
    return (isinstance(config, dict) and _CONFIG_KEYS <= set(config) and isinstance(config["algorithm"], dict)
            and isinstance(config["algorithm"].get("name"), str))


def earlier_run(d: Path, entries: list[str]) -> bool:
    """``d`` (holding ``entries``, no marker) is a run directory of an earlier fedclust: its config.yaml is one
    fedclust wrote (:func:`written_by_fedclust`), or it holds only the lock file of a run stopped before it wrote
    any (and W&B's folder).  Costs one read of config.yaml."""
    if LOCK_NAME in entries and set(entries) <= {LOCK_NAME, "wandb"}:
        return True
    try:
        return written_by_fedclust(yaml.safe_load((d / "config.yaml").read_text()))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False


def shown(names: list[str], most: int = 5) -> str:
    """Up to ``most`` names, then how many more."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def check_run_dir(out: str | Path, overwrite: bool) -> None:
    """Refuse ``out`` unless fedclust may write there: it is absent or empty, marked as a run directory
    (:func:`is_marked`), or a run directory of an earlier fedclust (:func:`earlier_run`); ``overwrite=true``
    does not widen this.  Every entry counts, hidden ones too (a folder holding only .DS_Store is not empty).
    Costs one listing of ``out`` and, unmarked, one read of its config.yaml."""
    d = Path(out)
    if not d.is_dir() or is_marked(d):
        return
    try:
        entries = sorted(os.listdir(d))
    except OSError as exc:
        raise ConfigError("out", str(out), f"cannot be read ({exc.strerror}); choose another out=DIR") from None
    if not entries or earlier_run(d, entries) or (MARKER_NAME in entries and is_marked(d)):
        return   # the marker's second look: another rank's RunLock may have marked ``d`` since the first
    names = [e + "/" if (d / e).is_dir() else e for e in entries]
    asked = " (overwrite=true replaces only a fedclust run)" if overwrite else ""
    raise ConfigError("out", str(out), f"is not a fedclust run directory (no {MARKER_NAME}, no config.yaml fedclust "
                      f"wrote) and not empty: it holds {shown(names)} (every entry counts, hidden ones too); "
                      f"fedclust writes only into a new or empty folder or a run directory of its own and never "
                      f"removes what it did not write{asked}: choose another out=DIR (a new or empty folder)")


def _clear_folder(folder: Path, own: re.Pattern) -> tuple[bool, list[str]]:
    """Remove the files of ``folder`` whose names ``own`` matches, then the folder if that left it empty (a
    symlink to a folder stays); returns (whether any was removed, the names of the others)."""
    removed, kept = False, []
    for entry in sorted(folder.iterdir()):
        if own.match(entry.name) and (entry.is_file() or entry.is_symlink()):
            entry.unlink()
            removed = True
        else:
            kept.append(f"{folder.name}/{entry.name}" + ("/" if entry.is_dir() else ""))
    if not kept and not folder.is_symlink():
        folder.rmdir()
    return removed, kept


def clear_run(d: Path) -> tuple[list[str], list[str]]:
    """Remove an earlier run's files from ``d``, a marked run directory: only what a run writes there (RUN_FILES,
    RUN_EXTRAS, in checkpoints/ and figures/ only fedclust's own files, partials of a killed write).  Returns
    (the names removed, the entries kept that fedclust did not write); the marker, the lock and W&B's wandb/
    stay unnamed.  Costs one listing of ``d`` and of its two folders."""
    if not is_marked(d):
        raise OutputError(f"{d} holds no {MARKER_NAME}: it is not a fedclust run directory and nothing in it is "
                          "removed; choose another out=DIR")
    removed, kept = [], []
    order = {name: i for i, name in enumerate(RUN_FILES + RUN_EXTRAS)}
    for entry in sorted(d.iterdir(), key=lambda e: (order.get(e.name, len(order)), e.name)):
        name = entry.name
        if name in (MARKER_NAME, LOCK_NAME, "wandb"):
            continue
        if name in _OWN_IN and entry.is_dir():
            gone, others = _clear_folder(entry, _OWN_IN[name])
            removed += [name] if gone else []
            kept += others
        elif (name in RUN_FILES or _OWN_FILE.match(name)) and (entry.is_file() or entry.is_symlink()):
            entry.unlink()
            removed.append(name)
        else:
            kept.append(name + ("/" if entry.is_dir() else ""))
    return removed, sorted(kept)


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
        (:func:`clear_run`; :func:`fedclust.checkpoint.choose` has allowed
        it: the same config that never checkpointed, or ``overwrite=true``),
        saying in one line what it removed and what it kept.  ``out`` is
        marked (:class:`RunLock` did it)."""
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        if history is None:
            replaced, kept = clear_run(self.dir)
            what = [f"removed the earlier run's {', '.join(replaced)}"] if replaced else []
            what += [f"kept what fedclust did not write: {shown(kept, 10)}"] if kept else []
            if what:
                say(f"fedclust: starting afresh in {self.dir}; {'; '.join(what)}")
        text = configfile.dump(cfg)
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
