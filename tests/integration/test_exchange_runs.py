"""The whole-run tests of tests/unit/test_exchange.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

from __future__ import annotations

import math

import pytest


@pytest.mark.parametrize("name", ["panm_grad", "fedavg", "ifca"])   # random: with blocks under faults, test_network
def test_runs_with_blocks_are_identical_on_one_and_two_processes_and_match_runs_without(tmp_path, name):
    from run_files import results
    from test_resume import assert_same_run, killed_run, launch, overrides, sub_run

    budget = "exchange_mb=0.1"   # 8 synthetic-MLP clients (54,410 weights): dozens of blocks a pass
    extra = ("participation=0.5",) if name in ("fedavg", "ifca") else ()
    for nproc in (1, 2):
        proc = launch(nproc, overrides(name, tmp_path / f"p{nproc}", budget, *extra))
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert_same_run(tmp_path / "p1", tmp_path / "p2")
    if name in ("fedavg", "ifca"):   # the server's averages from blocks have the whole models' bits
        whole = launch(1, overrides(name, tmp_path / "whole", *extra))
        assert whole.returncode == 0, whole.stderr[-3000:]
        assert results(tmp_path / "p1") == results(tmp_path / "whole")
        return
    if name == "panm_grad":   # a run killed on 2 processes (checkpoint at round 4) resumes on 1 to the same end
        killed_run(2, name, tmp_path / "killed", budget)
        sub_run(name, tmp_path / "killed", budget)
        assert_same_run(tmp_path / "p1", tmp_path / "killed")
    whole = launch(1, overrides(name, tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    (blocked, sb), (plain, sp) = results(tmp_path / "p1"), results(tmp_path / "whole")
    assert len(blocked) == len(plain)
    for a, b in zip(blocked, plain):   # the same peers; the averages differ in rounding only (sparse vs dense)
        for key in ("neighbor_precision", "neighbor_recall"):
            if key in b:
                assert a[key] == b[key], (a["round"], key)
        assert math.isclose(a["accuracy"], b["accuracy"], abs_tol=0.3), a["round"]
