"""The run's figures, checked on the matplotlib Figures the plotting functions return: print size, whole-number
round and count ticks, the stage-two line where it belongs, like against like in cni_precision.png, legends
outside the data; and write_run_figures on a metrics.jsonl with bad lines or with the runner's records."""

import json
from types import SimpleNamespace

import numpy as np
import pytest

from fedclust import figures


@pytest.fixture(autouse=True)
def screen_dpi(monkeypatch):
    """Files at 60 dpi instead of print's 300: these tests read the Figures' artists, not the files' pixels, and
    rasterising at 300 dpi took most of their time."""
    monkeypatch.setattr(figures, "DPI", 60)


def cfg_of(name="panm_grad", clients=8, clusters=2, k=1, l=2, rounds=4, stage1_rounds=2, attack=0.0, **network):
    """A hand-made config of the keys the figures read; ``network``: network.* keys other than the defaults."""
    net = {"graph": "complete", "p_offline": 0.0, "availability": "", "p_drop": 0.0, **network}
    return SimpleNamespace(algorithm=SimpleNamespace(name=name, k=k, l=l), clients=clients, rounds=rounds,
                           stage1_rounds=stage1_rounds, data=SimpleNamespace(num_clusters=clusters),
                           network=SimpleNamespace(**net), attack=SimpleNamespace(fraction=attack))


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
    for name in ("accuracy_curves", "heatmap", "similarity_histogram", "neighbor_graph", "cni_precision",
                 "partition_figure"):
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


# ---------------------------------------------------------------- what a paper reader needs to trust them

def legend_texts(legend):
    return [t.get_text() for t in legend.get_texts()]


def test_accuracy_adds_the_worst_cluster_and_the_honest_clients_with_a_legend_below(tmp_path):
    recs = records()
    for r in recs:
        r["worst_cluster_accuracy"] = r["accuracy"] - 10
        r["honest_accuracy"] = r["accuracy"] + 1
    fig = figures.accuracy_curves(recs, tmp_path / "a.png", "t", marks=[(2, "stage two from round 3")], honest=True)
    acc, loss = fig.axes
    lines = {x.get_label(): list(x.get_ydata()) for x in acc.get_lines() if x.get_linestyle() != "--"}
    assert lines == {figures.MEAN_LABEL: [53.0, 56.0, 59.0, 62.0], figures.WORST_LABEL: [43.0, 46.0, 49.0, 52.0],
                     figures.HONEST_LABEL: [54.0, 57.0, 60.0, 63.0]}
    assert legend_texts(fig.legends[0]) == ["mean over clients", "worst true cluster",
                                            "honest clients (attackers left out)", "stage two from round 3"]
    assert below(fig.legends[0], loss) and acc.get_ylabel() == "test accuracy (%)"
    # without attackers the honest clients are all the clients: no line; worst null everywhere: no line
    fig = figures.accuracy_curves(recs, tmp_path / "b.png", "t")
    assert [x.get_label() for x in fig.axes[0].get_lines()] == [figures.MEAN_LABEL, figures.WORST_LABEL]
    for r in recs:
        r["worst_cluster_accuracy"] = None
    fig = figures.accuracy_curves(recs, tmp_path / "c.png", "t", stage1_rounds=2)
    assert len(fig.axes[0].get_lines()) == 2 and legend_texts(fig.legends[0]) == ["stage two from round 3"]
    assert fig.axes[0].get_ylabel() == "mean test accuracy (%)"


def test_write_run_figures_draws_the_honest_line_only_for_a_run_with_attackers(tmp_path, capture):
    recs = records()
    for r in recs:
        r["honest_accuracy"] = r["accuracy"] + 2
    for fraction, want in ((0.25, [figures.MEAN_LABEL, figures.HONEST_LABEL]), (0.0, [figures.MEAN_LABEL])):
        run = tmp_path / f"run{fraction}"
        run.mkdir()
        figures.write_run_figures(run, {"algorithm": "local", "rounds_completed": 4}, cfg_of("local", attack=fraction),
                                  records=recs)
        assert [x.get_label() for x in capture["accuracy_curves"].axes[0].get_lines()] == want


