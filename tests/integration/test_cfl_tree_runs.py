"""The whole-run tests of tests/unit/test_cfl_tree.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import sys
from pathlib import Path

from fedclust.algorithms import cfl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))

from test_cfl_tree import _records, _run, one_thread  # noqa: E402, F401  (fixtures among them)


def test_resumed_run_with_a_tree_ends_exactly_as_an_uninterrupted_one(tmp_path, one_thread):
    _run(tmp_path / "whole")
    _run(tmp_path / "resumed", "rounds=5")                 # ends with a checkpoint at round 5, two splits cached
    from fedclust import checkpoint
    (_, path), = checkpoint.candidates(tmp_path / "resumed")[:1]
    saved = checkpoint.read(path)["algorithm"]["server"]
    assert saved["cache"].shape[0] == len(saved["splits"]) >= 2
    _run(tmp_path / "resumed", "rounds=8")                 # continues from round 5
    lines, summary = _records(tmp_path / "resumed")
    want_lines, want_summary = _records(tmp_path / "whole")
    assert lines == want_lines and summary == want_summary
    # both numbers in every round, and the best of lineage differs from the final cluster model somewhere
    assert all(r[cfl.BEST_OF_LINEAGE] is not None for r in lines)
    assert any(r[cfl.BEST_OF_LINEAGE] != r["accuracy"] for r in lines)
    assert summary["final_accuracy_best_of_lineage"] == lines[-1][cfl.BEST_OF_LINEAGE]
    assert summary["train_size"] == 40                      # the data setting: 32 train + 8 validate


def test_no_validation_split_trains_on_everything_and_reports_null(tmp_path, one_thread):
    _run(tmp_path / "r", "cfl.validation=0")
    lines, summary = _records(tmp_path / "r")
    assert all(r[cfl.BEST_OF_LINEAGE] is None for r in lines) and summary["final_accuracy_best_of_lineage"] is None
    fedavg = _run(tmp_path / "f", "algorithm.name=fedavg")
    assert "final_accuracy_best_of_lineage" not in fedavg
    assert cfl.BEST_OF_LINEAGE not in _records(tmp_path / "f")[0][0]
