"""The whole-run tests of tests/unit/test_fpfc_state.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import json

import pytest


@pytest.mark.xdist_group("one_and_two")   # launched with the other 1-and-2-process runs (conftest.py)
def test_one_and_two_processes_agree_bit_for_bit_while_clusters_form(one_and_two):
    """13 clients (7 + 6 on 2 ranks), 60% participation: FPFC fuses 3 then 2 clusters; every number equal
    (the golden config, where nothing fuses, is compared by tests/unit/test_plugins.py)."""
    runs = []
    for nproc in (1, 2):
        lines = [json.loads(x) for x in (one_and_two[nproc] / "fpfc_clustered" / "metrics.jsonl").read_text()
                 .splitlines()]
        runs.append([{k: x for k, x in r.items() if k != "round_seconds"} for r in lines])
    assert runs[0] == runs[1]
    assert runs[0][-1]["num_clusters"] == 2 and runs[0][-1]["ari"] == pytest.approx(1.0)


@pytest.mark.xdist_group("killed_on_two")   # killed, resumed and run whole with test_resume.py's (its fixture)
def test_head_fusion_on_one_and_two_processes_and_resumed_agrees_bit_for_bit(killed_on_two):
    """The golden settings with fpfc.fuse=head, 60% participation: a 2-process run killed after round 5
    resumes on 2 processes and on 1 and ends as the uninterrupted 2-process run, every number equal (the
    body's mean and the head's pairs are computed alike on every rank)."""
    from test_resume import assert_same_run

    whole = killed_on_two / "head" / "whole"
    for d in (killed_on_two / "killed" / "fpfc_head", killed_on_two / "killed_to_one" / "fpfc_head",
              killed_on_two / "head" / "one"):
        assert_same_run(whole, d)
    assert json.loads((killed_on_two / "head" / "one" / "summary.json").read_text())["rounds_completed"] == 8