def test_phase_marks_stage_two_by_default_and_fedspds_fine_tuning():
    from fedclust.algorithms import registry
    from fedclust.config import load_config

    small = ["data.name=synthetic", "clients=8", "rounds=10", "stage1_rounds=4", "algorithm.k=2", "algorithm.l=3"]
    panm = load_config(None, small + ["algorithm.name=panm_grad"])
    assert registry.get("panm_grad").phase_marks(panm) == [(4, "stage two from round 5")]
    assert registry.get("local").phase_marks(load_config(None, small + ["algorithm.name=local"])) == []
    # stage one the whole run: no stage two starts
    whole = load_config(None, [*small, "algorithm.name=pens", "stage1_rounds=10"])
    assert registry.get("pens").phase_marks(whole) == []
    spd = load_config(None, small + ["algorithm.name=fedspd", "fedspd.finetune_rounds=3", "fedspd.degree=3",
                                     "data.train_size=40"])
    assert registry.get("fedspd").phase_marks(spd) == [(7, "fine-tuning from round 8")]   # rounds 8, 9, 10
    spd.fedspd.finetune_rounds = 0
    assert registry.get("fedspd").phase_marks(spd) == []


def test_accuracy_marks_fedspds_fine_tuning_from_phase_marks(tmp_path, capture):
    run = tmp_path / "run"
    run.mkdir()
    cfg = cfg_of("fedspd", rounds=6, stage1_rounds=2)
    cfg.fedspd = SimpleNamespace(finetune_rounds=2)
    recs = records(rounds=6, stage1_rounds=2)
    assert figures.write_run_figures(run, {"algorithm": "fedspd", "rounds_completed": 6}, cfg,
                                     records=recs) == ["accuracy.png"]
    fig = capture["accuracy_curves"]
    for ax in fig.axes:   # after round 4, the last of the cluster models' rounds
        assert [list(x.get_xdata()) for x in dashed(ax)] == [[4.5, 4.5]]
    assert legend_texts(fig.legends[0]) == ["fine-tuning from round 5"]
    # a plug-in whose phase_marks fails: reported, the figure drawn without marks
    from fedclust.algorithms import registry

    warned = []
    broken = classmethod(lambda cls, cfg: 1 / 0)
    original = registry.get("fedspd").__dict__["phase_marks"]
    try:
        registry.get("fedspd").phase_marks = broken
        assert figures.write_run_figures(run, {"algorithm": "fedspd", "rounds_completed": 6}, cfg, records=recs,
                                         warn=warned.append) == ["accuracy.png"]
    finally:
        registry.get("fedspd").phase_marks = original
    assert not dashed(capture["accuracy_curves"].axes[0]) and "phase_marks failed (ZeroDivisionError" in warned[0]


def test_the_neighbour_graph_crosses_out_the_attackers_and_names_the_clusters(tmp_path):
    lists = np.array([[1, 2], [0, 3], [3, -1], [2, 0], [0, 1]])
    clusters = np.array([0, 0, 1, 1, 1])
    fig = figures.neighbor_graph(lists, clusters, tmp_path / "g.png", "t", attackers=np.array([4, 1], np.int32))
    ax = fig.axes[0]
    assert legend_texts(fig.legends[0]) == ["cluster 0 (2 clients)", "cluster 1 (3 clients)", "attacker (2)"]
    dots, crosses = ax.collections
    xy = figures.circle_layout(clusters)
    assert np.allclose(crosses.get_offsets(), xy[[1, 4]]) and crosses.get_label() == "attacker (2)"
    assert np.allclose(crosses.get_edgecolor()[0], [0, 0, 0, 1])        # black
    colours = dots.get_facecolor()
    assert np.allclose(colours[0], colours[1]) and not np.allclose(colours[0], colours[2])
    assert below(fig.legends[0], ax) and min(text_sizes(fig)) >= 7
    # no attackers: clusters only; 12 clusters: one line, each cluster still its own colour
    fig = figures.neighbor_graph(lists, clusters, tmp_path / "h.png", "t")
    assert legend_texts(fig.legends[0]) == ["cluster 0 (2 clients)", "cluster 1 (3 clients)"]
    many = np.arange(24) % 12
    fig = figures.neighbor_graph(np.roll(np.arange(24), 1)[:, None], many, tmp_path / "m.png", "t", attackers=[3])
    assert legend_texts(fig.legends[0]) == ["attacker (1)"]
    assert fig.legends[0].get_title().get_text() == "colour: true cluster (12 clusters)"
    face = fig.axes[0].collections[0].get_facecolor()
    assert len({tuple(face[i]) for i in range(12)}) == 12


