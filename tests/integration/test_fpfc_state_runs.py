"""The whole-run tests of tests/unit/test_fpfc_state.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import json
import shutil

import pytest
from test_fpfc_state import CLUSTERED, HEAD  # noqa: E402


def test_one_and_two_processes_agree_bit_for_bit_while_clusters_form(tmp_path):
    """13 clients (7 + 6 on 2 ranks), 60% participation: FPFC fuses 3 then 2 clusters; every number equal
    (the golden config, where nothing fuses, is compared by tests/unit/test_plugins.py)."""
    from test_resume import launch

    runs = []
    for nproc in (1, 2):
        proc = launch(nproc, CLUSTERED + [f"out={tmp_path / str(nproc)}"])
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [json.loads(x) for x in (tmp_path / str(nproc) / "metrics.jsonl").read_text().splitlines()]
        runs.append([{k: x for k, x in r.items() if k != "round_seconds"} for r in lines])
    assert runs[0] == runs[1]
    assert runs[0][-1]["num_clusters"] == 2 and runs[0][-1]["ari"] == pytest.approx(1.0)


def test_head_fusion_on_one_and_two_processes_and_resumed_agrees_bit_for_bit(tmp_path):
    """The golden settings with fpfc.fuse=head, 60% participation: a 2-process run killed after round 5
    resumes on 2 processes and on 1 and ends as the uninterrupted 2-process run, every number equal (the
    body's mean and the head's pairs are computed alike on every rank)."""
    from batch import launch_many
    from test_resume import assert_same_run, env, killed_run, overrides

    killed_run(2, "fpfc", tmp_path / "killed", *HEAD)
    shutil.copytree(tmp_path / "killed", tmp_path / "killed_to_one")
    for nproc, runs in ((2, ["whole", "killed"]), (1, ["killed_to_one", "one"])):   # one job each
        proc = launch_many(nproc, [overrides("fpfc", tmp_path / d, *HEAD) for d in runs], tmp_path / f"{nproc}.json",
                           env())
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stderr.count("fedclust: resuming") == 1
    for d in ("killed", "killed_to_one", "one"):
        assert_same_run(tmp_path / "whole", tmp_path / d)
    assert json.loads((tmp_path / "one" / "summary.json").read_text())["rounds_completed"] == 8
