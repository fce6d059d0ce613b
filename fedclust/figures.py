"""Figures of PANM paper written into the run directory (docs/algorithms.md):

- ``accuracy.png``: mean test accuracy and loss per round, the start of
  stage two marked for two-stage methods;
- ``heatmap_stage1.png``: who averaged with whom in stage one (Fig. 5);
- ``similarity_hist.png``: one client's similarities after stage one, split by
  true cluster (Fig. 4);
- ``neighbor_graph.png``: the stage-two neighbour graph coloured by true
  cluster (Fig. 7);
- ``cni_precision.png``: per stage-one round, the share of clients whose
  neighbours are all in their own cluster beside Theorem 1's probability of
  that (Fig. 3).

Every figure is drawn at the size a two-column paper prints it (one column,
3.3 inches wide, 7-8 pt text) and saved at 300 dpi.  Inputs are the arrays
the runner saves in ``neighbors.npz`` and the records of ``metrics.jsonl`` (or
the runner's own history); nothing here touches tensors or processes.  Each
plotting function returns the matplotlib Figure it saved, so that what it
drew can be checked.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from fedclust.algorithms import registry
from fedclust.errors import ConfigError
from fedclust.lists import count_table, list_edges
from fedclust.theory import cni_probabilities

WIDTH = 3.3      # inches: one column of a two-column paper
WIDE = 6.8       # inches: both columns
DPI = 300
STYLE = {"font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7,
         "legend.fontsize": 7, "figure.titlesize": 8, "lines.linewidth": 1.2, "axes.linewidth": 0.6}


def _warn(msg: str) -> None:
    print(f"fedclust: warning: {msg}", file=sys.stderr)


# ---------------------------------------------------------------- records

def read_records(path: str | Path, warn=_warn) -> list[dict]:
    """The records of a metrics.jsonl.  A line that is not a JSON object with a ``round`` (edited, garbled,
    cut by a killed job) is skipped and ``warn`` is told its file and line number; the other lines stand."""
    path = Path(path)
    records = []
    for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            why = f"not valid JSON ({exc.msg} at column {exc.colno})"
        else:
            if isinstance(rec, dict) and "round" in rec:
                records.append(rec)
                continue
            why = "not a metrics record (a JSON object with a 'round')"
        warn(f"{path} line {n}: {why}; line skipped, the other rounds are used (running the run's command "
             f"again with the same out= rebuilds the file from its checkpoint)")
    return records


def _number(x) -> float | None:
    """A metric's value, None where undefined (null in metrics.jsonl, NaN in the runner's history)."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def stage_one_rounds(algorithm: str, stage1_rounds) -> int | None:
    """T1 of a two-stage method (one that declares ``needs_stages``: stage one is rounds 1..stage1_rounds),
    None for a method with one stage or one this process has not registered (every run records a ``stage``
    by stage1_rounds, so that field does not tell a two-stage method)."""
    try:
        two_stage = registry.get(algorithm).needs_stages
    except ConfigError:   # a plug-in algorithm not imported here: no stages known, no line drawn
        return None
    return int(stage1_rounds) if two_stage and stage1_rounds is not None else None


# ---------------------------------------------------------------- drawing helpers

def new_figure(width: float, height: float):
    """A Figure of the given print size in inches, laid out so that no label is cut or overlaps."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def print_style():
    """Font sizes and line widths of print, for the figures drawn inside it."""
    import matplotlib

    return matplotlib.rc_context(STYLE)


def _save(fig, path: Path):
    fig.savefig(path, dpi=DPI)
    return fig


def integer_ticks(axis) -> None:
    """Ticks of an axis of counts or rounds at whole numbers only, in steps of 1, 2 or 5 times a power of ten."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def mark_stage_two(ax, stage1_rounds: int | None, last_round: int | None = None, label: str | None = None):
    """A dashed vertical line halfway between the last stage-one round and the first stage-two round (x =
    stage1_rounds + 0.5), labelled for the legend; nothing where there is no stage two in view."""
    if stage1_rounds is None or (last_round is not None and last_round <= stage1_rounds):
        return None
    return ax.axvline(stage1_rounds + 0.5, ls="--", lw=0.8, color="0.35", zorder=0,
                      label=label or f"stage two from round {stage1_rounds + 1}")


# ---------------------------------------------------------------- the figures

def heatmap(counts: np.ndarray, path: Path, title: str, block: int = 1, by_cluster: bool = False):
    """counts[i, j]: how often client i averaged with peer j (summed over blocks of ``block`` clients a side);
    colour bar ticked at whole counts; ``by_cluster``: the clients are in the order of their true clusters."""
    with print_style():
        fig = new_figure(WIDTH, 2.9)
        ax = fig.subplots()
        im = ax.imshow(counts, cmap="viridis", interpolation="nearest", vmin=0)
        per = ("" if block == 1 else f" (blocks of {block})") + (", by true cluster" if by_cluster else "")
        ax.set_xlabel("peer j" + per)
        ax.set_ylabel("client i" + per)
        integer_ticks(ax.xaxis)
        integer_ticks(ax.yaxis)
        ax.set_title(title)
        cb = fig.colorbar(im, ax=ax, label="times averaged with")
        integer_ticks(cb.ax.yaxis)
        return _save(fig, path)