def test_write_run_figures_marks_the_attackers_of_neighbors_npz(tmp_path, capture):
    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "neighbors.npz", clusters=np.repeat([0, 1], 4), attackers=np.array([2, 5], dtype=np.int32),
             final_lists=np.roll(np.arange(8), 1)[:, None].astype(np.int32))
    assert figures.write_run_figures(run, {"algorithm": "random", "rounds_completed": 4},
                                     cfg_of("random", attack=0.25), records=[]) == ["neighbor_graph.png"]
    assert legend_texts(capture["neighbor_graph"].legends[0])[-1] == "attacker (2)"


@pytest.mark.parametrize("change, here", [(dict(graph="ring"), "network.graph=ring"),
                                          (dict(p_offline=0.1), "network.p_offline=0.1"),
                                          (dict(availability="online.npy"), "network.availability"),
                                          (dict(p_drop=0.2), "network.p_drop=0.2"),
                                          (dict(attack=0.25), "attack.fraction=0.25")])
def test_theorem_1_is_left_out_where_its_assumptions_break_and_the_legend_says_why(tmp_path, capture, change, here):
    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "neighbors.npz", clusters=np.repeat([0, 1], 4))
    assert figures.write_run_figures(run, {"algorithm": "panm_grad", "rounds_completed": 4}, cfg_of(**change),
                                     records=records()) == ["accuracy.png", "cni_precision.png"]
    fig = capture["cni_precision"]
    assert [x.get_label() for x in fig.axes[0].get_lines()] == [figures.ALL_SAME_LABEL]   # the measured curve alone
    note = fig.legends[0].get_title().get_text()
    assert note.startswith("Theorem 1 not drawn: it assumes") and note.replace("\n", " ").endswith(f"(here {here})")
    assert below(fig.legends[0], fig.axes[0]) and min(text_sizes(fig)) >= 7
    assert fig.legends[0].get_window_extent().x0 >= 0 and fig.legends[0].get_window_extent().x1 <= 3.3 * fig.dpi


def test_theorem_1_note_names_every_broken_assumption_once():
    cfg = cfg_of(graph="ring", p_offline=0.1, availability="a.npy", attack=0.1)
    note = figures.theorem_1_note(figures.theorem_1_breaks(cfg)).replace("\n", " ")
    assert note == ("Theorem 1 not drawn: it assumes the complete graph, every client online and no attacker (here "
                    "network.graph=ring, network.p_offline=0.1, network.availability, attack.fraction=0.1)")
    assert figures.theorem_1_breaks(cfg_of()) == []


def test_unequal_clusters_leave_theorem_1_out_with_a_note(tmp_path, capture):
    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "neighbors.npz", clusters=np.array([0, 0, 0, 0, 0, 0, 1, 1]))
    figures.write_run_figures(run, {"algorithm": "panm_grad", "rounds_completed": 4}, cfg_of(), records=records())
    note = capture["cni_precision"].legends[0].get_title().get_text().replace("\n", " ")
    assert note == "Theorem 1 not drawn: it assumes clusters of one size (here clients per cluster 6, 2)"


def boundary_lines(ax):
    """(vertical x, horizontal y) of the heatmap's cluster boundaries."""
    xs = [x.get_xdata()[0] for x in ax.get_lines() if x.get_xdata()[0] == x.get_xdata()[1]]
    ys = [x.get_ydata()[0] for x in ax.get_lines() if x.get_ydata()[0] == x.get_ydata()[1]]
    return xs, ys


