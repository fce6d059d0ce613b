"""The whole-run tests of tests/unit/test_exchange.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

from __future__ import annotations

import math

import pytest
from run_files import EXCHANGE_RUNS


@pytest.mark.xdist_group("one_and_two")   # launched with the other 1-and-2-process runs (conftest.py)
@pytest.mark.parametrize("name", EXCHANGE_RUNS)
def test_runs_with_blocks_are_identical_on_one_and_two_processes_and_match_runs_without(one_and_two, tmp_path,
                                                                                         name):
    from run_files import results
    from test_resume import assert_same_run, killed_run, sub_run

    budget = "exchange_mb=0.1"   # 8 synthetic-MLP clients (54,410 weights): dozens of blocks a pass
    p1, p2 = (one_and_two[n] / "exchange" / name for n in (1, 2))
    assert_same_run(p1, p2)
    whole = one_and_two[1] / "exchange_whole" / name
    if name in ("fedavg", "ifca"):   # the server's averages from blocks have the whole models' bits
        assert results(p1) == results(whole)
        return
    if name == "panm_grad":   # a run killed on 2 processes (checkpoint at round 4) resumes on 1 to the same end
        killed_run(2, name, tmp_path / "killed", budget)
        sub_run(name, tmp_path / "killed", budget)
        assert_same_run(p1, tmp_path / "killed")
    (blocked, sb), (plain, sp) = results(p1), results(whole)
    assert len(blocked) == len(plain)
    for a, b in zip(blocked, plain):   # the same peers; the averages differ in rounding only (sparse vs dense)
        for key in ("neighbor_precision", "neighbor_recall"):
            if key in b:
                assert a[key] == b[key], (a["round"], key)
        assert math.isclose(a["accuracy"], b["accuracy"], abs_tol=0.3), a["round"]
