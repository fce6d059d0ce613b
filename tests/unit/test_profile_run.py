"""experiments/profile_run.py's reading of a profile: the phase split per round from the profiler's averages, the top
operators without the phase labels, and the phases' wrappers put on and taken off the functions the round calls."""

from types import SimpleNamespace

import pytest
from run_files import experiment

prof = experiment("profile_run")


def event(key, count=1, cpu=0.0, device=0.0, self_cpu=0.0, self_device=0.0):
    return SimpleNamespace(key=key, count=count, cpu_time_total=cpu, device_time_total=device,
                           self_cpu_time_total=self_cpu, self_device_time_total=self_device)


def test_the_split_per_round_by_hand():
    events = [event("round", 2, cpu=10_000.0, device=8_000.0), event("train", 2, cpu=6_000.0, device=5_000.0),
              event("gather", 2, cpu=1_000.0), event("aggregate", 2, cpu=2_000.0, device=2_000.0),
              event("similarity", 2, cpu=500.0, device=1_500.0), event("evaluate", 2, cpu=4_000.0),
              event("aten::mm", 9, cpu=3_000.0)]
    split = prof.phase_split(events, rounds=2)   # microseconds over 2 rounds -> milliseconds a round
    assert split["round"] == {"calls": 2, "host_ms": 5.0, "device_ms": 4.0}
    assert split["train"]["host_ms"] == 3.0 and split["evaluate"]["host_ms"] == 2.0
    assert split["aggregate"]["host_ms_without_similarity"] == pytest.approx(0.75)
    assert split["aggregate"]["device_ms_without_similarity"] == pytest.approx(0.25)
    assert split["other_in_round"]["host_ms"] == pytest.approx(5.0 - 3.0 - 0.5 - 1.0)
    assert "checkpoint" not in split and "aten::mm" not in split


def test_top_operators_leave_out_the_phases_and_sort_by_self_time():
    events = [event("round", self_cpu=9e6), event("ProfilerStep#3", self_cpu=8e6),
              event("aten::mm", 4, self_cpu=3e3, self_device=1e3),
              event("aten::add", 2, self_cpu=5e3, self_device=0.5e3), event("aten::sum", 1, self_cpu=1e3)]
    assert [r["operator"] for r in prof.top_operators(events, 2)] == ["aten::add", "aten::mm"]
    assert prof.top_operators(events, 1, device=True) == [{"operator": "aten::mm", "calls": 4, "self_ms": 1.0}]


def test_the_phases_wrap_the_rounds_functions_and_put_them_back():
    import fedclust.checkpoint as checkpoint
    import fedclust.round as round_module
    import fedclust.runner as runner

    before = (round_module._local_training, round_module.exchange, runner.evaluate_round, runner.round_step,
              runner.build, checkpoint.Checkpointer.after_round)
    with prof.phases():
        inside = (round_module._local_training, round_module.exchange, runner.evaluate_round, runner.round_step,
                  runner.build, checkpoint.Checkpointer.after_round)
        assert all(a is not b for a, b in zip(before, inside))
        assert all(b.__wrapped__ is a for a, b in zip(before, inside) if b is not inside[4])
    after = (round_module._local_training, round_module.exchange, runner.evaluate_round, runner.round_step,
             runner.build, checkpoint.Checkpointer.after_round)
    assert all(a is b for a, b in zip(before, after))