def test_the_stage_one_heatmap_draws_cluster_boundaries_and_says_which_rounds_it_counts(tmp_path, capture):
    peers = np.array([[(i + 1) % 8] for i in range(8)], dtype=np.int32)
    counts = np.ones((8, 1), dtype=np.int32)
    cases = (("panm_grad", np.array([0, 0, 0, 1, 1, 2, 2, 2]), 2, "panm_grad: aggregations in stage one", [2.5, 4.5]),
             ("random", np.array([1, 0, 2, 0, 1, 2, 0, 2]), 3, "random: aggregations in rounds 1–3", [2.5, 4.5]),
             ("random", np.repeat([0, 1], 4), 9, "random: aggregations in rounds 1–4", [3.5]),    # T1 > rounds
             ("random", np.zeros(8, dtype=int), 1, "random: aggregations in round 1", []))
    for n, (alg, clusters, t1, title, at) in enumerate(cases):
        run = tmp_path / str(n)
        run.mkdir()
        np.savez(run / "neighbors.npz", clusters=clusters, stage1_peers=peers, stage1_counts=counts)
        assert figures.write_run_figures(run, {"algorithm": alg, "rounds_completed": 4},
                                         cfg_of(alg, stage1_rounds=t1), records=[]) == ["heatmap_stage1.png"]
        ax = capture["heatmap"].axes[0]
        assert ax.get_title().split("\n")[0] == title
        assert boundary_lines(ax) == (at, at), alg
        # the lines fall between the cluster blocks the heatmap shows
        sizes = np.bincount(clusters)
        assert at == [s - 0.5 for s in np.cumsum(sizes)[:-1]]
    # no true clusters: no line
    run = tmp_path / "unknown"
    run.mkdir()
    np.savez(run / "neighbors.npz", stage1_peers=peers, stage1_counts=counts)
    figures.write_run_figures(run, {"algorithm": "random", "rounds_completed": 4}, cfg_of("random"), records=[])
    assert boundary_lines(capture["heatmap"].axes[0]) == ([], [])


def test_cluster_boundaries_in_a_heatmap_of_blocks(tmp_path, capture):
    """3,000 clients in blocks of 3 a side: clusters of 1,500 and 1,500 meet between cells 499 and 500 (client
    1,500 = 3 x 500); 1,000 and 2,000 meet a third of the way into cell 333."""
    n = 3000
    peers = np.array([[(i + 1) % n] for i in range(n)], dtype=np.int32)
    counts = np.ones((n, 1), dtype=np.int32)
    for sizes, want in (((1500, 1500), [499.5]), ((1000, 2000), [1000 / 3 - 0.5])):
        run = tmp_path / str(sizes[0])
        run.mkdir()
        np.savez(run / "neighbors.npz", clusters=np.repeat([0, 1], sizes), stage1_peers=peers, stage1_counts=counts)
        figures.write_run_figures(run, {"algorithm": "random", "rounds_completed": 4}, cfg_of("random", clients=n),
                                  records=[])
        ax = capture["heatmap"].axes[0]
        assert ax.get_images()[0].get_array().shape == (1000, 1000)
        xs, ys = boundary_lines(ax)
        assert xs == pytest.approx(want) and ys == pytest.approx(want)


