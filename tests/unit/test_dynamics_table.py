"""experiments/dynamics_table.py (docs/results_dynamics.md's tables) on hand-made run directories: each column
is the summary's field or the records' value it names, mean ± std over seeds, "never" where a run never
recovered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_files import experiment


def write_run(d: Path, summary: dict, records: list[dict]) -> None:
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def drift_run(d: Path, final: float, before: list[float], back: int | None) -> None:
    records = [{"round": t, "accuracy": 50.0, "neighbor_precision": 0.5 if t < 150 else 0.75,
                "ari": 0.25 if t < 149 else 0.4 if t == 149 else 0.1,
                "drift_moved_accuracy": [before[t - 140] if 140 <= t < 150 else 30.0]} for t in range(1, 201)]
    event = {"round": 150, "moved": 28, "pre_accuracy": before[-1], "recovery_rounds": back,
             "recovered": back is not None, "accuracy_after": 60.0}
    write_run(d, {"final_accuracy": final, "neighbor_precision": 0.8, "ari": 0.9, "drift": [event]}, records)


def test_drift_rows_read_the_summary_and_the_ten_rounds_before(tmp_path):
    table, out = experiment("dynamics_table"), tmp_path
    drift_run(out / "drift" / "dac-s0", 80.0, [70.0 + i for i in range(10)], 12)      # before: 74.5
    drift_run(out / "drift" / "dac-s1", 82.0, [72.0 + i for i in range(10)], None)    # before: 76.5
    lines = table.table(out, "drift")
    row = next(x for x in lines if x.startswith("| dac |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # final 81 ± 1.41; before 75.5 ± 1.41; after 60; recover 12 (one seed never); precision 50 before, 80 at the
    # end; ARI at round 149 (0.40) and the summary's (0.90)
    assert cells == ["dac", "2", "81.00 ± 1.41", "75.50 ± 1.41", "60.00 ± 0.00", "12 (never in 1)", "50.00 ± 0.00",
                     "80.00 ± 0.00", "0.40 ± 0.00", "0.90 ± 0.00", "-", "-"]   # no neighbors.npz: no list columns
    assert next(x for x in lines if x.startswith("| oracle |")).count("-") >= 6   # no run: dashes


def test_join_rows_read_the_summary(tmp_path):
    table, out = experiment("dynamics_table"), tmp_path
    join = {"round": 150, "joiners": 25, "init": "initial", "joiner_accuracy_after": 70.0,
            "joiner_neighbor_precision_after": None, "incumbent_accuracy_after": 80.0,
            "incumbent_neighbor_precision_after": 0.9, "catch_up_rounds": None}
    write_run(out / "join" / "panm_grad-s0", {"final_accuracy": 78.0, "join": join}, [{"round": 1}])
    row = next(x for x in table.table(out, "join") if x.startswith("| panm_grad |"))
    assert [c.strip() for c in row.strip("|").split("|")] == ["panm_grad", "1", "78.00", "70.00", "80.00", "-",
                                                              "90.00", "never"]


def test_moved_clients_lists_by_hand(tmp_path):
    """Clients 0-3 in clusters 0, 0, 1, 1; clients 0 and 2 swap clusters at the drift. Client 0's final list
    {1, 3}: 3 is in its new cluster (1), 1 in its old (0); client 2's list {3}: its old cluster. Of 3 entries,
    1 in the new cluster (33.33%) and 2 in the old (66.67%); client 1's list is not counted (it did not move)."""
    import numpy as np

    table, out = experiment("dynamics_table"), tmp_path
    drift_run(out / "drift" / "panm_grad-s0", 80.0, [70.0] * 10, None)
    np.savez(out / "drift" / "panm_grad-s0" / "neighbors.npz", drift_clusters=np.array([[0, 0, 1, 1], [1, 0, 0, 1]]),
             final_lists=np.array([[1, 3], [0, -1], [3, -1], [-1, -1]]))
    assert table.moved_lists(out / "drift" / "panm_grad-s0") == pytest.approx((100 / 3, 200 / 3))
    row = next(x for x in table.table(out, "drift") if x.startswith("| panm_grad |"))
    assert [c.strip() for c in row.strip("|").split("|")][-2:] == ["33.33", "66.67"]
    np.savez(out / "drift" / "panm_grad-s0" / "neighbors.npz", clusters=np.zeros(4))   # a method without lists
    assert table.moved_lists(out / "drift" / "panm_grad-s0") == (None, None)


def test_moved_clients_assignment_by_hand(tmp_path):
    """A method with an assignment and no lists (IFCA): clients 0-5 in clusters 0, 0, 0, 1, 1, 1; clients 0 and 3
    swap. The stayers of cluster 0 (clients 1, 2) hold model 2, those of cluster 1 (4, 5) model 1. Client
    0 (now in 1) holds model 1: with its new cluster; client 3 (now in 0) holds model 1: with its old cluster. So
    50% with the new cluster, 50% with the old."""
    import numpy as np

    table, out = experiment("dynamics_table"), tmp_path
    d = out / "drift" / "ifca-s0"
    drift_run(d, 80.0, [70.0] * 10, 0)
    np.savez(d / "neighbors.npz", drift_clusters=np.array([[0, 0, 0, 1, 1, 1], [1, 0, 0, 0, 1, 1]]),
             assignment=np.array([1, 2, 2, 1, 1, 1]))
    assert table.moved_lists(d) == pytest.approx((50.0, 50.0))
    np.savez(d / "neighbors.npz", drift_clusters=np.array([[0, 0, 0, 1, 1, 1], [1, 0, 0, 0, 1, 1]]),
             assignment=np.array([1, 2, 2, 2, 1, 1]))                  # both follow their new cluster
    assert table.moved_lists(d) == pytest.approx((100.0, 0.0))


def test_a_method_keeps_its_colour_in_every_panel(tmp_path, monkeypatch):
    """A method without lists (IFCA: no precision) is absent from the third panel; the methods after it keep
    their colour there (the axes' own colour cycle would shift them by one)."""
    table, out = experiment("dynamics_table"), tmp_path
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for m, precision in (("random", 0.25), ("ifca", None), ("dfca", 1.0)):
        records = [{"round": t, "accuracy": 50.0, "joiner_accuracy": 40.0, "joiner_neighbor_precision": precision}
                   for t in range(1, 5)]
        write_run(out / "join" / f"{m}-s0", {"final_accuracy": 50.0}, records)
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)   # keep the figure to read its lines
    assert table.figure(out, "join", tmp_path / "join.png")
    axes = figures[0].axes
    colour = [{line.get_label(): line.get_color() for line in ax.get_lines() if not line.get_label().startswith("_")}
              for ax in axes]
    order = table.METHODS
    assert colour[0] == colour[1] == {"random": f"C{order.index('random')}", "ifca": f"C{order.index('ifca')}",
                                      "dfca": f"C{order.index('dfca')}"}
    assert colour[2] == {"random": colour[0]["random"], "dfca": colour[0]["dfca"]}
