"""Checkpoints of a whole run and what resuming from them needs.

A checkpoint is one file ``<out>/checkpoints/round-<r>.pt`` (``torch.save``
of plain tensors, numbers, lists and dicts; read back with
``weights_only=True``) holding everything the round loop carries from round
r to r + 1: every client's weights ``[n, P]``, the algorithm's state
(per-client rows gathered from every rank, server state once), the traffic
counters, the stage-one aggregation counts, the metrics written so far, the
tracking run's id, the run's compute time so far and the resolved config.
It is written by rank 0 to a temporary name, flushed to disk and renamed, so
a file under the final name is complete; the newest two are kept.  It
carries a SHA-256 of its contents (every tensor's bytes, dtype and shape,
every other value; :func:`digest`), checked on load: a file that cannot be
read (torn by a crash of the disk, truncated) or whose contents are not
what was written (a damaged sector, a stray write) is skipped with a warning
naming it and the cause, and the run continues from an older one; when none
passes, the run refuses to start, naming each.  A checkpoint that would not
fit on the disk is not begun; one whose write fails leaves no partial file.

Rows are saved in global client order, so a run may resume on any number of
processes: each rank takes the rows of the clients it holds.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import yaml

from fedclust import upgrade
from fedclust.algorithms import registry
from fedclust.errors import CheckpointError, ConfigError
from fedclust.models import definition_sha256, file_sha256, folder_sha256, model_fingerprint, model_source
from fedclust.outputs import RUN_FILES, check_run_dir
from fedclust.peers import pack_bits, unpack_bits  # noqa: F401  (how checkpoints hold bool masks)
from fedclust.rank import Setup
from fedclust.runmodel import model_name, model_spec
from fedclust.schema import CORE_KEYS, resumable_keys, to_dict

FORMAT = 2            # 2: with CHECKSUM; 1 (read, unverified, with a warning): before checksums
FORMATS = (1, 2)
CHECKSUM = "checksum"   # sha256 hex digest of every other entry (digest)
DIRNAME = "checkpoints"
KEEP = 2
_NAME = re.compile(r"^round-(\d{6,})\.pt$")


def directory(out: str | Path) -> Path:
    return Path(out) / DIRNAME


def path_for(out: str | Path, round_: int) -> Path:
    return directory(out) / f"round-{round_:06d}.pt"


def candidates(out: str | Path) -> list[tuple[int, Path]]:
    """(round, path) of every checkpoint file under ``out``, newest first."""
    d = directory(out)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found, reverse=True)


def _feed(h, value) -> None:
    """Add ``value`` to the hash ``h``, by type, so that two payloads feed the
    same bytes exactly when they hold the same values: a tensor or array by
    dtype, shape and raw bytes; a dict by its items in key order; a list or
    tuple by its items; any other value by its type and ``repr`` (a float's
    repr gives its bits back)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        h.update(f"A{a.dtype.str}{a.shape};".encode())
        h.update(a.reshape(-1).view(np.uint8))
    elif isinstance(value, dict):
        h.update(f"D{len(value)};".encode())
        for k in sorted(value, key=lambda k: (type(k).__name__, repr(k))):
            _feed(h, k)
            _feed(h, value[k])
    elif isinstance(value, (list, tuple)):
        h.update(f"{'L' if isinstance(value, list) else 'U'}{len(value)};".encode())
        for v in value:
            _feed(h, v)
    else:
        text = repr(value).encode()
        h.update(f"V{type(value).__name__}{len(text)};".encode())
        h.update(text)


def digest(payload: dict) -> str:
    """SHA-256 (hex) of a checkpoint's contents, its :data:`CHECKSUM` aside."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in payload.items() if k != CHECKSUM})
    return h.hexdigest()


def payload_bytes(value) -> int:
    """The tensors' and arrays' bytes in a payload: about what it takes on disk."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, dict):
        return sum(payload_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_bytes(v) for v in value)
    return 0


def read(path: str | Path) -> dict:
    """A checkpoint's contents (CPU tensors); raises on a torn, foreign or
    damaged file (its checksum does not match).  A checkpoint of the format
    before checksums comes back with ``payload["verified"] = False``."""
    payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)   # pages read when used
    if not isinstance(payload, dict) or payload.get("format") not in FORMATS or not payload.get("complete"):
        raise ValueError(f"not a complete fedclust checkpoint (format {FORMAT})")
    if payload["format"] == 1:
        return dict(payload, verified=False)
    want, got = payload.get(CHECKSUM), digest(payload)
    if want != got:
        raise ValueError(f"its contents do not match the checksum written with them (sha256 {str(want)[:12]}... "
                         f"written, {got[:12]}... read): the file was changed or damaged after it was written")
    return payload