def test_a_figure_that_fails_is_reported_and_the_others_are_drawn(tmp_path, capture, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    np.savez(run / "neighbors.npz", clusters=np.repeat([0, 1], 4),
             stage1_peers=np.array([[(i + 1) % 8] for i in range(8)], dtype=np.int32),
             stage1_counts=np.ones((8, 1), dtype=np.int32))

    def broken(*args, **kwargs):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(figures, "heatmap", broken)
    warned = []
    written = figures.write_run_figures(run, {"algorithm": "panm_grad", "rounds_completed": 4}, cfg_of(),
                                        records=records(), warn=warned.append)
    assert written == ["accuracy.png", "cni_precision.png"]
    assert warned == ["figures/heatmap_stage1.png not drawn (RuntimeError: no fonts); the other figures stand"]


# ---------------------------------------------------------------- partition.png

def pool_cfg(*changes):
    from fedclust.config import load_config

    return load_config("configs/fmnist_rotation2.yaml",
                       ["clients=8", "data.train_size=40", "data.test_size=10", "rounds=4", "stage1_rounds=2",
                        "algorithm.k=2", "algorithm.l=3", "algorithm.name=local", *changes])


def counts_by_hand(cfg):
    """Each client's training examples by label, one client at a time from the data set's client_rows."""
    import torch

    from fedclust.data import dataset

    ds = dataset(cfg.data)
    raw = ds.raw(cfg.data)
    (index, real), _ = ds.client_rows(cfg.data, raw, cfg.clients, cfg.seed, torch.arange(cfg.clients))[0]
    out = np.zeros((cfg.clients, 10), dtype=np.int64)
    for i in range(cfg.clients):
        held = index[i] if real is None else index[i][real[i]]
        for label in raw.train_y[held].tolist():
            out[i, label] += 1
    return out


@pytest.mark.parametrize("changes, words", [
    (["data.partition=dirichlet", "data.alpha=0.1"], "dirichlet α=0.1"),
    (["data.partition=shards", "data.shards_per_client=2"], "shards, 2 per client"),
    (["data.quantity_skew=1.5", "data.num_clusters=4"], "quantity skew 1.5")])
def test_the_partition_figure_stacks_each_clients_training_labels_as_the_run_split_them(tmp_path, capture, changes,
                                                                                        words):
    cfg = pool_cfg(*changes)
    run = tmp_path / "run"
    run.mkdir()
    assert figures.write_run_figures(run, {"algorithm": "local", "rounds_completed": 4}, cfg, records=[]) \
        == ["partition.png"]
    fig = capture["partition_figure"]
    ax = fig.axes[0]
    want = counts_by_hand(cfg)
    assert len(ax.containers) == 10                                    # one stack layer per label
    bottom = np.zeros(cfg.clients)
    for label, bars in enumerate(ax.containers):
        assert [p.get_height() for p in bars] == want[:, label].tolist()
        assert [p.get_y() for p in bars] == bottom.tolist()            # stacked on the labels below
        bottom += want[:, label]
    assert [p.get_x() + p.get_width() / 2 for p in ax.containers[0]] == list(range(cfg.clients))
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(i) for i in range(cfg.clients)]
    assert ax.get_title().split("\n")[1] == words and "label swap" not in ax.get_title()
    assert legend_texts(fig.legends[0]) == [str(c) for c in range(10)] and below(fig.legends[0], ax)
    assert fig.get_size_inches()[0] == 3.3 and min(text_sizes(fig)) >= 7
    k = cfg.data.num_clusters
    xs = [x.get_xdata()[0] for x in ax.get_lines()]
    assert xs == [c * cfg.clients // k - 0.5 for c in range(1, k)]     # between the cluster blocks
    if "quantity" in words:
        assert len(set(want.sum(1).tolist())) > 1                      # sizes differ: the real mask was used


def test_no_partition_figure_for_the_iid_split_and_raw_labels_named_under_label_swap(tmp_path, capture):
    run = tmp_path / "iid"
    run.mkdir()
    assert figures.write_run_figures(run, {"algorithm": "local", "rounds_completed": 4}, pool_cfg(), records=[]) == []
    run = tmp_path / "swap"
    run.mkdir()
    cfg = pool_cfg("data.clusters=label_swap", "data.partition=dirichlet", "data.alpha=0.5")
    assert figures.write_run_figures(run, {"algorithm": "local", "rounds_completed": 4}, cfg, records=[]) \
        == ["partition.png"]
    assert "before each cluster's label swap" in capture["partition_figure"].axes[0].get_title()


def test_the_partition_figure_of_many_clients_stacks_steps(tmp_path):
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 20, size=(300, 3))
    fig = figures.partition_figure(counts, np.repeat([0, 1, 2], 100), tmp_path / "p.png", "t\nshards")
    ax = fig.axes[0]
    assert len(ax.collections) == 3 and not ax.containers and fig.get_size_inches()[0] == 6.8
    top = ax.collections[2].get_paths()[0].vertices
    assert top[:, 1].max() == counts.sum(1).max()
    assert [x.get_xdata()[0] for x in ax.get_lines()] == [99.5, 199.5]
