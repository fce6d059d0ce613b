"""fedclust report: rows = labels, columns = settings, one table per metric, from run directories written
by hand; every number checked against means and sample stds computed here with statistics/numpy."""

import csv
import io
import json
import statistics

import numpy as np
import pytest
import yaml
from pathlib import Path

from fedclust import report

FMNIST2 = dict(data="fmnist", data_clusters="rotation", true_clusters=2)
CIFAR4 = dict(data="cifar10", data_clusters="rotation", true_clusters=4)
SYN4 = dict(data="synthetic", data_clusters="rotation", true_clusters=4)   # data.clusters does not apply


def summary(alg, seed, acc, label=None, setting=FMNIST2, **extra):
    peer = alg not in ("local", "fedavg", "ifca", "fpfc")
    s = {"algorithm": alg, "label": label or alg, **setting, "seed": seed, "final_accuracy": acc,
         "best_accuracy": acc + 1.0, "neighbor_precision": 0.9 + seed / 100 if peer else None,
         "neighbor_recall": 0.8 + seed / 50 if peer else (0.0 if alg == "local" else None),
         "num_clusters": 2, "ari": 0.5 + seed / 10 if alg != "local" else None,
         "models_received_per_client": 1000.0 + 10 * seed, "max_models_received_per_round": 5.0,
         "mean_round_seconds": 2.0}
    s.update(extra)
    return s


# The papers' settings (SPEC sections 2, 3, 7; configs/synthetic_cluster4.yaml): clients, rounds, train size
PAPER = {"synthetic": dict(clients=100, rounds=200, train_size=100), "other": dict(clients=100, rounds=300,
                                                                                    train_size=200)}


def config_of(s, **changes):
    """The config.yaml of a run of summary ``s`` in the paper's setting of its data set, with ``changes``
    (clients, rounds, train_size, model, stage1_rounds)."""
    keys = dict(PAPER["synthetic" if s.get("data") == "synthetic" else "other"], model="auto", stage1_rounds=100)
    keys.update(changes)
    return {"algorithm": {"name": s["algorithm"], "k": 5, "l": 10},
            "data": {"name": s.get("data", "fmnist"), "clusters": s.get("data_clusters", "rotation"),
                     "num_clusters": s.get("true_clusters", 2), "train_size": keys.pop("train_size"),
                     "test_size": 100},
            "model": keys.pop("model"), **keys, "seed": s["seed"]}


def write_run(root, name, s, accs=None, config=None, lines=None):
    """A run directory: summary.json, config.yaml (``config``, else the paper's setting; False: none) and
    metrics.jsonl (``lines`` as given, else one record per accuracy of ``accs``)."""
    d = root / name
    d.mkdir()
    (d / "summary.json").write_text(json.dumps(s))
    if config is not False:
        (d / "config.yaml").write_text(yaml.safe_dump(config or config_of(s), sort_keys=False))
    accs = accs or [s["final_accuracy"] - 10, s["final_accuracy"]]
    if lines is None:
        lines = [json.dumps({"round": t + 1, "accuracy": a}) for t, a in enumerate(accs)]
    (d / "metrics.jsonl").write_text("".join(x + "\n" for x in lines))
    return str(d)


def run_report(capsys, args):
    rc = report.main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def md_table(text, title):
    """The rows (lists of cells) of the Markdown table under the line starting **title**."""
    lines = text.splitlines()
    i = next(n for n, x in enumerate(lines) if x.startswith(f"**{title}**"))
    rows = []
    for x in lines[i + 2:]:
        if not x.startswith("|"):
            break
        rows.append([c.strip() for c in x.strip().strip("|").split("|")])
    return rows[0], {r[0]: r[1:] for r in rows[2:]}


def ms(xs, digits=2):
    return f"{statistics.fmean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


ACC = {("panm_grad", "f"): [85.0, 86.0, 87.5], ("local", "f"): [74.0, 75.5, 76.0],
       ("local", "s"): [84.0, 85.0], ("fpfc", "s"): [88.0, 89.0, 89.5], ("panm_grad", "c"): [48.0]}
SETTINGS = {"f": FMNIST2, "s": SYN4, "c": CIFAR4}


@pytest.fixture
def grid(tmp_path):
    dirs = []
    for (alg, st), accs in ACC.items():
        for seed, a in enumerate(accs):
            dirs.append(write_run(tmp_path, f"{alg}-{st}-s{seed}", summary(alg, seed, a, setting=SETTINGS[st]),
                                  accs=[a - 20 + seed, a - 5, a]))
    return dirs


