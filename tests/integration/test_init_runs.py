"""A whole run under train.init=per_client (tests/unit/test_init.py holds the rule): it starts each client from
its own model, so its first round differs from the common start, and config.yaml and the summary's setting say so."""

from __future__ import annotations

import json

import yaml
from record import run_on_one_thread

from fedclust.config import load_config

ARGS = ["data.name=synthetic", "model=mlp", "data.train_size=40", "data.test_size=20", "clients=6", "rounds=2",
        "algorithm.name=dac", "algorithm.k=2", "progress=false", "figures=false", "seed=2"]


def _run(out, extra):
    run_on_one_thread(load_config(None, ARGS + [f"out={out}"] + extra))
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_per_client_start_runs_and_is_recorded(tmp_path):
    common = _run(tmp_path / "common", [])
    own = _run(tmp_path / "own", ["train.init=per_client"])
    assert [r["round"] for r in own] == [1, 2]
    assert own[0]["accuracy"] != common[0]["accuracy"] or own[0]["train_loss"] != common[0]["train_loss"]
    assert yaml.safe_load((tmp_path / "own" / "config.yaml").read_text())["train"]["init"] == "per_client"
    summary = json.loads((tmp_path / "own" / "summary.json").read_text())
    assert summary["setting"]["train.init"] == "per_client"