def scan(out: str | Path) -> tuple[tuple[Path, dict] | None, list[tuple[Path, str]]]:
    """(the newest checkpoint that reads back whole and verified, or None;
    the newer ones skipped, each with why), warning about each one skipped."""
    skipped: list[tuple[Path, str]] = []
    for _, path in candidates(out):
        try:
            payload = read(path)
        except Exception as exc:   # torn, truncated, foreign, damaged: say so and fall back to an older one
            why = f"{type(exc).__name__}: {exc}"
            skipped.append((path, why))
            warnings.warn(f"checkpoint {path} cannot be used ({why}); skipping it and using an older one",
                          stacklevel=2)
            continue
        if payload.get("verified") is False:
            warnings.warn(f"checkpoint {path} was written by an earlier fedclust, without a checksum: it is used "
                          "unverified", stacklevel=2)
        return (path, payload), skipped
    return None, skipped


def newest(out: str | Path) -> tuple[Path, dict] | None:
    """The newest checkpoint that reads back whole, skipping (with a warning
    naming each) those that do not; None if there is none."""
    return scan(out)[0]


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _cannot_write(d: Path, name: str, exc: OSError | None, need: int, free: int | None) -> CheckpointError:
    older = candidates(d.parent)
    resume = (f"it continues from {older[0][1].name} (round {older[0][0]})" if older
              else "it starts again from round 1")
    if exc is None or exc.errno in (errno.ENOSPC, errno.EDQUOT):
        space = f"it needs about {_human(need)}" + (f", {_human(free)} free" if free is not None else "")
        return CheckpointError(f"cannot write checkpoint {name} in {d}: no space left on the device ({space}); "
                               f"free space there or choose another out=DIR (moving the run there), then run the "
                               f"same command again: {resume}")
    return CheckpointError(f"cannot write checkpoint {name} in {d}: {exc.strerror or exc} (errno {exc.errno}); "
                           f"make the directory writable or choose another out=DIR, then run the same command "
                           f"again: {resume}")