def test_markdown_rows_are_labels_columns_are_settings(grid, capsys):
    rc, out, _ = run_report(capsys, grid)
    assert rc == 0
    head, rows = md_table(out, "Final accuracy (%)")
    assert head == ["method", "seeds", "fmnist, rotation 2", "paper", "cifar10, rotation 4",
                    "synthetic, 4 clusters", "paper"]
    assert list(rows) == ["local", "panm_grad", "fpfc"]                      # report_position order
    local, panm, fpfc = rows["local"], rows["panm_grad"], rows["fpfc"]
    assert local == ["2–3", ms(ACC["local", "f"]) + " (n=3)", "76.24 ± 0.22", "",
                     ms(ACC["local", "s"]) + " (n=2)", "84.97 ± 0.06"]     # each paper in its own setting
    assert panm == ["1–3", ms(ACC["panm_grad", "f"]) + " (n=3)", "86.88 ± 0.34", "48.00 (n=1)", "", ""]
    assert fpfc == ["3", "", "", "", ms(ACC["fpfc", "s"]), "89.46 ± 0.04"]
    # neighbour precision: blank for labels without neighbours; local's recall of 0 (empty lists) too
    head, prec = md_table(out, "Neighbour precision")
    assert head == ["method", "seeds", "fmnist, rotation 2", "cifar10, rotation 4", "synthetic, 4 clusters"]
    assert prec["local"][1:] == ["", "", ""] and prec["fpfc"][1:] == ["", "", ""]
    assert prec["panm_grad"][1] == ms([0.90, 0.91, 0.92], 3) + " (n=3)"
    _, rec = md_table(out, "Neighbour recall")
    assert rec["local"][1:] == ["", "", ""] and rec["panm_grad"][1] == ms([0.80, 0.82, 0.84], 3) + " (n=3)"
    _, ari = md_table(out, "Adjusted Rand index of the clusters found")
    assert ari["local"][1:] == ["", "", ""] and ari["fpfc"][3] == ms([0.5, 0.6, 0.7], 3)
    _, comm = md_table(out, "Models received per client (whole run)")
    assert comm["local"][1:] == ["1010 ± 10 (n=3)", "", "1005 ± 7 (n=2)"]
    assert "Best accuracy" not in out and "Seconds per round" not in out   # not among the default metrics


def test_csv_is_tidy_and_matches_numpy(grid, capsys):
    rc, out, _ = run_report(capsys, grid + ["--format", "csv", "--metrics", "final_accuracy,neighbor_recall,ari"])
    assert rc == 0
    recs = list(csv.DictReader(io.StringIO(out)))
    assert list(recs[0]) == ["label", "setting", "metric", "mean", "std", "seeds"]
    got = {(r["label"], r["setting"], r["metric"]): r for r in recs}
    names = {"f": "fmnist, rotation 2", "s": "synthetic, 4 clusters", "c": "cifar10, rotation 4"}
    for (alg, st), accs in ACC.items():
        r = got[alg, names[st], "final_accuracy"]
        assert float(r["mean"]) == pytest.approx(np.mean(accs)) and int(r["seeds"]) == len(accs)
        assert r["std"] == "" if len(accs) == 1 else float(r["std"]) == pytest.approx(np.std(accs, ddof=1))
    r = got["fpfc", "synthetic, 4 clusters", "ari"]
    assert (float(r["mean"]), float(r["std"]), r["seeds"]) == (pytest.approx(0.6), pytest.approx(0.1), "3")
    assert ("local", "fmnist, rotation 2", "neighbor_recall") not in got          # none: no line
    assert ("local", "fmnist, rotation 2", "ari") not in got
    paper = {(k[0], k[1]): (r["mean"], r["std"]) for k, r in got.items() if k[2] == "paper_final_accuracy"}
    assert paper == {("local", "fmnist, rotation 2"): ("76.24", "0.22"), ("panm_grad", "fmnist, rotation 2"):
                     ("86.88", "0.34"), ("local", "synthetic, 4 clusters"): ("84.97", "0.06"),
                     ("fpfc", "synthetic, 4 clusters"): ("89.46", "0.04")}


def test_latex_tabular_escapes_labels(tmp_path, capsys):
    accs = [85.0, 86.0, 87.5]
    dirs = [write_run(tmp_path, f"s{i}", summary("panm_grad", i, a, label="panm_grad [em_variance=tied]"))
            for i, a in enumerate(accs)]
    dirs.append(write_run(tmp_path, "loc", summary("local", 0, 74.0)))
    rc, out, _ = run_report(capsys, dirs + ["--format", "latex"])
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("% Final accuracy (%)") and lines[1] == r"\begin{tabular}{llcc}"
    assert lines[3] == r"method & seeds & fmnist, rotation 2 & paper \\"
    m, s = np.mean(accs), np.std(accs, ddof=1)
    assert rf"panm\_grad [em\_variance=tied] & 3 & ${m:.2f} \pm {s:.2f}$ & $86.88 \pm 0.34$ \\" in lines
    assert r"local & 1 & $74.00$ & $76.24 \pm 0.22$ \\" in lines
    assert out.count(r"\begin{tabular}") == out.count(r"\end{tabular}") == 5


def test_a_synthetic_run_never_shows_the_fmnist_paper_number(tmp_path, capsys):
    dirs = [write_run(tmp_path, "syn", summary("local", 0, 80.0, setting=SYN4))]
    old = tmp_path / "old"                                   # from before summary.json named the setting
    write_run(tmp_path, "old", {k: v for k, v in summary("local", 1, 82.0).items()
                                if k not in ("data", "data_clusters", "true_clusters")})
    (old / "config.yaml").write_text("data:\n  name: synthetic\n  num_clusters: 4\n  train_size: 100\n"
                                     "clients: 100\nrounds: 200\n")        # the FPFC paper's setting
    for fmt in ("markdown", "csv", "latex"):
        rc, out, _ = run_report(capsys, dirs + [old, "--format", fmt])
        assert rc == 0 and "76.24" not in out and "84.97" in out and "fmnist" not in out
    _, out, _ = run_report(capsys, dirs + [old])
    assert md_table(out, "Final accuracy (%)")[1]["local"] == ["2", ms([80.0, 82.0]), "84.97 ± 0.06"]
    # a run that names no setting at all (no fields, no config.yaml) gets no paper number
    bare = write_run(tmp_path, "bare", {k: v for k, v in summary("local", 0, 70.0).items()
                                        if k not in ("data", "data_clusters", "true_clusters")}, config=False)
    _, out, _ = run_report(capsys, [bare])
    assert md_table(out, "Final accuracy (%)") == (["method", "seeds", "setting unknown"],
                                                   {"local": ["1", "70.00"]})


