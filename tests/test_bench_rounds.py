"""fedclust bench-rounds: runs each algorithm and splits its round times by stage."""

import json

import pytest

from fedclust.bench import rounds as bench_rounds

TINY = ["data.name=synthetic", "data.synthetic_dim=1", "data.train_size=30", "data.test_size=10", "clients=6",
        "algorithm.k=2", "algorithm.l=3", "seed=1"]


@pytest.mark.integration
def test_round_times_by_stage(capsys):
    argv = ["--config", "", "--rounds", "4", "--stage1", "2", "--algorithms", "random,panm_grad", "--json", *TINY]
    assert bench_rounds.main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert list(got) == ["random", "panm_grad"]
    for times in got.values():
        assert len(times["stage1"]) == 1 and len(times["stage2"]) == 2      # round 1 is the untimed warm-up
        assert all(t > 0 for t in times["stage1"] + times["stage2"])


def test_table_ratios_by_hand():
    text = bench_rounds.table({"random": {"stage1": [1.0, 3.0], "stage2": [2.0]},
                               "panm_loss": {"stage1": [4.0], "stage2": [5.0, 7.0, 9.0]}})
    rows = text.splitlines()[2:]
    assert rows[0] == "| random | 2.000 | 1.00 | 2.000 | 1.00 |"
    assert rows[1] == "| panm_loss | 4.000 | 2.00 | 7.000 | 3.50 |"


@pytest.mark.integration
def test_checkpoint_cost(capsys):
    argv = ["--config", "", "--checkpoint", "6", "--rounds", "2", "--stage1", "1", "--json", *TINY]
    assert bench_rounds.main(argv) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["clients"] == 6 and row["params"] > 0 and row["checkpoint_mb"] > 0
    assert 0 < row["share_default"] < row["share_every_10_rounds"] < 1
