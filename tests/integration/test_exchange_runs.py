"""The whole-run tests of tests/unit/test_exchange.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

from __future__ import annotations

import math

import pytest
from run_files import EXCHANGE_RUNS


@pytest.mark.xdist_group("one_and_two")   # launched with the other 1-and-2-process runs (conftest.py)
@pytest.mark.parametrize("name", EXCHANGE_RUNS)
def test_runs_with_blocks_are_identical_on_one_and_two_processes_and_match_runs_without(one_and_two, name):
    from run_files import results
    from test_resume import assert_same_run

    p1, p2 = (one_and_two[n] / "exchange" / name for n in (1, 2))
    assert_same_run(p1, p2)
    whole = one_and_two[1] / "exchange_whole" / name
    if name in ("fedavg", "ifca"):   # the server's averages from blocks have the whole models' bits
        assert results(p1) == results(whole)
        return
    (blocked, _), (plain, _) = results(p1), results(whole)
    assert len(blocked) == len(plain)
    for a, b in zip(blocked, plain):   # the same peers; the averages differ in rounding only (sparse vs dense)
        for key in ("neighbor_precision", "neighbor_recall"):
            if key in b:
                assert a[key] == b[key], (a["round"], key)
        assert math.isclose(a["accuracy"], b["accuracy"], abs_tol=0.3), a["round"]


@pytest.mark.xdist_group("killed_on_two")   # killed with the other 2-process runs (conftest.py)
def test_a_run_in_blocks_killed_on_two_processes_resumes_exactly_on_one_and_on_two(killed_on_two):
    """PANMGrad exchanging in column blocks, killed after round 5 on 2 processes (checkpoint at round 4), ends as
    its uninterrupted 1-process run whether it continues on 1 process or on 2."""
    from test_resume import assert_same_run

    whole = killed_on_two / "exchange" / "one"
    for resumed in ("killed_to_one", "killed"):
        assert_same_run(killed_on_two / resumed / "exchange_panm_grad", whole)