def test_other_settings_get_no_paper_column(tmp_path, capsys):
    dirs = [write_run(tmp_path, "a", summary("panm_grad", 0, 84.0, setting=dict(FMNIST2, true_clusters=4))),
            write_run(tmp_path, "b", summary("panm_grad", 0, 84.0, setting=dict(FMNIST2, data_clusters="label_swap")))]
    _, out, _ = run_report(capsys, dirs)
    assert md_table(out, "Final accuracy (%)")[0] == ["method", "seeds", "fmnist, rotation 4", "fmnist, label swap 2"]
    assert "86.88" not in out and "paper:" not in out


def test_curves_png_mean_and_band_by_hand(grid, tmp_path, capsys):
    png = tmp_path / "c.png"
    assert run_report(capsys, grid + ["--curves", png])[0] == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(str(png)).ndim == 3
    runs = report.load_runs(grid)
    got = report.mean_curves(runs)
    syn = report.Setting("synthetic", None, 4, 100, 200, 100, "logreg")
    assert list(got) == [report.Setting("fmnist", "rotation", 2, 100, 300, 200, "mlp"),
                         report.Setting("cifar10", "rotation", 4, 100, 300, 200, "cnn"), syn]
    rounds, mean, low, high, seeds = got[syn]["fpfc"]
    first = [a - 20 + s for s, a in enumerate(ACC["fpfc", "s"])]
    assert rounds == [1, 2, 3] and seeds == 3
    assert mean[0] == pytest.approx(np.mean(first)) and mean[2] == pytest.approx(np.mean(ACC["fpfc", "s"]))
    assert high[0] - mean[0] == pytest.approx(np.std(first, ddof=1)) == pytest.approx(mean[0] - low[0])
    _, _, low, high, _ = report.mean_curves(runs, band="minmax")[syn]["fpfc"]
    assert (low[0], high[0]) == (min(first), max(first))
    assert run_report(capsys, grid + ["--curves", tmp_path / "m.png", "--band", "minmax"])[0] == 0


def test_mean_curves_on_the_rounds_every_seed_evaluated(tmp_path):
    runs = []
    for seed, accs in ((0, [50.0, 60.0, 70.0]), (1, [52.0, 64.0])):   # seed 1 stopped after round 2
        runs.append(report.load_run(write_run(tmp_path, f"o{seed}", summary("oracle", seed, accs[-1]), accs)))
    rounds, mean, _, _, seeds = report.mean_curves(runs)[report.Setting("fmnist", "rotation", 2, 100, 300, 200, "mlp")]["oracle"]
    assert (rounds, mean, seeds) == ([1, 2], [51.0, 62.0], 2)


def test_unfinished_runs_are_skipped_with_a_warning_or_refused_with_strict(tmp_path, capsys):
    done = write_run(tmp_path, "done", summary("fedavg", 0, 30.0))
    (tmp_path / "running").mkdir()
    (tmp_path / "submitted.jsonl").write_text("{}\n")
    rc, out, err = run_report(capsys, [done, tmp_path / "running", tmp_path / "submitted.jsonl"])
    assert rc == 0 and "| fedavg | 1 | 30.00 |" in out
    assert f"warning: {tmp_path / 'running'}: no summary.json: the run has not finished" in err
    assert "same out=" in err and "submitted.jsonl: a file" in err
    rc, out, err = run_report(capsys, [done, tmp_path / "running", "--strict"])
    assert rc == 2 and out == "" and f"error: {tmp_path / 'running'}: no summary.json" in err
    rc, _, err = run_report(capsys, [done, tmp_path / "missing"])
    assert rc == 2 and "missing: no such run directory" in err
    rc, _, err = run_report(capsys, [tmp_path / "running"])
    assert rc == 2 and "no finished run" in err


def test_main_with_a_list_prints_the_markdown_table(tmp_path, capsys):
    """launch.submit calls report.main(list_of_dirs) and looks for '| fedavg | 1 |'."""
    dirs = [write_run(tmp_path, a, summary(a, 0, acc, setting=SYN4)) for a, acc in (("local", 81.0), ("fedavg", 30.0))]
    assert report.main(dirs) == 0
    out = capsys.readouterr().out
    assert "| fedavg | 1 | 30.00 | 30.35 ± 0.05 |" in out and "| local | 1 | 81.00 | 84.97 ± 0.06 |" in out


def test_variant_labels_compare_with_their_algorithm_and_repeated_seeds_warn(tmp_path, capsys):
    dirs = [write_run(tmp_path, "a", summary("pens", 0, 80.0, label="pens[drawn_and_selected]")),
            write_run(tmp_path, "b", summary("pens", 0, 84.0)), write_run(tmp_path, "c", summary("pens", 0, 85.0))]
    rc, out, err = run_report(capsys, dirs)
    rows = md_table(out, "Final accuracy (%)")[1]
    assert rows["pens"] == ["2", ms([84.0, 85.0]), "86.82 ± 0.11"]
    assert rows["pens[drawn_and_selected]"] == ["1", "80.00", "86.82 ± 0.11"]
    assert "pens (fmnist, rotation 2) has seed 0 more than once" in err


