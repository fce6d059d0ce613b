"""The whole-run tests of tests/unit/test_partitions.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

from __future__ import annotations

import json
import math

from test_partitions import SMALL, pool  # noqa: E402, F401  (fixtures among them)

from fedclust.config import load_config


def test_a_two_round_run_of_a_dirichlet_split_of_rotation_clusters(tmp_path, pool):
    from fedclust.runner import prepare, run

    cfg = load_config(None, SMALL + ["algorithm.name=fedavg", "data.name=npz", f"data.path={pool}",
                                     "data.num_clusters=4", "data.partition=dirichlet", "data.alpha=0.1",
                                     "data.quantity_skew=1.5", "data.train_size=20", "data.test_size=10",
                                     f"out={tmp_path / 'r'}"])
    summary = run(cfg, prepare(cfg))
    assert summary["data_partition"] == "dirichlet" and summary["data_alpha"] == 0.1
    assert summary["data_quantity_skew"] == 1.5 and summary["data_shards_per_client"] is None
    assert summary["train_size"] is None and summary["test_size"] == 10      # clients of unequal sizes
    assert summary["rounds_completed"] == 2 and math.isfinite(summary["final_accuracy"])
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(math.isfinite(x["loss"]) for x in lines)
