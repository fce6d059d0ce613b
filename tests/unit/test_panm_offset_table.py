"""experiments/panm_offset_table.py (docs/results_fmnist.md, "The PANM offset") on hand-made run directories:
each protocol's number worked out by hand from the records and summaries it reads."""

from __future__ import annotations

import json
from pathlib import Path

from run_files import experiment


def write_run(d: Path, summary: dict, clients: list[list[float]]) -> None:
    """clients[t]: each client's accuracy at evaluated round t + 1 (every other round has no evaluation)."""
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    rows = []
    for t, accs in enumerate(clients):
        rows.append({"round": 2 * t + 1, "accuracy": sum(accs) / len(accs), "client_accuracy": accs})
        rows.append({"round": 2 * t + 2, "train_loss": 0.5})            # a round without evaluation
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_protocols_by_hand(tmp_path):
    t = experiment("panm_offset_table")
    # 3 clients over 3 evaluated rounds: per-round means 60, 70, 66.67; each client's best 80, 70, 70 -> 73.33
    write_run(tmp_path / "unit" / "v0" / "local-s0", {"final_accuracy": 66.67},
              [[50.0, 60.0, 70.0], [80.0, 70.0, 60.0], [70.0, 70.0, 60.0]])
    write_run(tmp_path / "unit" / "v0" / "local-s1", {"final_accuracy": 70.0},
              [[70.0, 70.0, 70.0]])
    write_run(tmp_path / "unit" / "v20" / "local-s0", {"final_accuracy": 65.0, "best_validation_accuracy": 68.5},
              [[65.0, 65.0, 65.0]])
    lines = t.table(tmp_path)
    row = next(x for x in lines if x.startswith("| local | unit |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["local", "unit", "2/1", "76.24"]
    final, best_round, best_test, best_val, final_v20 = cells[4:]
    assert final == "68.34 ± 2.35"                   # mean and sample std (3.33 / sqrt 2) of 66.67 and 70.0
    assert best_round == "70.00 ± 0.00"              # max of (60, 70, 66.67) and 70
    assert best_test == "71.67 ± 2.36"               # mean, sample std of 73.33 and 70
    assert (best_val, final_v20) == ("68.50", "65.00")
    missing = next(x for x in lines if x.startswith("| panm_grad | symmetric |"))
    assert missing.count("| - ") == 5 and "| 0/0 | 86.88 |" in missing
    assert len(lines) == 2 + 9


def test_best_round_is_the_highest_round_mean():
    t = experiment("panm_offset_table")
    assert t.best_round([{"accuracy": 50.0}, {"accuracy": 25.0}]) == 50.0   # (the best test: test_report.py)
    assert t.best_round([]) is None