def test_load_runs_reads_the_setting_from_config_of_older_runs(tmp_path):
    d = tmp_path / "old"
    d.mkdir()
    s = {k: v for k, v in summary("local", 0, 70.0).items() if k not in ("data", "data_clusters", "true_clusters")}
    (d / "summary.json").write_text(json.dumps(s))
    (d / "config.yaml").write_text("data:\n  name: fmnist\n  clusters: rotation\n  num_clusters: 4\n")
    # the keys config.yaml lacks take their defaults: 100 clients, 300 rounds, 200 images, model auto = mlp
    assert report.setting(report.load_runs([d])[0]) == ("fmnist", "rotation", 4, 100, 300, 200, "mlp", None, None,
                                                         None, None, ())


def test_unknown_metric_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        report.main([write_run(tmp_path, "a", summary("local", 0, 70.0)), "--metrics", "accuracy"])
    assert "unknown metric accuracy" in capsys.readouterr().err


# ---------------------------------------------------------------- like with like

def test_a_small_run_never_shows_the_papers_number_and_says_how_it_differs(tmp_path, capsys):
    s = summary("panm_grad", 0, 61.5)
    d = write_run(tmp_path, "small", s, config=config_of(s, clients=8, rounds=2, stage1_rounds=1))
    for fmt in ("markdown", "csv", "latex"):
        rc, out, _ = run_report(capsys, [d, "--format", fmt])
        assert rc == 0 and "86.88" not in out and "fmnist, rotation 2, 8 clients, 2 rounds" in out
    _, out, _ = run_report(capsys, [d])
    head, rows = md_table(out, "Final accuracy (%)")
    assert head == ["method", "seeds", "fmnist, rotation 2, 8 clients, 2 rounds"]
    assert rows["panm_grad"] == ["1", "61.50"]
    assert "paper:" not in out


def test_runs_of_4_and_12_rounds_are_never_averaged(tmp_path, capsys):
    runs = []
    for seed, (rounds, acc) in enumerate(((4, 60.0), (12, 70.0), (12, 71.0))):
        s = summary("local", seed, acc)
        runs.append(write_run(tmp_path, f"r{seed}", s, config=config_of(s, clients=8, rounds=rounds)))
    rc, out, _ = run_report(capsys, runs)
    head, rows = md_table(out, "Final accuracy (%)")
    assert head == ["method", "seeds", "fmnist, rotation 2, 8 clients, 4 rounds",
                    "fmnist, rotation 2, 8 clients, 12 rounds"]
    assert rows["local"] == ["1–2", "60.00 (n=1)", ms([70.0, 71.0]) + " (n=2)"]   # not the mean 67.00 of all


def test_train_size_and_model_split_settings_and_auto_is_the_data_sets_model(tmp_path, capsys):
    def run(name, acc, seed, **changes):
        s = summary("local", seed, acc, setting=SYN4)
        return write_run(tmp_path, name, s, config=config_of(s, **changes))

    dirs = [run("auto", 84.0, 0, model="auto"), run("logreg", 85.0, 1, model="logreg"),   # auto is logreg here
            run("mlp", 90.0, 0, model="mlp"), run("small", 70.0, 0, train_size=50)]
    rc, out, _ = run_report(capsys, dirs)
    head, rows = md_table(out, "Final accuracy (%)")
    assert head == ["method", "seeds", "synthetic, 4 clusters", "paper", "synthetic, 4 clusters, train size 50",
                    "synthetic, 4 clusters, model mlp"]
    assert rows["local"] == ["1–2", ms([84.0, 85.0]) + " (n=2)", "84.97 ± 0.06", "70.00 (n=1)", "90.00 (n=1)"]


def test_a_run_without_config_yaml_names_what_it_does_not_record_and_gets_no_paper_number(tmp_path, capsys):
    s = summary("local", 0, 75.0, clients=100, rounds_completed=300)
    rc, out, _ = run_report(capsys, [write_run(tmp_path, "nocfg", s, config=False)])
    head, rows = md_table(out, "Final accuracy (%)")
    assert head == ["method", "seeds", "fmnist, rotation 2, train size, model not recorded"]
    assert rows["local"] == ["1", "75.00"] and "76.24" not in out


# ---------------------------------------------------------------- spread at its precision

def test_a_non_zero_std_never_prints_as_zero(tmp_path, capsys):
    comm = [1000.0, 1000.3, 1000.5]      # sample std 0.2517: '± 0' at the metric's 0 digits
    accs = [85.000, 85.004, 85.008]      # sample std 0.004: '± 0.00' at 2 digits
    dirs = [write_run(tmp_path, f"s{i}", summary("panm_grad", i, a, models_received_per_client=c))
            for i, (a, c) in enumerate(zip(accs, comm))]
    assert statistics.stdev(comm) == pytest.approx(0.2517, abs=1e-4)
    assert statistics.stdev(accs) == pytest.approx(0.004)
    _, out, _ = run_report(capsys, dirs)
    assert md_table(out, "Models received per client (whole run)")[1]["panm_grad"][1] == "1000.3 ± 0.3"
    assert md_table(out, "Final accuracy (%)")[1]["panm_grad"][1] == "85.004 ± 0.004"
    assert md_table(out, "Final accuracy (%)")[1]["panm_grad"][2] == "86.88 ± 0.34"    # the paper's, 2 digits
    # decimals: the metric's digits, or the std's first significant digit where that is further right
    assert [report.decimals(x, d) for x, d in ((0.27, 0), (0.0049, 2), (0.096, 2), (7.07, 0), (0.0, 2), (None, 1))] \
        == [1, 3, 2, 0, 2, 1]
    assert report._number(12.3456, 0.0123, 1) == "12.35 ± 0.01"


# ---------------------------------------------------------------- curves: bad lines, ticks, stage two

