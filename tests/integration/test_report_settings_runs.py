"""The whole-run tests of tests/unit/test_report_settings.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

from __future__ import annotations

import json

import yaml
from test_report import FMNIST2

from fedclust import report
from fedclust.config import load_config
from fedclust.runner import prepare, run
from fedclust.setting import run_setting


def test_summary_json_records_the_setting_and_report_reads_it(tmp_path):
    base = ["data.name=synthetic", "clients=6", "rounds=2", "data.train_size=20", "data.test_size=10",
            "algorithm.name=random", "algorithm.k=2", "progress=false", "figures=false"]
    for name, extra in (("plain", []), ("ring", ["network.graph=ring"]),
                        ("attacked", ["attack.fraction=0.2", "attack.kind=gaussian"])):
        cfg = load_config(None, base + [f"out={tmp_path / name}", *extra])
        run(cfg, prepare(cfg))
    got = {n: json.loads((tmp_path / n / "summary.json").read_text())["setting"] for n in ("plain", "ring", "attacked")}
    assert got["plain"]["network.graph"] == "complete" and got["ring"]["network.graph"] == "ring"
    assert got["attacked"]["attack.fraction"] == 0.2 and got["attacked"]["attack.kind"] == "gaussian"
    # the rule on config.yaml (an older run) gives the summary's setting
    for n in got:
        assert run_setting(yaml.safe_load((tmp_path / n / "config.yaml").read_text())) == got[n]
    res = report.Results(report.load_runs([tmp_path / n for n in got]))
    assert len(res.settings) == 3
    assert FMNIST2   # the fixtures of test_report are shared (imported above)
