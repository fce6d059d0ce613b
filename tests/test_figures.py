"""The run's figures, checked on the matplotlib Figures the plotting functions return: print size, whole-number
round and count ticks, the stage-two line where it belongs, like against like in cni_precision.png, legends
outside the data; and write_run_figures on a metrics.jsonl with bad lines or with the runner's records."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from fedclust import figures


def cfg_of(name="panm_grad", clients=8, clusters=2, k=1, l=2, rounds=4, stage1_rounds=2):
    return SimpleNamespace(algorithm=SimpleNamespace(name=name, k=k, l=l), clients=clients, rounds=rounds,
                           stage1_rounds=stage1_rounds, data=SimpleNamespace(num_clusters=clusters))


def records(rounds=4, stage1_rounds=2, share=True):
    out = []
    for t in range(1, rounds + 1):
        r = {"round": t, "stage": 1 if t <= stage1_rounds else 2, "accuracy": 50.0 + 3 * t, "loss": 2.0 / t,
             "neighbor_precision": 0.5 + 0.1 * t}
        if share:
            r["neighbor_all_same_share"] = 0.125 * t
        out.append(r)
    return out


def dashed(ax):
    return [x for x in ax.get_lines() if x.get_linestyle() == "--"]


def whole(values):
    return len(values) >= 2 and all(float(v) == int(v) for v in values)


def text_sizes(fig):
    """Font sizes (pt) of every visible text of a figure that says something."""
    return [t.get_fontsize() for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_fontsize"))
            if t.get_visible() and t.get_text().strip()]


def below(legend, ax):
    """The legend's box lies wholly under the axes (it covers no data)."""
    return legend.get_window_extent().y1 <= ax.get_window_extent().y0


@pytest.fixture
def capture(monkeypatch):
    """The Figure each plotting function returns, by function name, when write_run_figures calls it."""
    got = {}
    for name in ("accuracy_curves", "heatmap", "similarity_histogram", "neighbor_graph", "cni_precision"):
        original = getattr(figures, name)

        def wrapper(*args, _original=original, _name=name, **kwargs):
            got[_name] = _original(*args, **kwargs)
            return got[_name]

        monkeypatch.setattr(figures, name, wrapper)
    return got


def test_accuracy_has_whole_round_ticks_and_the_stage_two_line(tmp_path):
    recs = records()
    fig = figures.accuracy_curves(recs, tmp_path / "a.png", "t", stage1_rounds=2)
    acc, loss = fig.axes
    assert list(acc.get_lines()[0].get_ydata()) == [53.0, 56.0, 59.0, 62.0]
    assert list(loss.get_lines()[0].get_ydata()) == [2.0, 1.0, 2 / 3, 0.5]
    for ax in (acc, loss):
        assert whole(ax.get_xticks())
        # halfway between round 2, the last of stage one, and round 3, the first of stage two
        assert [list(x.get_xdata()) for x in dashed(ax)] == [[2.5, 2.5]]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["stage two from round 3"]
    assert below(fig.legends[0], loss)
    assert tuple(fig.get_size_inches()) == (3.3, 3.6) and min(text_sizes(fig)) >= 7
    # one stage (stage1_rounds None), or no stage two in view: no line, no legend
    assert not dashed(figures.accuracy_curves(recs, tmp_path / "b.png", "t").axes[0])
    assert not dashed(figures.accuracy_curves(recs, tmp_path / "c.png", "t", stage1_rounds=4).axes[0])


def test_stage_one_rounds_only_for_methods_that_declare_two_stages():
    assert figures.stage_one_rounds("panm_grad", 100) == 100 and figures.stage_one_rounds("pens", 7) == 7
    assert figures.stage_one_rounds("local", 100) is None and figures.stage_one_rounds("fpfc", 100) is None
    assert figures.stage_one_rounds("not_registered_here", 100) is None


def test_heatmap_colour_bar_of_counts_is_ticked_at_whole_numbers(tmp_path):
    counts = np.array([[0, 3, 1], [2, 0, 1], [1, 1, 0]])
    fig = figures.heatmap(counts, tmp_path / "h.png", "t")
    ax, bar = fig.axes
    shown = [t for t in bar.get_yticks() if 0 <= t <= 3]
    assert shown == [0, 1, 2, 3]
    assert whole(ax.get_xticks()) and whole(ax.get_yticks())
    assert bar.get_ylabel() == "times averaged with"
    assert fig.get_size_inches()[0] == 3.3 and min(text_sizes(fig)) >= 7