def test_curves_skip_a_garbled_and_a_cut_line_naming_file_and_line(tmp_path, capsys):
    lines = [json.dumps({"round": 1, "accuracy": 50.0}), "garbage}}}", json.dumps({"round": 3, "accuracy": 70.0}),
             '{"round": 4, "accur']                                       # a job killed mid-write
    d = write_run(tmp_path, "bad", summary("local", 0, 70.0), lines=lines)
    png = tmp_path / "c.png"
    rc, out, err = run_report(capsys, [d, "--curves", png])
    metrics = tmp_path / "bad" / "metrics.jsonl"
    assert rc == 0 and png.stat().st_size > 0 and "| local | 1 | 70.00 |" in out
    assert f"warning: {metrics} line 2: not valid JSON" in err and f"warning: {metrics} line 4: not valid JSON" in err
    assert "line 1:" not in err and "line 3:" not in err and "same out=" in err
    warned = []
    got = report.mean_curves(report.load_runs([d]), warn=warned.append)
    rounds, mean, *_ = next(iter(got.values()))["local"]
    assert (rounds, mean) == ([1, 3], [50.0, 70.0]) and len(warned) == 2


def test_curves_have_whole_round_ticks_and_mark_stage_two_of_two_stage_methods(tmp_path, capsys):
    dirs = []
    for alg, seed, accs in (("panm_grad", 0, [50.0, 55.0, 60.0, 62.0, 63.0]), ("panm_grad", 1, [51.0, 56.0, 61.0,
                            63.0, 64.0]), ("local", 0, [40.0, 45.0, 47.0, 48.0, 49.0])):
        s = summary(alg, seed, accs[-1])
        dirs.append(write_run(tmp_path, f"{alg}{seed}", s, accs, config=config_of(s, clients=8, rounds=5,
                                                                                 stage1_rounds=2)))
    fig = report.curves(report.load_runs(dirs), tmp_path / "c.png")
    ax = fig.axes[0]
    ticks = ax.get_xticks()
    assert len(ticks) >= 2 and all(t == int(t) for t in ticks)
    dashed = [x for x in ax.get_lines() if x.get_linestyle() == "--"]
    # one line, halfway between round 2 (last of stage one) and round 3; only panm_grad has stages
    assert len(dashed) == 1 and list(dashed[0].get_xdata()) == [2.5, 2.5]
    assert dashed[0].get_label() == "stage two from round 3 (panm_grad)"
    mean = [x for x in ax.get_lines() if x.get_label().startswith("panm_grad (2 seeds)")][0]
    assert list(mean.get_ydata()) == [50.5, 55.5, 60.5, 62.5, 63.5]
    # legend below the panel: it covers no curve
    legend = ax.get_legend().get_window_extent()
    assert legend.y1 <= ax.get_window_extent().y0
    # a one-stage method (local) alone: no line
    fig = report.curves(report.load_runs(dirs[2:]), tmp_path / "l.png")
    assert not [x for x in fig.axes[0].get_lines() if x.get_linestyle() == "--"]


def test_a_config_yaml_with_a_bad_value_is_passed_over_naming_file_and_key(tmp_path, capsys):
    good = write_run(tmp_path, "good", summary("local", 0, 70.0))
    s = summary("local", 1, 99.0)
    bad = write_run(tmp_path, "bad", s, config=dict(config_of(s), rounds="many"))
    rc, out, err = run_report(capsys, [good, bad])
    assert rc == 0 and md_table(out, "Final accuracy (%)")[1]["local"] == ["1", "70.00", "76.24 ± 0.22"]
    assert f"warning: {tmp_path / 'bad' / 'config.yaml'}: rounds is 'many', not a whole number" in err
    rc, _, err = run_report(capsys, [good, bad, "--strict"])
    assert rc == 2 and "rounds is 'many'" in err


def test_final_accuracy_gives_each_methods_gap_to_random_beside_the_papers(tmp_path, capsys):
    """Gaps by hand: panm_grad (85.0, 86.0, 87.5) minus random (84.0, 85.0) = 86.1667 - 84.5 = +1.67; the paper's
    PANMGrad 86.88 minus its Random 85.94 = +0.94; Local's paper gap 76.24 - 85.94 = -9.70.  A setting without
    Random (cifar10 here) gets no gap column; Random's own row has no gap."""
    accs = {("panm_grad", "f"): [85.0, 86.0, 87.5], ("random", "f"): [84.0, 85.0], ("local", "f"): [74.0],
            ("panm_grad", "c"): [48.0]}
    dirs = [write_run(tmp_path, f"{alg}-{st}-s{seed}", summary(alg, seed, a, setting=SETTINGS[st]))
            for (alg, st), xs in accs.items() for seed, a in enumerate(xs)]
    rc, out, _ = run_report(capsys, dirs)
    assert rc == 0
    head, rows = md_table(out, "Final accuracy (%)")
    assert head == ["method", "seeds", "fmnist, rotation 2", "vs random", "paper", "paper vs random",
                    "cifar10, rotation 4"]
    assert rows["panm_grad"][1:] == [ms([85.0, 86.0, 87.5]) + " (n=3)", "+1.67", "86.88 ± 0.34", "+0.94",
                                     "48.00 (n=1)"]
    assert rows["random"][1:5] == [ms([84.0, 85.0]), "", "85.94 ± 0.27", ""]
    assert rows["local"][1:5] == ["74.00", "-10.50", "76.24 ± 0.22", "-9.70"]
    rc, out, _ = run_report(capsys, dirs + ["--format", "csv", "--metrics", "final_accuracy"])
    recs = {(r["label"], r["setting"], r["metric"]): float(r["mean"]) for r in csv.DictReader(io.StringIO(out))}
    assert recs["panm_grad", "fmnist, rotation 2", "gap_to_random"] == pytest.approx(86.1666667 - 84.5)
    assert recs["panm_grad", "fmnist, rotation 2", "paper_gap_to_random"] == pytest.approx(86.88 - 85.94)
    assert ("random", "fmnist, rotation 2", "gap_to_random") not in recs
    assert ("panm_grad", "cifar10, rotation 4", "gap_to_random") not in recs


