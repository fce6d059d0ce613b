"""The whole-run tests of tests/unit/test_fpfc_official.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import json

from fedclust.config import load_config


def test_a_short_official_run(tmp_path, capsys):
    """configs/fpfc_official_synthetic.yaml, small: it runs, warns once about Theorem 1, and records clusters."""
    from fedclust.runner import prepare, run

    cfg = load_config("configs/fpfc_official_synthetic.yaml",
                      ["clients=8", "rounds=3", "data.train_size=40", "data.test_size=20", "train.batch_size=40",
                       "progress=false", "figures=false", f"out={tmp_path / 'run'}"])
    summary = run(cfg, prepare(cfg))
    assert capsys.readouterr().err.count("Theorem 1") >= 1
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in lines] == [1, 2, 3] and summary["rounds_completed"] == 3
    assert all(r["num_clusters"] >= 1 for r in lines)


def test_a_short_head_fusion_run(tmp_path, capsys):
    """The golden run's settings (tests/golden/record.py), FPFC official with fpfc.fuse=head: it completes,
    and fusing the head alone changes the results."""
    from test_resume import GOLDEN_OVERRIDES  # tests/golden/record.py's, which test_resume puts on the path

    from fedclust.runner import prepare, run

    out = {}
    for fuse in ("head", "all"):
        cfg = load_config(None, GOLDEN_OVERRIDES + ["algorithm.name=fpfc", "fpfc.mode=official", f"fpfc.fuse={fuse}",
                                                    f"out={tmp_path / fuse}"])
        summary = run(cfg, prepare(cfg))
        assert summary["rounds_completed"] == 8
        out[fuse] = [json.loads(x) for x in (tmp_path / fuse / "metrics.jsonl").read_text().splitlines()]
    assert all(0 <= r["accuracy"] <= 100 and r["loss"] > 0 for r in out["head"])
    assert [r["loss"] for r in out["head"]] != [r["loss"] for r in out["all"]]