def test_similarity_histogram_counts_both_groups_in_the_same_bins(tmp_path):
    clusters = np.array([0, 0, 0, 1, 1, 1, 1])
    sim = np.array([np.nan, 0.9, 0.8, 0.1, 0.2, 0.25, np.nan])     # client 0; peer 6 has no similarity
    fig = figures.similarity_histogram(sim, clusters, 0, tmp_path / "s.png", "t")
    ax = fig.axes[0]
    same, other = ax.containers
    assert sum(p.get_height() for p in same) == 2 and sum(p.get_height() for p in other) == 3
    edges = np.linspace(0.1, 0.9, 31)                                 # 30 bins over the finite values
    for bars in (same, other):
        assert [p.get_x() for p in bars] == pytest.approx(edges[:-1])
    assert whole(ax.get_yticks())
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["same cluster (2 peers)", "other cluster (3 peers)"]
    assert below(fig.legends[0], ax)


def test_cni_precision_plots_the_share_beside_theorem_1(tmp_path, capture):
    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "neighbors.npz", clusters=np.repeat([0, 1], 4))
    recs = records()
    cfg = cfg_of()
    figures.write_run_figures(run, {"algorithm": "panm_grad", "rounds_completed": 4}, cfg, records=recs)
    fig = capture["cni_precision"]
    ax = fig.axes[0]
    measured, theory = ax.get_lines()
    assert list(measured.get_xdata()) == [1, 2] and list(measured.get_ydata()) == [0.125, 0.25]
    assert measured.get_label() == figures.ALL_SAME_LABEL and "share of clients" in measured.get_label()
    assert theory.get_label() == "Theorem 1: P(all k neighbours same-cluster)"
    # n = 8, a = 4 per cluster, l = 2 candidates, k = 1: after round 1 P = 1 - C(4, 2) / C(7, 2) = 15/21
    assert list(theory.get_xdata()) == [1, 2] and theory.get_ydata()[0] == pytest.approx(15 / 21)
    assert whole(ax.get_xticks()) and below(fig.legends[0], ax)
    assert fig.get_size_inches()[0] == 3.3 and min(text_sizes(fig)) >= 7


def test_cni_precision_of_an_older_run_plots_precision_labelled_as_another_quantity(tmp_path, capture):
    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "neighbors.npz", clusters=np.repeat([0, 1], 4))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(share=False)))
    figures.write_run_figures(run, {"algorithm": "panm_grad", "rounds_completed": 4}, cfg_of())
    measured = capture["cni_precision"].axes[0].get_lines()[0]
    assert list(measured.get_ydata()) == pytest.approx([0.6, 0.7])
    assert measured.get_label() == "mean neighbour precision\n(not the same quantity as Theorem 1)"


def test_write_run_figures_skips_bad_lines_with_a_warning(tmp_path, capture):
    run = tmp_path / "run"
    run.mkdir()
    lines = [json.dumps(r) for r in records()]
    lines[1] = "garbage}}}"
    lines[3] = lines[3][:20]                                            # cut by a killed job
    (run / "metrics.jsonl").write_text("\n".join(lines))
    warned = []
    written = figures.write_run_figures(run, {"algorithm": "panm_grad", "rounds_completed": 4}, cfg_of(),
                                        warn=warned.append)
    assert written == ["accuracy.png"] and (run / "figures" / "accuracy.png").stat().st_size > 0
    assert [w.split(":")[0] for w in warned] == [f"{run / 'metrics.jsonl'} line 2", f"{run / 'metrics.jsonl'} line 4"]
    assert all("not valid JSON" in w and "same out=" in w for w in warned)
    assert list(capture["accuracy_curves"].axes[0].get_lines()[0].get_xdata()) == [1, 3]


def test_write_run_figures_uses_the_records_it_is_given(tmp_path, capture):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("garbage}}}\n")                 # not read when records are given
    recs = records(rounds=5, stage1_rounds=3)
    recs[4]["loss"] = float("nan")                                     # the runner's history holds NaN, not null
    warned = []
    assert figures.write_run_figures(run, {"algorithm": "panm_grad", "rounds_completed": 5},
                                     cfg_of(rounds=5, stage1_rounds=3), records=recs, warn=warned.append) \
        == ["accuracy.png"]
    assert warned == []
    acc, loss = capture["accuracy_curves"].axes
    assert list(acc.get_lines()[0].get_xdata()) == [1, 2, 3, 4, 5] and list(loss.get_lines()[0].get_xdata()) == [
        1, 2, 3, 4]
    assert [list(x.get_xdata()) for x in dashed(acc)] == [[3.5, 3.5]]
    # the old three-argument call still works and reads metrics.jsonl (here: nothing usable, no figure)
    assert figures.write_run_figures(run, {"algorithm": "local", "rounds_completed": 5}, cfg_of("local")) == []


