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


GOLDEN = Path(__file__).resolve().parent / "golden"
# Algorithms whose killed and resumed 2-process runs tests/test_resume.py compares with their golden files
# (so tests/test_plugins.py need not launch them on 2 processes again): one of each kind of state (PANM's
# lists and similarities, IFCA's cluster models, FedGroup's groups); random and panm_loss keep no state of
# their own beyond panm_grad's, and every algorithm's kill and resume is tested on one process.
RESUMED_ON_TWO = ("panm_grad", "ifca", "fedgroup")


def golden_here() -> bool:
    """Whether tests/golden/ was recorded with this torch build and CPU instruction set: then a run of its
    config, on one thread per process, equals it bit for bit (tests/test_golden.py)."""
    import torch

    env = json.loads((GOLDEN / "environment.json").read_text())
    return env["torch"] == torch.__version__ and env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()


def golden(name: str) -> tuple[list[dict], dict]:
    """The golden metrics and summary of ``name``, wall times removed (as :func:`results` gives a run's)."""
    records = [without_wall(json.loads(x)) for x in (GOLDEN / f"{name}.jsonl").read_text().splitlines()]
    return records, without_wall(json.loads((GOLDEN / f"{name}.summary.json").read_text()))
