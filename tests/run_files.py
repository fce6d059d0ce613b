"""A run directory's metrics and summary without their wall-clock fields, for
tests that compare runs bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

WALL = ("round_seconds", "wall_seconds", "mean_round_seconds")


def without_wall(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in WALL}


def metrics(out) -> list[dict]:
    return [without_wall(json.loads(x)) for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def summary(out) -> dict:
    return without_wall(json.loads((Path(out) / "summary.json").read_text()))


def results(out) -> tuple[list[dict], dict]:
    return metrics(out), summary(out)
