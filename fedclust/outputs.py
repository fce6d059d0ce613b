"""The run directory: resolved config.yaml, metrics.jsonl (one line per
evaluated round, flushed as written), summary.json; optional W&B mirror."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from fedclust import schema as config_mod
from fedclust.errors import ConfigError, FedclustError

RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json")


def default_out(cfg) -> str:
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


def _clean(value):
    """JSON-safe: NaN/inf become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
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
        self._wandb = None
        self.run_id = None
        if cfg.wandb.enabled:
            import wandb

            self._wandb = wandb.init(
                project=cfg.wandb.project, entity=cfg.wandb.entity or None, mode=cfg.wandb.mode,
                group=cfg.wandb.group or None, config=config_mod.to_dict(cfg), dir=str(self.dir),
                name=self.dir.name,
            )
            self.run_id = self._wandb.id   # saved in checkpoints (resuming the W&B run itself: issue 11)

    def log_round(self, record: dict) -> None:
        record = _clean(record)
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()
        if self._wandb is not None:
            self._wandb.log({k: v for k, v in record.items() if not isinstance(v, list)}, step=record["round"])

    def write_summary(self, summary: dict) -> None:
        (self.dir / "summary.json").write_text(json.dumps(_clean(summary), indent=2) + "\n")
        if self._wandb is not None:
            self._wandb.summary.update({k: v for k, v in _clean(summary).items() if not isinstance(v, (list, dict))})

    def close(self) -> None:
        self._metrics.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None
