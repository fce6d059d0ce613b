"""The whole-run tests of tests/unit/test_launch.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from test_launch import ROOT  # noqa: E402


def test_local_grid_runs_in_sequence_and_skips_when_run_again(tmp_path):
    def go():
        return subprocess.run([sys.executable, "-m", "launch.submit", "configs/synthetic_cluster4.yaml",
                               "--grid", "algorithm.name=local,fedavg", "--local", "--out", str(tmp_path),
                               "clients=8", "rounds=2", "figures=false", "progress=false"],
                              cwd=ROOT, capture_output=True, text=True, timeout=600,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    proc = go()
    assert proc.returncode == 0, proc.stderr[-3000:]
    for alg in ("local", "fedavg"):
        got = json.loads((tmp_path / f"algorithm.name={alg}" / "summary.json").read_text())
        assert (got["algorithm"], got["rounds_completed"]) == (alg, 2)
    assert "| fedavg | 1 |" in proc.stdout and f"fedclust report {tmp_path}/*" in proc.stdout
    again = go()
    assert again.returncode == 0 and "nothing to submit" in again.stdout
