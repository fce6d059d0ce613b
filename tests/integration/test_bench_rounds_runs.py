"""The whole-run tests of tests/unit/test_bench_rounds.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import json

from test_bench_rounds import TINY  # noqa: E402

from fedclust.bench import rounds as bench_rounds


def test_round_times_by_stage(capsys):
    argv = ["--config", "", "--rounds", "4", "--stage1", "2", "--algorithms", "random,panm_grad", "--json", *TINY]
    assert bench_rounds.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert list(got) == ["random", "panm_grad"]
    for times in got.values():
        assert len(times["stage1"]) == 1 and len(times["stage2"]) == 2      # round 1 is the untimed warm-up
        assert all(t > 0 for t in times["stage1"] + times["stage2"])


def test_checkpoint_cost(capsys):
    argv = ["--config", "", "--checkpoint", "6", "--rounds", "2", "--stage1", "1", "--json", *TINY]
    assert bench_rounds.main(argv) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["clients"] == 6 and row["params"] > 0 and row["checkpoint_mb"] > 0
    assert 0 < row["share_default"] < row["share_every_10_rounds"] < 1
