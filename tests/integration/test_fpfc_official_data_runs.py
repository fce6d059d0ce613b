"""The whole-run tests of tests/unit/test_fpfc_official_data.py's subject (runs in this process or launched ones);
the unit tests are in that file."""

import json
from pathlib import Path

import numpy as np
from run_files import ROOT
from test_fpfc_official_data import _pool, data


def test_a_short_run_on_the_codes_data_and_cnn(tmp_path):
    """configs/fpfc_official_fmnist.yaml on a small file of the code's form, with its CNN: the head (fc1, 4,010
    numbers) is fused, the run completes, and the true clusters come from the file."""
    from fedclust.config import load_config
    from fedclust.runner import prepare, run

    xtr, ytr = _pool(1600, 3)
    xte, yte = _pool(800, 4)
    np.savez(tmp_path / "code.npz", **data.build(xtr, ytr, xte, yte, devices=8, clusters=4, seed=0))
    root = Path(__file__).resolve().parents[2]
    cfg = load_config(str(root / "configs" / "fpfc_official_fmnist.yaml"), [
        "data.name=npz", f"data.path={tmp_path / 'code.npz'}", "clients=8", "rounds=2", "train.local_epochs=1",
        f"model={ROOT / 'experiments' / 'fpfc_official_convnet.py'}:ConvNet", f"out={tmp_path / 'run'}",
        "progress=false"])
    summary = run(cfg, prepare(cfg))
    assert summary["rounds_completed"] == 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(0 <= r["accuracy"] <= 100 for r in rows)
    assert rows[-1]["ari"] is not None   # the file's `cluster` array gives the true clusters