def similarity_histogram(sim_row: np.ndarray, clusters: np.ndarray, client: int, path: Path, title: str):
    """Client ``client``'s similarity to every other client, same-cluster and other-cluster peers counted in
    the same bins."""
    same = clusters == clusters[client]
    same[client] = False
    other = clusters != clusters[client]
    ok = np.isfinite(sim_row)
    with print_style():
        fig = new_figure(WIDTH, 2.6)
        ax = fig.subplots()
        bins = np.histogram_bin_edges(sim_row[ok & (same | other)], bins=30)
        for part, what in ((same, "same cluster"), (other, "other cluster")):
            count = int((ok & part).sum())
            ax.hist(sim_row[ok & part], bins=bins, alpha=0.7, label=f"{what} ({count} peer{'s' * (count != 1)})")
        ax.set_xlabel(f"similarity $s_{{{client}j}}$ to peer j")
        ax.set_ylabel("peers")
        integer_ticks(ax.yaxis)
        ax.set_title(title)
        fig.legend(loc="outside lower center", frameon=False, ncols=2)   # below: covers no bar
        return _save(fig, path)


def circle_layout(clusters: np.ndarray) -> np.ndarray:
    """Clients on a circle ordered by true cluster, clusters as arcs."""
    order = np.argsort(clusters, kind="stable")
    angle = np.empty(len(clusters))
    angle[order] = 2 * np.pi * np.arange(len(clusters)) / len(clusters)
    return np.stack([np.cos(angle), np.sin(angle)], axis=1)


def neighbor_graph_title(title: str, same: np.ndarray, known: bool) -> str:
    """The neighbour graph's title: how many list entries point into another true cluster, or, where the data
    gives no true clusters, that nothing can be said of it."""
    if not known:
        return f"{title}\ntrue clusters unknown (the data gives none):\n{len(same)} list entries, none judged"
    return (f"{title}\ncolour: true cluster; red: a neighbour in another\ncluster "
            f"({int((~same).sum())} of {len(same)} list entries)")


def neighbor_graph(lists: np.ndarray, clusters: np.ndarray, path: Path, title: str, known: bool = True):
    """``lists``: ``[n, m]`` index lists, or a bool ``[n, n]`` adjacency of older runs; ``known``: the clusters
    are the data's true ones (else one colour, no edge called wrong)."""
    xy = circle_layout(clusters)
    ii, jj = list_edges(lists)
    same = clusters[ii] == clusters[jj] if known else np.ones(len(ii), dtype=bool)
    with print_style():
        fig = new_figure(WIDTH, 3.5)
        ax = fig.subplots()
        for i, j, s in zip(ii, jj, same):
            ax.plot(xy[[i, j], 0], xy[[i, j], 1], color="0.6" if s else "red", lw=0.4, alpha=0.5, zorder=1)
        ax.scatter(xy[:, 0], xy[:, 1], c=clusters, cmap="tab10", s=12, zorder=2, vmin=0, vmax=9)
        ax.set_title(neighbor_graph_title(title, same, known))
        ax.set_axis_off()
        ax.set_aspect("equal")
        return _save(fig, path)


# legend lines broken to fit one printed column
ALL_SAME_LABEL = "measured: share of clients whose\nneighbours are all same-cluster"
PRECISION_LABEL = "mean neighbour precision\n(not the same quantity as Theorem 1)"
THEORY_LABEL = "Theorem 1: P(all k neighbours same-cluster)"


def cni_precision(rounds, measured, theory, path: Path, title: str, measured_is_share: bool = True):
    """Stage one, per round: ``measured`` beside Theorem 1's P^t(k) (``theory``, rounds 1..T1).  ``measured``
    is the share of clients whose neighbours are all in their own cluster, the quantity Theorem 1 gives the
    probability of; runs that did not record it pass the mean neighbour precision with
    ``measured_is_share=False``, and the legend says it is another quantity."""
    with print_style():
        fig = new_figure(WIDTH, 2.9)
        ax = fig.subplots()
        ax.plot(rounds, measured, marker="o" if len(rounds) <= 20 else None, ms=3,
                label=ALL_SAME_LABEL if measured_is_share else PRECISION_LABEL)
        if theory is not None:
            ax.plot(np.arange(1, len(theory) + 1), theory, "--", label=THEORY_LABEL)
        ax.set_xlabel("round (stage one)")
        ax.set_ylabel("all neighbours same-cluster" if measured_is_share else "precision; probability")
        integer_ticks(ax.xaxis)
        ax.set_ylim(-0.03, 1.03)   # a share of 0 or 1 stays clear of the frame
        ax.set_title(title)
        fig.legend(loc="outside lower center", frameon=False, ncols=1)
        return _save(fig, path)


