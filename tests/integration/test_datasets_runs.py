"""The whole-run tests of tests/unit/test_datasets.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from test_datasets import SMALL, _natural, _run, _write  # noqa: E402

from fedclust.config import load_config
from fedclust.errors import ConfigError


def test_a_short_run_on_a_natural_file(tmp_path):
    owners = np.repeat(np.arange(6), 10)
    path = _write(tmp_path, _natural(owners, np.repeat(np.arange(6), 4), cluster=[0, 0, 0, 1, 1, 1]))
    cfg = load_config(None, SMALL + ["data.name=npz", f"data.path={path}", "algorithm.name=oracle",
                                     f"out={tmp_path / 'r'}"])
    summary = _run(cfg)
    assert summary["data"] == "npz" and summary["data_clusters"] is None and summary["true_clusters"] == 2
    assert summary["neighbor_precision"] == 1.0
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2


def test_a_run_on_clients_of_unequal_sizes_without_true_clusters_and_its_resume_guard(tmp_path):
    owners = np.array([0] * 12 + [1] * 3 + [2] * 7 + [3] * 5 + [4] * 9 + [5] * 1)
    path = _write(tmp_path, _natural(owners, np.repeat(np.arange(6), [4, 1, 2, 3, 2, 1])))
    base = SMALL + ["data.name=npz", f"data.path={path}", "algorithm.name=panm_loss", "data.num_clusters=1",
                    f"out={tmp_path / 'r'}", "checkpoint_every=1"]
    summary = _run(load_config(None, base))
    assert summary["neighbor_precision"] is None and summary["ari"] is None and summary["true_clusters"] is None
    assert 0 <= summary["final_accuracy"] <= 100 and summary["data_source"] == str(Path(path).resolve())
    assert summary["data_sha256"] == hashlib.sha256(Path(path).read_bytes()).hexdigest()   # report keeps files apart
    load_config(None, base + ["rounds=3"])                         # the same file: resumable
    from fedclust.runner import prepare
    assert prepare(load_config(None, base + ["rounds=3"])).resume_from is not None
    with open(path, "ab") as f:                                    # the file changes
        f.write(b"\0")
    with pytest.raises(ConfigError) as e:
        prepare(load_config(None, base + ["rounds=3"]))
    assert e.value.field == "data.path" and str(Path(path).resolve()) in str(e.value) and "changed" in str(e.value)
    assert "overwrite=true" in str(e.value)
    assert prepare(load_config(None, base + ["rounds=3", "overwrite=true"])).resume_from is None
