"""Late joiners end to end (``network.join_round``): runs whose clients join mid-run, PANMGrad's after stage one
copying a present client's model (``network.join_init=peer``, the peer on either rank) under offline clients, give
the same records, lists and summary on 1 process and on 2 (their runs are in the shared one_and_two jobs)."""

from __future__ import annotations

import numpy as np
import pytest
from run_files import results
from test_resume import assert_same_run

from fedclust.network import join_peers, joiners

pytestmark = pytest.mark.integration


@pytest.mark.xdist_group("one_and_two")   # its runs are in the shared 1- and 2-process jobs
@pytest.mark.parametrize("name", ["panm_grad", "dfca"])
def test_a_run_with_late_joiners_gives_the_same_numbers_on_one_and_two_processes(one_and_two, name):
    p1, p2 = one_and_two[1] / "join" / name, one_and_two[2] / "join" / name
    assert_same_run(p1, p2)
    n1, n2 = (np.load(d / "neighbors.npz") for d in (p1, p2))
    assert np.array_equal(n1["final_lists"], n2["final_lists"])
    records, _ = results(p1)
    assert all("joiner_accuracy" in r and "incumbent_neighbor_precision" in r for r in records)
    late = joiners(3, 8, 0.25)
    if name == "panm_grad":   # a joiner on one rank copies a client on the other (ranks hold 0-3 and 4-7)
        ids = late.nonzero().flatten()
        peers = join_peers(3, 5, late)[ids]
        assert ((ids < 4) != (peers < 4)).any(), (ids.tolist(), peers.tolist())
        # joining after stage one, each joiner's empty list was filled at HNM (panm.empty_list=fill)
        assert all((n1["final_lists"][int(i)] >= 0).any() for i in ids), n1["final_lists"][ids.numpy()]


@pytest.mark.xdist_group("killed_on_two")   # killed, resumed and run whole with test_resume.py's (its fixture)
def test_joiners_after_stage_one_killed_on_two_processes_resume_exactly_on_two_and_on_one(killed_on_two):
    """SIGKILL after round 5 (joined at 3, lists filled at HNM), resumed from round 4's checkpoint on 2 processes
    and on 1: the uninterrupted 2-process run's records, lists and summary."""
    whole = killed_on_two / "dynamics" / "join_panm_grad"
    for resumed in ("killed", "killed_to_one"):
        assert_same_run(killed_on_two / resumed / "join_panm_grad", whole)
    lists = np.load(whole / "neighbors.npz")["final_lists"]
    ids = joiners(3, 8, 0.25).nonzero().flatten()
    assert all((lists[int(i)] >= 0).any() for i in ids), lists[ids.numpy()]
