"""Drift end to end (``data.drift_rounds``): a run whose clients change cluster twice gives the same records,
neighbour lists, true clusters and summary on 1 process and on 2 (its runs are in the shared one_and_two
jobs)."""

from __future__ import annotations

import numpy as np
import pytest
from run_files import results
from test_resume import assert_same_run

pytestmark = pytest.mark.integration


@pytest.mark.xdist_group("one_and_two")   # its two runs are in the shared 1- and 2-process jobs
def test_a_drifting_run_gives_the_same_numbers_on_one_and_two_processes(one_and_two):
    p1, p2 = one_and_two[1] / "drift" / "dfca", one_and_two[2] / "drift" / "dfca"
    assert_same_run(p1, p2)
    n1, n2 = (np.load(d / "neighbors.npz") for d in (p1, p2))
    for key in ("drift_rounds", "drift_clusters", "final_lists", "assignment"):
        assert np.array_equal(n1[key], n2[key]), key
    assert n1["drift_rounds"].tolist() == [3, 5] and (n1["drift_clusters"][2] != n1["drift_clusters"][0]).any()
    records, summary = results(p1)
    assert [r["drift_epoch"] for r in records] == [0, 0, 1, 1, 2, 2]
    assert [e["round"] for e in summary["drift"]] == [3, 5] and all(e["moved"] == 5 for e in summary["drift"])


@pytest.mark.xdist_group("killed_on_two")   # killed, resumed and run whole with test_resume.py's (its fixture)
def test_a_drifting_run_killed_on_two_processes_resumes_exactly_on_two_and_on_one(killed_on_two):
    """SIGKILL after round 5 (its second drift event), resumed from round 4's checkpoint (after the first) on 2
    processes and on 1: the uninterrupted 2-process run's records, true clusters and summary."""
    whole = killed_on_two / "dynamics" / "drift_dfca"
    for resumed in ("killed", "killed_to_one"):
        assert_same_run(killed_on_two / resumed / "drift_dfca", whole)
        a, b = (np.load(d / "neighbors.npz") for d in (killed_on_two / resumed / "drift_dfca", whole))
        assert np.array_equal(a["drift_clusters"], b["drift_clusters"])