def test_unequal_clusters_and_other_angles_are_their_own_setting_without_the_papers_number(tmp_path, capsys):
    four = dict(data="fmnist", data_clusters="rotation", true_clusters=4)
    runs = []
    for seed, (acc, layout) in enumerate(((80.0, {}), (70.0, {"cluster_sizes": [70, 20, 5, 5],
                                                               "rotations": [0, 180, 10, 350.5]}))):
        s = summary("panm_grad", seed, acc, setting=four)
        cfg = config_of(s)
        cfg["data"].update(layout)
        runs.append(write_run(tmp_path, f"r{seed}", s, config=cfg))
    rc, out, _ = run_report(capsys, runs)
    head, rows = md_table(out, "Final accuracy (%)")
    assert rc == 0 and "fmnist, rotation 4, sizes 70/20/5/5, angles 0/180/10/350.5" in head
    other = "fmnist, rotation 4, sizes 70/20/5/5, angles 0/180/10/350.5"
    assert rows["panm_grad"][head.index(other) - 1] == "70.00"
    assert rows["panm_grad"][head.index("fmnist, rotation 4") - 1] == "80.00"   # never averaged together
    assert report.paper_numbers(report.setting(report.load_run(runs[1]))) == {}


def test_the_worst_clusters_accuracy_is_a_metric(tmp_path, capsys):
    runs = [write_run(tmp_path, f"r{seed}", summary("dac", seed, 80.0 + seed, worst_cluster_accuracy=60.0 + seed))
            for seed in range(2)]
    rc, out, _ = run_report(capsys, runs + ["--metrics", "final_accuracy,worst_cluster_accuracy"])
    head, rows = md_table(out, "Accuracy of the worst cluster (%)")
    assert rc == 0 and rows["dac"][1] == ms([60.0, 61.0])


# ---------------------------------------------------------------- files, options and models of one's own

NPZ2 = dict(data="npz", data_clusters="rotation", true_clusters=2)
FILE_A, FILE_B, FP_1, FP_2 = "a1" * 32, "b2" * 32, "c3" * 32, "d4" * 32


def _own(tmp_path, name, acc, seed, setting=NPZ2, options=None, model="auto", **extra):
    s = summary("local", seed, acc, setting=setting, **extra)
    cfg = config_of(s, model=model)
    if options is not None:
        cfg["data"]["options"] = options
    return write_run(tmp_path, name, s, config=cfg)


def test_runs_on_different_data_files_are_never_averaged_and_the_header_names_the_file(tmp_path, capsys):
    dirs = [_own(tmp_path, "a0", 70.0, 0, data_sha256=FILE_A), _own(tmp_path, "a1", 72.0, 1, data_sha256=FILE_A),
            _own(tmp_path, "b0", 90.0, 0, data_sha256=FILE_B)]
    _, out, _ = run_report(capsys, dirs)
    head, rows = md_table(out, "Final accuracy (%)")
    assert head == ["method", "seeds", "npz, rotation 2, npz a1a1a1a1", "npz, rotation 2, npz b2b2b2b2"]
    assert rows["local"] == ["1–2", ms([70.0, 72.0]) + " (n=2)", "90.00 (n=1)"]     # not the mean of all three
    _, out, _ = run_report(capsys, dirs[:2])                                         # one file: the header as ever
    assert md_table(out, "Final accuracy (%)")[0] == ["method", "seeds", "npz, rotation 2"]


def test_two_user_models_of_one_name_are_two_settings_headed_by_their_fingerprints(tmp_path, capsys):
    net, other = "/home/me/my_model.py:Net", "/home/me/my_model.py:Other"
    dirs = [_own(tmp_path, "n1", 80.0, 0, FMNIST2, model=net, model_fingerprint=FP_1),
            _own(tmp_path, "n2", 85.0, 0, FMNIST2, model=net, model_fingerprint=FP_2),
            _own(tmp_path, "o", 60.0, 0, FMNIST2, model=other, model_fingerprint=FP_1)]
    _, out, _ = run_report(capsys, dirs)
    head, rows = md_table(out, "Final accuracy (%)")
    assert head == ["method", "seeds", "fmnist, rotation 2, model my_model.py:Net (c3c3c3c3)",
                    "fmnist, rotation 2, model my_model.py:Net (d4d4d4d4)", "fmnist, rotation 2, model my_model.py:Other"]
    assert rows["local"] == ["1", "80.00", "85.00", "60.00"]
    # a data set without a paper setting names the model only where its runs differ in it
    dirs = [_own(tmp_path, "p", 70.0, 0, model="a/x.py:Net", model_fingerprint=FP_1),
            _own(tmp_path, "q", 71.0, 0, model="b/y.py:Net", model_fingerprint=FP_2)]
    _, out, _ = run_report(capsys, dirs)
    assert md_table(out, "Final accuracy (%)")[0] == ["method", "seeds", "npz, rotation 2, model x.py:Net",
                                                      "npz, rotation 2, model y.py:Net"]


