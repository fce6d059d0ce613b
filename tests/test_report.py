"""fedclust report: the results table from run summaries, by hand."""

import json

from fedclust import report


def summary(alg, seed, acc, label=None, **extra):
    s = {"algorithm": alg, "seed": seed, "final_accuracy": acc, "best_accuracy": acc + 1.0,
         "neighbor_precision": None, "neighbor_recall": None, "num_clusters": 2, "ari": 1.0,
         "models_received_per_client": 1500.0, "max_models_received_per_round": 5.0, "mean_round_seconds": 2.0}
    if label:
        s["label"] = label
    s.update(extra)
    return s


def test_table_groups_by_label_and_compares_with_paper():
    runs = [summary("random", 0, 85.0), summary("random", 1, 86.0),
            summary("pens", 0, 80.0, label="pens[drawn_and_selected]"), summary("pens", 0, 84.0),
            summary("ifca", 0, 86.5, models_received_per_client=300.0, max_models_received_per_round=200.0)]
    rows = report.table(runs).splitlines()[2:]
    assert [r.split(" | ")[0] for r in rows] == ["| random", "| pens", "| pens[drawn_and_selected]", "| ifca"]
    random = rows[0].split(" | ")
    assert random[1:5] == ["2", "85.50 ±0.71", "85.94 ±0.27", "-0.44"]   # mean, sample std, paper, diff
    variant = rows[2].split(" | ")
    assert variant[3:5] == ["86.82 ±0.11", "-6.82"]                      # compared with the paper's PENS
    ifca = rows[3].split(" | ")
    assert ifca[3] == "" and ifca[10:12] == ["300", "200"]


def test_main_reads_run_directories(tmp_path, capsys):
    for name, s in (("a", summary("local", 0, 74.0)), ("b", summary("oracle", 0, 86.0))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(s))
    assert report.main([str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "missing")]) == 0
    out = capsys.readouterr().out
    assert "| local | 1 | 74.00 ±0.00 | 76.24 ±0.22 | -2.24 |" in out and "| oracle |" in out
    assert report.main([str(tmp_path / "missing")]) == 2


def test_mean_curves_average_seeds_by_hand(tmp_path):
    runs = []
    for seed, accs in ((0, [50.0, 60.0, 70.0]), (1, [52.0, 64.0])):   # seed 1 stopped after round 2
        d = tmp_path / f"oracle-s{seed}"
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps({"round": t + 1, "accuracy": a}) + "\n"
                                                 for t, a in enumerate(accs)))
        runs.append(dict(summary("oracle", seed, accs[-1]), _dir=str(d)))
    got = report.mean_curves(runs)
    assert got == {"oracle": ([1, 2], [51.0, 62.0], 2)}
    report.curves(runs, tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 0


def test_paper_column_follows_the_setting_and_settings_are_not_mixed():
    runs = [summary("fpfc", 0, 88.0, data="synthetic", data_clusters="rotation", true_clusters=4),
            summary("panm_grad", 0, 84.0, data="fmnist", data_clusters="rotation", true_clusters=4),
            summary("panm_grad", 0, 85.0, data="fmnist", data_clusters="rotation", true_clusters=2),
            summary("panm_grad", 1, 86.0)]                     # no setting: papers/001's, 2 rotations
    rows = [r.split(" | ") for r in report.table(runs).splitlines()[2:]]
    assert [r[0] for r in rows] == ["| panm_grad (fmnist rotation x2)", "| panm_grad (fmnist rotation x4)",
                                    "| fpfc (synthetic 4 clusters)"]
    assert rows[0][1:5] == ["2", "85.50 ±0.71", "86.88 ±0.34", "-1.38"]
    assert rows[1][3:5] == ["", ""]                           # no paper number for 4 rotations
    assert rows[2][3:5] == ["89.46 ±0.04", "-1.46"]           # papers/004 Table 1


def test_load_runs_reads_the_setting_from_config_of_older_runs(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps(summary("local", 0, 70.0)))
    (d / "config.yaml").write_text("data:\n  name: fmnist\n  clusters: rotation\n  num_clusters: 4\n")
    assert report.setting(report.load_runs([d])[0]) == ("fmnist", "rotation", 4)
