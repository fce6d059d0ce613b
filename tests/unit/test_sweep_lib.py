"""experiments/sweep_lib.sh, shared by the sweep scripts: run_dir runs a config into a folder once (a finished
run is skipped, a failed one said in a line and the sweep goes on), preflight stops a sweep whose fedclust cannot
start before its first run."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def sweep(tmp_path: Path, script: str, fake: str) -> subprocess.CompletedProcess:
    """``script`` run by bash after sourcing the library, FEDCLUST a fake command that logs its arguments."""
    cmd = tmp_path / "fake"
    cmd.write_text(f"#!/usr/bin/env bash\necho \"$*\" >> {tmp_path / 'calls'}\n{fake}\n")
    cmd.chmod(0o755)
    env = dict(os.environ, OUT=str(tmp_path), THREADS="1", EXTRA="device=cpu", FEDCLUST=str(cmd))
    return subprocess.run(["bash", "-c", f"set -euo pipefail; . experiments/sweep_lib.sh; {script}"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60)


def calls(tmp_path: Path) -> list[str]:
    p = tmp_path / "calls"
    return p.read_text().splitlines() if p.exists() else []


def test_run_dir_runs_once_into_its_folder_and_skips_a_finished_run(tmp_path):
    done = tmp_path / "A" / "done-s0"
    done.mkdir(parents=True)
    (done / "summary.json").write_text("{}")
    out = sweep(tmp_path, f"run_dir {tmp_path}/A/new-s0 c.yaml seed=1; run_dir {done} c.yaml seed=2", "exit 0")
    assert out.returncode == 0, out.stderr
    assert calls(tmp_path) == [f"run c.yaml seed=1 out={tmp_path}/A/new-s0 progress=false device=cpu"]
    assert (tmp_path / "A" / "new-s0.log").exists()


def test_a_failed_run_is_said_and_the_sweep_goes_on(tmp_path):
    out = sweep(tmp_path, f"run_dir {tmp_path}/a c.yaml; run_dir {tmp_path}/b c.yaml", "echo boom >&2; exit 3")
    assert out.returncode == 0
    assert out.stdout.splitlines() == [f"failed: {tmp_path}/a (see {tmp_path}/a.log)",
                                       f"failed: {tmp_path}/b (see {tmp_path}/b.log)"]
    assert "boom" in (tmp_path / "a.log").read_text() and len(calls(tmp_path)) == 2


def test_preflight_stops_the_sweep_before_any_run(tmp_path):
    out = sweep(tmp_path, f"preflight c.yaml k=v; run_dir {tmp_path}/a c.yaml", "exit 1")
    assert out.returncode == 2
    assert "preflight" in out.stderr and "nothing run" in out.stderr
    assert calls(tmp_path) == ["check c.yaml k=v device=cpu"]      # the check alone, no run