def test_runs_of_other_data_options_are_other_settings(tmp_path, capsys):
    emnist = dict(data="torchvision:EMNIST", data_clusters="rotation", true_clusters=2)
    dirs = [_own(tmp_path, "b", 80.0, 0, emnist, options={"split": "balanced"}),
            _own(tmp_path, "l", 90.0, 0, emnist, options={"split": "letters"})]
    _, out, _ = run_report(capsys, dirs)
    head, rows = md_table(out, "Final accuracy (%)")
    assert head == ["method", "seeds", "torchvision:EMNIST, rotation 2, options split=balanced",
                    "torchvision:EMNIST, rotation 2, options split=letters"]
    assert rows["local"] == ["1", "80.00", "90.00"]
    _, out, _ = run_report(capsys, dirs + ["--format", "csv"])
    assert "torchvision:EMNIST, rotation 2, options split=letters" in out


def test_older_runs_without_the_new_fields_load_as_not_recorded(tmp_path, capsys):
    spec = "/home/me/my_model.py:Net"
    dirs = [_own(tmp_path, "old", 70.0, 0),                                     # no data_sha256: from before it
            _own(tmp_path, "new", 71.0, 0, data_sha256=FILE_A),
            _own(tmp_path, "m_old", 60.0, 0, FMNIST2, model=spec, model_source_sha256=FILE_B),   # the file's hash
            _own(tmp_path, "m_none", 61.0, 0, FMNIST2, model=spec),
            _own(tmp_path, "m_new", 62.0, 0, FMNIST2, model=spec, model_fingerprint=FP_1)]
    rc, out, _ = run_report(capsys, dirs)
    assert rc == 0
    head, rows = md_table(out, "Final accuracy (%)")
    assert head[2:] == ["fmnist, rotation 2, model my_model.py:Net (fingerprint not recorded)",
                        "fmnist, rotation 2, model my_model.py:Net (b2b2b2b2)",
                        "fmnist, rotation 2, model my_model.py:Net (c3c3c3c3)",
                        "npz, rotation 2, npz file not recorded", "npz, rotation 2, npz a1a1a1a1"]
    assert rows["local"][1:] == ["61.00", "60.00", "62.00", "70.00", "71.00"]


# ---------------------------------------------------------------- curves: --metric, many labels, the folder

def test_curves_metric_averages_and_draws_the_chosen_record_field(tmp_path, capsys):
    dirs = []
    for seed, (acc, honest, worst) in enumerate((([50.0, 60.0], [52.0, 63.0], [30.0, 41.0]),
                                                 ([54.0, 62.0], [55.0, 66.0], [34.0, 45.0]))):
        lines = [json.dumps({"round": t + 1, "accuracy": a, "honest_accuracy": h, "worst_cluster_accuracy": w})
                 for t, (a, h, w) in enumerate(zip(acc, honest, worst))]
        dirs.append(write_run(tmp_path, f"r{seed}", summary("panm_grad", seed, acc[-1]), lines=lines))
    runs = report.load_runs(dirs)
    for metric, want, ylabel in (("accuracy", [52.0, 61.0], "mean test accuracy (%)"),
                                 ("honest_accuracy", [53.5, 64.5], "honest clients' accuracy (%)"),
                                 ("worst_cluster_accuracy", [32.0, 43.0], "worst cluster's accuracy (%)")):
        rounds, mean, low, high, seeds = next(iter(report.mean_curves(runs, metric=metric).values()))["panm_grad"]
        assert (rounds, mean, seeds) == ([1, 2], want, 2)
        fig = report.curves(runs, tmp_path / f"{metric}.png", metric=metric)
        ax = fig.axes[0]
        assert ax.get_ylabel() == ylabel
        assert list(ax.get_lines()[0].get_ydata()) == want
    png = tmp_path / "h.png"
    rc, out, err = run_report(capsys, dirs + ["--curves", png, "--metric", "worst_cluster_accuracy"])
    assert rc == 0 and png.stat().st_size > 0 and err == ""


def test_curves_metric_refuses_a_field_no_run_records_and_needs_curves(tmp_path, capsys):
    d = write_run(tmp_path, "old", summary("local", 0, 70.0))      # records accuracy only
    png = tmp_path / "c.png"
    rc, out, err = run_report(capsys, [d, "--curves", png, "--metric", "honest_accuracy"])
    assert rc == 2 and not png.exists() and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("fedclust report: error: no run records honest_accuracy per round")
    assert "left out of the curves" in err                          # the label it passed over is named
    with pytest.raises(SystemExit) as exc:
        report.main([d, "--metric", "honest_accuracy"])
    assert exc.value.code == 2 and "--metric chooses what --curves draws" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        report.main([d, "--curves", str(png), "--metric", "final_accuracy"])   # not a per-round field