def accuracy_curves(records: list[dict], path: Path, title: str, stage1_rounds: int | None = None):
    """Mean test accuracy (top) and loss (bottom) per evaluated round; for a two-stage method a dashed line
    where stage two starts."""
    acc = [(x["round"], v) for x in records if (v := _number(x.get("accuracy"))) is not None]
    loss = [(x["round"], v) for x in records if (v := _number(x.get("loss"))) is not None]
    last = max((x["round"] for x in records), default=None)
    with print_style():
        fig = new_figure(WIDTH, 3.6)
        a, b = fig.subplots(2, 1, sharex=True)
        marker = "o" if len(records) <= 20 else None
        for ax, points in ((a, acc), (b, loss)):
            if points:
                ax.plot(*zip(*points), marker=marker, ms=3)
        a.set_ylabel("mean test accuracy (%)")
        b.set_ylabel("mean test loss")
        b.set_xlabel("round")
        for ax in (a, b):
            integer_ticks(ax.xaxis)
            line = mark_stage_two(ax, stage1_rounds, last)
        if line is not None:   # below the panels, where it covers no data
            fig.legend(handles=[line], loc="outside lower center", frameon=False)
        fig.suptitle(title)
        return _save(fig, path)


def write_run_figures(run_dir: str | Path, summary: dict, cfg, records: list[dict] | None = None,
                      warn=_warn) -> list[str]:
    """All figures the run's saved arrays allow; returns the file names.  ``records``: the run's metrics
    records (the runner's history); None reads them from metrics.jsonl, skipping lines that are not records
    with a warning naming file and line."""
    run_dir = Path(run_dir)
    fig_dir = run_dir / "figures"
    fig_dir.mkdir(exist_ok=True)
    if records is None:
        p = run_dir / "metrics.jsonl"
        records = read_records(p, warn) if p.is_file() else []
    name = summary["algorithm"]
    t1 = stage_one_rounds(cfg.algorithm.name, cfg.stage1_rounds)
    written = []
    if records:
        accuracy_curves(records, fig_dir / "accuracy.png", f"{name}: accuracy and loss", t1)
        written.append("accuracy.png")
    npz = run_dir / "neighbors.npz"
    if not npz.exists():
        return written
    arrays = np.load(npz)
    known = "clusters" in arrays   # absent: the data gives no true clusters
    clusters = arrays["clusters"] if known else np.zeros(cfg.clients, dtype=np.int64)   # one colour in the graph
    table: np.ndarray | None   # None: no stage-one counts kept
    # clients in the order of their true clusters, so that clusters that are not contiguous ids show as blocks
    order = np.argsort(clusters, kind="stable")
    by_cluster = known and bool((np.diff(clusters) < 0).any())
    rank = np.argsort(order, kind="stable") if by_cluster else np.arange(len(clusters))
    if "stage1_peers" in arrays:   # count lists; runs before them kept the [n, n] table
        peers = arrays["stage1_peers"]
        if by_cluster:
            peers = np.where(peers >= 0, rank[np.clip(peers, 0, None)], -1)[order]
        counts = arrays["stage1_counts"][order] if by_cluster else arrays["stage1_counts"]
        table, block = count_table(peers, counts, cfg.clients)
    else:
        table, block = (arrays["stage1_counts"] if "stage1_counts" in arrays else None), 1
        if table is not None and by_cluster:
            table = table[np.ix_(order, order)]
    if table is not None and table.any():
        heatmap(table, fig_dir / "heatmap_stage1.png", f"{name}: aggregations in stage one", block, by_cluster)
        written.append("heatmap_stage1.png")
    if known and "similarity_client0" in arrays and np.isfinite(arrays["similarity_client0"]).any():
        similarity_histogram(arrays["similarity_client0"], clusters, 0, fig_dir / "similarity_hist.png",
                             f"{name}: client 0's similarities after stage one")
        written.append("similarity_hist.png")
    if "final_lists" in arrays and len(list_edges(arrays["final_lists"])[0]):
        neighbor_graph(arrays["final_lists"], clusters, fig_dir / "neighbor_graph.png",
                       f"{name}: neighbour lists, round {summary['rounds_completed']}", known)
        written.append("neighbor_graph.png")
    stage1 = [x for x in records if x.get("stage") == 1 and _number(x.get("neighbor_precision")) is not None]
    if stage1 and registry.get(cfg.algorithm.name).stage_one_figures:
        theory = None
        sizes = np.bincount(clusters) if known else np.array([cfg.clients // cfg.data.num_clusters])
        if len(set(sizes[sizes > 0].tolist())) == 1:   # Theorem 1 is for clusters of one size: else not drawn
            try:
                a = int(sizes[sizes > 0][0])
                theory = cni_probabilities(cfg.clients, a, cfg.algorithm.l, cfg.algorithm.k, cfg.stage1_rounds)
            except Exception:  # theory needs an even split etc.; the measured curve still stands alone
                theory = None
        # the share of clients with all neighbours same-cluster where every stage-one record holds it
        share = [_number(x.get("neighbor_all_same_share")) for x in stage1]
        is_share = all(v is not None for v in share)
        measured = share if is_share else [_number(x["neighbor_precision"]) for x in stage1]
        cni_precision([x["round"] for x in stage1], measured, theory, fig_dir / "cni_precision.png",
                      f"{name}: stage one", measured_is_share=is_share)
        written.append("cni_precision.png")
    return written