def test_read_records_keeps_every_good_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text('{"round": 1, "accuracy": 1.5}\n\n[1, 2]\n{"accuracy": 3}\n{"round": 2, "accuracy": null}\n')
    warned = []
    assert figures.read_records(p, warned.append) == [{"round": 1, "accuracy": 1.5}, {"round": 2, "accuracy": None}]
    assert [w.split(": ")[0] for w in warned] == [f"{p} line 3", f"{p} line 4"]
    assert all("not a metrics record" in w for w in warned)


def test_stage_one_heatmap_from_count_lists_and_from_the_older_table(tmp_path, capture):
    """neighbors.npz holds stage one's counts as lists (stage1_peers, stage1_counts); a run written before
    holds an [n, n] table: both draw the same heatmap.  Above 1,000 clients a cell sums a block."""
    peers = np.array([[1, 2], [0, -1], [-1, -1], [0, 1]], dtype=np.int32)
    counts = np.array([[3, 1], [2, 0], [0, 0], [1, 1]], dtype=np.int32)
    table = np.array([[0, 3, 1, 0], [2, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]])
    for name, arrays in (("lists", {"stage1_peers": peers, "stage1_counts": counts}),
                         ("table", {"stage1_counts": table})):
        run = tmp_path / name
        run.mkdir()
        np.savez(run / "neighbors.npz", **arrays)
        written = figures.write_run_figures(run, {"algorithm": "random", "rounds_completed": 4},
                                            cfg_of("random", clients=4), records=[])
        assert written == ["heatmap_stage1.png"]
        assert np.array_equal(capture["heatmap"].axes[0].get_images()[0].get_array(), table)
    run = tmp_path / "many"
    run.mkdir()
    np.savez(run / "neighbors.npz", stage1_peers=np.array([[2500]] + [[-1]] * 2999, dtype=np.int32),
             stage1_counts=np.array([[4]] + [[0]] * 2999, dtype=np.int32))
    figures.write_run_figures(run, {"algorithm": "random", "rounds_completed": 4}, cfg_of("random", clients=3000),
                              records=[])
    ax = capture["heatmap"].axes[0]
    shown = ax.get_images()[0].get_array()
    assert shown.shape == (1000, 1000) and shown[0, 833] == 4 and shown.sum() == 4   # blocks of 3 clients
    assert ax.get_xlabel() == "peer j (blocks of 3)"


def test_the_neighbour_graph_judges_list_entries_only_against_true_clusters(tmp_path):
    lists = np.array([[1, 2], [0, 3], [3, -1], [2, 0]])
    clusters = np.array([0, 0, 1, 1])
    fig = figures.neighbor_graph(lists, clusters, tmp_path / "g.png", "t")
    title = fig.axes[0].get_title()
    assert "red: a neighbour in another" in title and "(3 of 7 list entries)" in title
    fig = figures.neighbor_graph(lists, np.zeros(4, dtype=np.int64), tmp_path / "h.png", "t", known=False)
    title = fig.axes[0].get_title()
    assert "true clusters unknown" in title and "7 list entries, none judged" in title and "red" not in title
    reds = [line for line in fig.axes[0].get_lines() if line.get_color() == "red"]
    assert not reds


def test_the_stage_one_heatmap_orders_clients_by_true_cluster(tmp_path, capture):
    """Clusters 0, 1, 0, 1 by id: the heatmap shows clients 0, 2, 1, 3, so each cluster is a block."""
    peers = np.array([[2, -1], [3, -1], [0, -1], [1, -1]], dtype=np.int32)
    counts = np.array([[5, 0], [4, 0], [3, 0], [2, 0]], dtype=np.int32)
    table = np.zeros((4, 4), dtype=np.int64)
    for i in range(4):
        table[i, peers[i, 0]] = counts[i, 0]
    for name, arrays in (("lists", {"stage1_peers": peers, "stage1_counts": counts}),
                         ("table", {"stage1_counts": table})):
        run = tmp_path / name
        run.mkdir()
        np.savez(run / "neighbors.npz", clusters=np.array([0, 1, 0, 1]), **arrays)
        figures.write_run_figures(run, {"algorithm": "random", "rounds_completed": 4}, cfg_of("random", clients=4),
                                  records=[])
        ax = capture["heatmap"].axes[0]
        order = [0, 2, 1, 3]
        assert np.array_equal(ax.get_images()[0].get_array(), table[np.ix_(order, order)]), name
        assert ax.get_xlabel() == "peer j, by true cluster"


def test_theorem_1_is_drawn_only_for_clusters_of_one_size(tmp_path, capture):
    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "neighbors.npz", clusters=np.array([0, 0, 0, 0, 0, 0, 1, 1]))   # 6 and 2 clients
    figures.write_run_figures(run, {"algorithm": "panm_grad", "rounds_completed": 4}, cfg_of(), records=records())
    assert len(capture["cni_precision"].axes[0].get_lines()) == 1   # the measured curve alone
