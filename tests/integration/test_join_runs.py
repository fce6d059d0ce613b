"""Late joiners end to end (``network.join_round``): runs whose clients join mid-run, PANMGrad's after stage one
copying a present client's model (``network.join_init=peer``, the peer on either rank) under offline clients, give
the same records, lists and summary on 1 process and on 2 (their runs are in the shared one_and_two jobs); in
whole runs of every method, before its round a joiner never trains, is in no list and no average, and at it starts
from the initial model (or the chosen present client's); a run killed before or after the join round resumes to
the same records.  The draws and records helpers are tests/unit/test_join.py's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from run_files import results
from test_join import JOIN, _cfg, _plain_joiners, _records
from test_resume import assert_same_run

import fedclust.runner as runner
from fedclust.network import Join, join_peers, joiners
from fedclust.peers import as_indices
from fedclust.runmodel import run_model

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


def _watch(monkeypatch):
    """Each round's outcome and the models right after the join's start, as the runner makes them."""
    seen: dict = {"outcomes": {}, "joined": None, "before_join": None}
    step, start = runner.round_step, Join.start

    def round_step(setup, state, t, *a):
        if t == setup.cfg.network.join_round:
            seen["before_join"] = state.flat.clone()
        out = step(setup, state, t, *a)
        seen["outcomes"][t] = out
        return out

    def join_start(self, flat, ids, all_reduce):
        start(self, flat, ids, all_reduce)
        seen["joined"] = flat.clone()

    monkeypatch.setattr(runner, "round_step", round_step)
    monkeypatch.setattr(Join, "start", join_start)
    return seen


@pytest.mark.parametrize("name,extra", [("random", []), ("panm_grad", ["network.join_init=peer"]),
                                        ("fedavg", []), ("ifca", ["network.p_offline=0.2", "ifca.restarts=1"]),
                                        ("random", ["train.init=per_client"]), ("dac", []), ("cobo", []),
                                        ("dpfl", []), ("epidemic", []), ("deprl", []), ("dfca", []),
                                        ("facade", ["network.join_init=peer"]), ("fedspd", []), ("cfl", []),
                                        ("fpfc", []), ("pens", []), ("oracle", [])])
def test_before_its_round_a_joiner_does_nothing_and_at_it_starts_as_asked(tmp_path, monkeypatch, name, extra):
    seen = _watch(monkeypatch)
    cfg = _cfg(tmp_path, name, *JOIN, *extra)
    runner.run(cfg, runner.prepare(cfg))
    late = joiners(cfg.seed, cfg.clients, 0.25)
    ids = late.nonzero().flatten()
    assert ids.tolist() == _plain_joiners(cfg.seed, cfg.clients, 0.25)
    for t, out in seen["outcomes"].items():
        trained = torch.ones(cfg.clients, dtype=torch.bool) if out.trained is None else out.trained.cpu()
        if t < 4:
            assert not trained[ids].any(), t                  # never trains
            assert torch.isnan(out.all_loss[ids]).all()
            for choice in (out.result.averaged, out.result.lists):
                if choice is None:
                    continue
                idx, valid = as_indices(choice)
                chosen = set(idx[valid].tolist())
                assert not chosen & set(ids.tolist()), (t, chosen)   # never chosen, never averaged
                assert not valid[ids].any()                           # and chooses nobody
        elif "network.p_offline=0.2" not in extra:
            assert trained[ids].all(), t
    joined = seen["joined"]
    if "network.join_init=peer" in extra:   # the chosen present client's model at the end of round 3
        peers = join_peers(cfg.seed, 4, late)
        assert torch.equal(joined[ids], seen["before_join"][peers[ids]])
    elif "train.init=per_client" in extra:
        assert torch.equal(joined[ids], run_model(cfg).client_rows(ids))
    else:
        assert torch.equal(joined[ids], run_model(cfg).w0.expand(len(ids), -1))
    if name == "fedavg":   # the server's model before: reset to w0 at the join
        assert not torch.equal(seen["before_join"][ids], joined[ids])
    # everyone else's model untouched by the join
    assert torch.equal(joined[~late], seen["before_join"][~late])




@pytest.mark.parametrize("kill_after", [2, 5])
def test_a_run_killed_before_or_after_the_join_resumes_to_the_same_records(tmp_path, kill_after):
    args = (*JOIN, "network.join_init=peer", "checkpoint_every=1")
    whole = _cfg(tmp_path / "whole", "panm_grad", *args)
    runner.run(whole, runner.prepare(whole))

    class Killed(Exception):
        pass

    def kill(setup, state, run_dir):
        if state.round == kill_after:
            raise Killed

    cut = _cfg(tmp_path / "cut", "panm_grad", *args)
    remove = runner.add_round_end_hook(kill)
    try:
        with pytest.raises(Killed):
            runner.run(cut, runner.prepare(cut))
    finally:
        remove()
    resumed = _cfg(tmp_path / "cut", "panm_grad", *args)
    assert runner.run(resumed, runner.prepare(resumed))["starts"] == 2
    assert _records(tmp_path / "cut" / "r") == _records(tmp_path / "whole" / "r")


def _builtin_names() -> list[str]:
    from fedclust.algorithms import registry

    return sorted(registry.builtin_names())


@pytest.mark.parametrize("name", _builtin_names())
def test_every_method_runs_with_late_joiners(tmp_path, name):
    cfg = _cfg(tmp_path, name, "network.join_round=3", "network.join_fraction=0.25", "network.join_init=peer",
               "network.p_offline=0.1", "ifca.restarts=1", rounds=5)
    summary = runner.run(cfg, runner.prepare(cfg))
    records = _records(tmp_path / "r")
    assert len(records) == 5 and all("joiner_accuracy" in r and "incumbent_accuracy" in r for r in records)
    assert summary["join"]["joiners"] == 2 and summary["join"]["joiner_accuracy_after"] is not None