def test_curves_of_twelve_labels_stay_apart_with_a_legend_of_two_columns(tmp_path):
    dirs = []
    for i in range(12):   # the first a two-stage method: its stage-two line is the longest legend entry
        s = summary("panm_grad" if i == 0 else "local", 0, 60.0 + i, label=f"panm_grad v{i:02d}" if i == 0 else
                    f"variant{i:02d}")
        dirs.append(write_run(tmp_path, f"v{i}", s, accs=[50.0 + i, 60.0 + i, 62.0 + i],
                              config=config_of(s, clients=8, rounds=3, stage1_rounds=1)))
    fig = report.curves(report.load_runs(dirs), tmp_path / "c.png")
    ax = fig.axes[0]
    lines = [x for x in ax.get_lines() if "seed" in x.get_label()]
    assert len(lines) == 12 and len(fig.axes) == 1
    stage = [x for x in ax.get_lines() if x.get_linestyle() == "--"]
    assert [x.get_label() for x in stage] == ["stage two from round 2\n(panm_grad v00)"]   # broken to fit
    looks = {(tuple(np.round(matplotlib_rgba(x.get_color()), 4)), x.get_linestyle()) for x in lines}
    assert len(looks) == 12                                          # no two labels drawn alike
    assert all(x.get_linestyle() != "--" for x in lines)             # dashed stays the stage-two line's
    legend = ax.get_legend()
    assert legend._ncols == 2 and len(legend.get_texts()) == 13
    assert legend.get_window_extent().y1 <= ax.get_window_extent().y0
    fig.canvas.draw()
    assert legend.get_window_extent().x0 >= 0 and legend.get_window_extent().x1 <= fig.bbox.width
    # fewer than 8: one column of solid lines, as before
    fig = report.curves(report.load_runs(dirs[1:4]), tmp_path / "d.png")
    assert fig.axes[0].get_legend()._ncols == 1 and {x.get_linestyle() for x in fig.axes[0].get_lines()} == {"-"}


def matplotlib_rgba(colour):
    import matplotlib.colors

    return matplotlib.colors.to_rgba(colour)


def test_curves_into_a_folder_that_does_not_exist_makes_it_and_a_bad_path_is_one_line(tmp_path, capsys):
    d = write_run(tmp_path, "r", summary("local", 0, 70.0))
    png = tmp_path / "figs" / "sub" / "c.png"
    rc, _, err = run_report(capsys, [d, "--curves", png])
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and err == ""
    (tmp_path / "file").write_text("not a folder")
    for bad, words in ((tmp_path / "file" / "c.png", "cannot make its folder"),
                       (tmp_path / "c.nosuchformat", "cannot write it")):
        rc, _, err = run_report(capsys, [d, "--curves", bad])
        assert rc == 2 and "Traceback" not in err, err
        assert err.strip().splitlines() == [err.strip().splitlines()[0]]
        assert err.startswith(f"fedclust report: error: --curves {bad}: {words}")


def test_best_test_accuracy_is_each_clients_best_round_read_from_the_records_beside_the_paper(tmp_path, capsys):
    """By hand: PANMGrad's 3 clients over 3 evaluated rounds (a round without evaluation, a round recorded twice
    whose last line counts, a torn last line) reach 80, 75, 90 at their best rounds -> 81.67, though no one round's
    mean passes 73.33; Random's 2 clients 70 and 84 -> 77.0 (a client absent throughout is left out); the paper's
    number beside both and the gap to Random by this reading: +4.67."""
    rows = [{"round": 1, "accuracy": 60.0, "client_accuracy": [50.0, 60.0, 70.0]},
            {"round": 2, "train_loss": 0.4},
            {"round": 3, "accuracy": 99.0, "client_accuracy": [99.0, 99.0, 99.0]},   # replaced below: resumed
            {"round": 3, "accuracy": 73.33, "client_accuracy": [80.0, 50.0, 90.0]},
            {"round": 4, "accuracy": 66.67, "client_accuracy": [60.0, 75.0, 65.0]}]
    lines = [json.dumps(r) for r in rows] + ['{"round": 5, "accuracy": 7']
    panm = write_run(tmp_path, "panm", summary("panm_grad", 0, 66.67), lines=lines)
    rand = write_run(tmp_path, "random", summary("random", 0, 70.0), lines=[
        json.dumps({"round": 1, "client_accuracy": [70.0, 80.0, None]}),
        json.dumps({"round": 2, "client_accuracy": [60.0, 84.0, None]})])
    bare = write_run(tmp_path, "bare", summary("local", 0, 70.0), lines=[json.dumps({"round": 1, "accuracy": 70.0})])
    assert report.best_test_accuracy(Path(panm)) == pytest.approx((80 + 75 + 90) / 3)
    assert report.best_test_accuracy(Path(rand)) == pytest.approx(77.0)
    assert report.best_test_accuracy(Path(bare)) is None            # no per-client accuracies recorded
    assert report.best_test_accuracy(tmp_path / "none") is None
    rc, out, _ = run_report(capsys, [panm, rand, bare, "--metrics", "final_accuracy,best_test_accuracy"])
    assert rc == 0
    head, got = md_table(out, "Mean of each client's best test accuracy over the rounds (%)")
    assert head == ["method", "seeds", "fmnist, rotation 2", "vs random", "paper", "paper vs random"]
    assert got["panm_grad"] == ["1", "81.67", "+4.67", "86.88 ± 0.34", "+0.94"]
    assert got["random"] == ["1", "77.00", "", "85.94 ± 0.27", ""]
    assert got["local"] == ["1", "", "", "76.24 ± 0.22", "-9.70"]
    rc, out, _ = run_report(capsys, [panm, rand, "--format", "csv", "--metrics", "final_accuracy,best_test_accuracy"])
    recs = [(r["label"], r["metric"], float(r["mean"])) for r in csv.DictReader(io.StringIO(out))]
    assert [m for lab, m, _ in recs if lab == "panm_grad"].count("paper_final_accuracy") == 1   # once, not per reading
    assert ("panm_grad", "best_test_accuracy_gap_to_random", pytest.approx(81.6666667 - 77.0)) in recs
    assert ("panm_grad", "gap_to_random", pytest.approx(66.67 - 70.0)) in recs