def write(out: str | Path, round_: int, payload: dict, keep: int = KEEP) -> Path:
    """Write atomically (temporary name, flush, fsync, rename) with the
    payload's :func:`digest`, then delete all but the newest ``keep``
    checkpoints.  A write that does not fit on the disk is not begun; one
    that fails removes its temporary file; both raise
    :class:`fedclust.errors.CheckpointError` saying what to do."""
    d = directory(out)
    d.mkdir(parents=True, exist_ok=True)
    for stale in d.glob("round-*.pt.tmp*"):   # left by a crash mid-write (ours only): their space first
        stale.unlink(missing_ok=True)
    final = path_for(out, round_)
    tmp = final.with_name(final.name + f".tmp{os.getpid()}")
    payload = dict(payload, format=FORMAT, round=round_, complete=True)
    payload[CHECKSUM] = digest(payload)
    need = payload_bytes(payload) + (1 << 20)   # pickled numbers, lists and the zip's headers: well under 1 MB
    try:
        free = shutil.disk_usage(d).free
    except OSError:
        free = None
    if free is not None and free < need:
        raise _cannot_write(d, final.name, None, need, free)
    try:
        with open(tmp, "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        try:
            free = shutil.disk_usage(d).free
        except OSError:
            free = None
        raise _cannot_write(d, final.name, exc, need, free) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass
    for _, old in candidates(out)[keep:]:
        old.unlink(missing_ok=True)
    return final


def config_differences(saved: dict, now: dict, sections: tuple[str, ...] = ()) -> list[str]:
    """Dotted keys whose values differ between two configs (as
    :func:`fedclust.schema.to_dict` writes them; a key one of them lacks
    reads as :func:`fedclust.upgrade.config` says): the core keys and those of ``sections`` (the
    run's algorithm's; other algorithms' sections, present or not as plugins
    are loaded, do not affect the run), except the keys declared resumable
    (run length and outputs: :func:`fedclust.schema.resumable_keys`)."""
    a, b = upgrade.config(saved), upgrade.config(now)
    keys = sorted(k for k in set(a) | set(b) if k.split(".", 1)[0] in CORE_KEYS or k.split(".", 1)[0] in sections)
    free = resumable_keys()
    return [k for k in keys if a.get(k) != b.get(k) and k not in free]


def _saved_config(out: Path) -> dict | None:
    """The config.yaml a run left in ``out`` (None if absent or unreadable)."""
    try:
        saved = yaml.safe_load((out / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    return saved if isinstance(saved, dict) else None


def _not_continuable(p: Path, config_dict: dict, sections: tuple[str, ...]) -> str | None:
    """Why the run files in ``p`` (no checkpoint) may not be replaced by this
    config's fresh start; None when they are this same config's (a run
    killed before its first checkpoint: it starts again from round 1)."""
    if (p / "summary.json").exists():
        return "a finished run without checkpoints"
    saved = _saved_config(p)
    if saved is None:
        return "a run without a readable config.yaml"
    diff = config_differences(saved, config_dict, sections)
    return f"a run of another config (differing keys: {', '.join(diff[:8])}) that wrote no checkpoint" if diff else None


def input_files(cfg) -> dict:
    """The files a run reads besides its config, by the key that names them:
    a user model's source file, a data file; each as {path, sha256}, the
    model's with its ``fingerprint`` too (:func:`fedclust.models.model_fingerprint`:
    its definition in the file and its parameters' names and shapes)."""
    spec = model_name(cfg)
    net = cfg.network
    files = {"model": model_source(spec),
             "data.path": str(Path(cfg.data.path).resolve()) if cfg.data.path else None,
             "network.path": str(Path(net.path).resolve()) if net.graph == "file" and net.path else None,
             "network.availability": str(Path(net.availability).resolve()) if net.availability else None}
    out: dict[str, dict] = {key: {"path": path, "sha256": file_sha256(path)} for key, path in files.items()
                            if path and Path(path).is_file()}
    if files["data.path"] and Path(files["data.path"]).is_dir():   # data.name=leaf, hf: every file under it
        out["data.path"] = {"path": files["data.path"], "sha256": folder_sha256(files["data.path"]), "folder": True}
    if "model" in out:
        _, shape, classes = model_spec(cfg)
        out["model"]["fingerprint"] = model_fingerprint(spec, shape, classes)
        # the fingerprint's part read from the file's text alone: checked before a shared run's model is imported
        out["model"]["definition_sha256"] = definition_sha256(out["model"]["path"], spec.rpartition(":")[2])
    return out


def changed_inputs(saved: dict, now: dict) -> str | None:
    """Why a checkpoint's input files (:func:`input_files` then) do not match
    today's; None when every file it read is unchanged.  A model is compared
    by its fingerprint (its definition and shapes: an edit elsewhere in its
    file continues the run); a checkpoint written before fingerprints were
    kept holds only the file's SHA-256, and is compared by it, as then."""
    for key, then in saved.items():
        got = now.get(key)
        if got is not None and "fingerprint" in then and "fingerprint" in got:
            if got["fingerprint"] == then["fingerprint"]:
                continue
            return (f"{key}: the model in {then['path']} changed since the checkpoint was written (its definition, "
                    f"what it uses in the file, or its parameter shapes: fingerprint {then['fingerprint'][:12]}... "
                    f"-> {got['fingerprint'][:12]}...)")
        if got is None or got["sha256"] != then["sha256"]:
            what = "is gone" if got is None else (f"changed (sha256 {then['sha256'][:12]}... -> "
                                                  f"{got['sha256'][:12]}...)")
            noun = "folder" if then.get("folder") else "file"   # a folder: a file under it changed, came or went
            return f"{key}: the {noun} {then['path']} {what} since the checkpoint was written"
    return None


def choose(cfg, out: str | Path, config_dict: dict) -> tuple[Path, dict] | None:
    """The checkpoint this run resumes from (None: start afresh).

    A folder that is not empty and not a run directory of fedclust's (its
    marker, or an earlier fedclust's config.yaml) is refused, with
    ``overwrite=true`` too (:func:`fedclust.outputs.check_run_dir`).  A run
    directory is never replaced unless asked: with no checkpoint to
    continue, files of an earlier run are refused unless they are this same
    config's (a run killed before its first checkpoint starts again from round
    1: nothing of it is lost, every draw being a function of (seed, round,
    client)) or ``overwrite=true``.  A checkpoint of another config (more than
    run length and outputs differ) is refused unless ``overwrite=true``;
    ``resume=never`` refuses any earlier run unless ``overwrite=true``,
    ``resume=require`` a directory without a readable checkpoint."""
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise ConfigError("out", str(out), "is a file; choose a directory path for the run")
    check_run_dir(p, cfg.overwrite)
    taken = [f for f in RUN_FILES if (p / f).exists()] + ([DIRNAME] if candidates(out) else [])
    replace = REPLACE
    if cfg.resume == "never":
        if taken and not cfg.overwrite:
            raise ConfigError("out", str(out), f"already holds a run ({', '.join(taken)}) and resume=never; choose "
                              f"another out=DIR, move the old run away, {replace}, or drop resume=never to "
                              "continue it")
        return None
    found, skipped = scan(out)
    sections = tuple(registry.get(cfg.algorithm.name).sections)
    if found is None and skipped and not cfg.overwrite:
        each = "; ".join(f"{p.name}: {why}" for p, why in skipped)
        raise CheckpointError(f"no checkpoint under {directory(out)} can be used ({each}). The run cannot continue "
                              "from them; to run it again from round 1 (the same results: every draw is keyed on "
                              "seed, round and client), move that folder away or set overwrite=true")
    if found is None:
        if cfg.resume == "require":
            raise ConfigError("resume", "require", f"no readable checkpoint under {directory(out)}; run without "
                              "resume=require to start afresh")
        why = None if not taken or cfg.overwrite else _not_continuable(p, config_dict, sections)
        if why:
            raise ConfigError("out", str(out), f"holds {why} ({', '.join(taken)}); nothing is replaced unless "
                              f"asked: choose another out=DIR, move the old run away, or {replace}")
        return None
    return _continuable(cfg, p, config_dict, sections, *found)


REPLACE = "set overwrite=true to replace it"


def _continuable(cfg, p: Path, config_dict: dict, sections: tuple[str, ...], path: Path,
                 payload: dict) -> tuple[Path, dict] | None:
    """``(path, payload)`` when this config may continue the run from that checkpoint; None when
    ``overwrite=true`` replaces it; else ConfigError naming the run length, the differing keys or the changed
    input file."""
    done = int(payload["round"])
    if cfg.rounds < done:   # a run's record never says fewer rounds than it holds
        if cfg.overwrite:
            return None
        what = "finished" if (p / "summary.json").exists() else "has run"
        raise ConfigError("rounds", cfg.rounds, f"the run in {p} {what} {done} rounds (checkpoint {path.name}); a "
                          f"run is never cut back: give rounds={done} or more to continue it, another out=DIR for "
                          "a shorter run, or overwrite=true to replace it")
    diff = config_differences(payload["config"], config_dict, sections)
    if diff and not cfg.overwrite:
        old, new = upgrade.config(payload["config"]), upgrade.config(config_dict)
        shown = ", ".join(f"{k} ({old.get(k)!r} -> {new.get(k)!r})" for k in diff[:8])
        raise ConfigError(diff[0], new.get(diff[0]),
                          f"the checkpoint {path} was written with another config; differing keys: {shown}. Only "
                          "run length (rounds) and output keys may change on resume; use the old values, "
                          f"another out=DIR, or {REPLACE}")
    changed = None if diff else changed_inputs(payload.get("inputs", {}), input_files(cfg))
    if changed and not cfg.overwrite:
        key = changed.split(":")[0]
        kind = {"model": "model", "data.path": "data", "network.path": "graph", "network.availability": "trace"}
        raise ConfigError(key, functools.reduce(getattr, key.split("."), cfg),
                          f"{changed}; resuming would continue the run with another {kind.get(key, 'file')}. "
                          f"Restore the file, start in another out=DIR, or {REPLACE}")
    return None if diff or changed else (path, payload)


# ----------------------------------------------------------------------------
# When to save

CHECKPOINT_SECONDS = 300.0   # checkpoint_every=0: at least this long between checkpoints


class Checkpointer:
    """Decides when the round loop saves, and saves: every
    ``checkpoint_every`` rounds, or with 0 by the clock (every
    :data:`CHECKPOINT_SECONDS` or 50x the last checkpoint's cost, whichever
    is longer, so checkpoints take at most ~2% of the run); always after the
    last round and when some rank asked (a stop signal, its clock ran out).
    ``state.state_dict(shard, algo, run)`` gathers the state on every rank (rank 0 gets it)."""

    def __init__(self, setup: Setup, run_dir: str | Path):
        self.setup, self.run_dir = setup, run_dir
        self.every = setup.cfg.checkpoint_every
        self.last_time = time.monotonic()
        self.last_cost = 0.0
        self.last_path: Path | None = None

    def clock_due(self) -> bool:
        """This rank's clock has run out (checkpoint_every=0); the round's gather tells every rank."""
        if self.every:
            return False
        return time.monotonic() - self.last_time >= max(CHECKPOINT_SECONDS, 50.0 * self.last_cost)

    def after_round(self, state, outcome) -> None:
        t = state.round
        if (t == self.setup.cfg.rounds or outcome.stop or outcome.checkpoint_due
                or (self.every > 0 and t % self.every == 0)):
            self.write(state)

    def write(self, state) -> None:
        started = time.monotonic()
        setup = self.setup
        run = {"config": to_dict(setup.cfg), "inputs": setup.inputs}
        payload = setup.collective(state.round, state.state_dict, setup.shard, setup.algo, run)
        if payload is not None:
            self.last_path = write(self.run_dir, state.round, payload)
        self.last_cost = time.monotonic() - started
        self.last_time = time.monotonic()
