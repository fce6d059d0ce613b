"""The run directory: resolved config.yaml, metrics.jsonl (one line per
evaluated round, flushed as written), summary.json.  (The W&B mirror is
fedclust.tracking.)"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from fedclust import schema as config_mod
from fedclust.errors import ConfigError, FedclustError

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json")


def default_out(cfg, env=os.environ) -> str:
    """``runs/<algorithm>-<data>-s<seed>-<time>``; a run started by a W&B
    sweep agent (WANDB_SWEEP_ID and WANDB_RUN_ID set) takes
    ``runs/sweeps/<sweep id>/<run id>``, so a preempted sweep run handed to
    another agent, under the same run id, continues in the same directory."""
    if env.get("WANDB_SWEEP_ID") and env.get("WANDB_RUN_ID"):
        return f"runs/sweeps/{env['WANDB_SWEEP_ID']}/{env['WANDB_RUN_ID']}"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"runs/{cfg.algorithm.name}-{cfg.data.name}-s{cfg.seed}-{stamp}"


def check_out(path: str) -> None:
    """Refuse to write into a directory that already holds a run."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ConfigError("out", path, "is a file; choose a directory path for the run")
    taken = [f for f in RUN_FILES if (p / f).exists()]
    if taken:
        raise ConfigError("out", path, f"already holds a run ({', '.join(taken)}); choose another out=DIR "
                          "or move the old run away (nothing is overwritten)")


def truncate_lines(path: Path, keep: int) -> None:
    """Keep the first ``keep`` complete lines of a text file (create it empty if missing)."""
    if not path.exists():
        path.touch()
        return
    kept, size = 0, 0
    with open(path, "rb") as f:
        for line in f:
            if kept == keep or not line.endswith(b"\n"):
                break
            kept += 1
            size += len(line)
    if kept < keep:
        raise FedclustError(f"{path} has {kept} complete lines but the checkpoint counts {keep}; it was edited or "
                         "truncated since, so the run cannot continue exactly; move it away and resume")
    with open(path, "r+b") as f:
        f.truncate(size)


def json_safe(value):
    """JSON-safe: NaN/inf become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class RunWriter:
    """Writes the run directory (rank 0 only)."""

    def __init__(self, cfg, out: str, keep_lines: int = 0):
        """``keep_lines``: metrics lines of earlier rounds to keep (a resumed
        run's checkpoint count); later lines, from rounds after the
        checkpoint, are cut so that none is duplicated."""
        self.dir = Path(out)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "config.yaml").write_text(config_mod.dump(cfg))
        truncate_lines(self.dir / "metrics.jsonl", keep_lines)
        self._metrics = open(self.dir / "metrics.jsonl", "a")

    def log_round(self, record: dict) -> None:
        record = json_safe(record)
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()

    def write_summary(self, summary: dict) -> None:
        (self.dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=2) + "\n")

    def close(self) -> None:
        self._metrics.close()
