"""Figures of PANM paper written into the run directory (docs/algorithms.md):

- ``accuracy.png``: mean test accuracy and loss per round, with the worst
  true cluster's accuracy where the records hold it and the honest clients'
  where the run had attackers; each new phase the algorithm declares
  (``Algorithm.phase_marks``: PANM's and PENS' stage two, FedSPD's
  fine-tuning) marked by a dashed line;
- ``partition.png``: each client's training examples by label, for a pool
  split by ``dirichlet`` or ``shards`` or with ``quantity_skew``;
- ``heatmap_stage1.png``: who averaged with whom in stage one (Fig. 5; for a
  method without stages, in rounds 1..stage1_rounds), thin lines between the
  true clusters;
- ``similarity_hist.png``: one client's similarities after stage one, split by
  true cluster (Fig. 4);
- ``neighbor_graph.png``: the stage-two neighbour graph coloured by true
  cluster, attackers crossed out (Fig. 7);
- ``cni_precision.png``: per stage-one round, the share of clients whose
  neighbours are all in their own cluster beside Theorem 1's probability of
  that (Fig. 3), the theorem drawn only where its assumptions hold.

Every figure is drawn at the size a two-column paper prints it (one column,
3.3 inches wide, 7-8 pt text) and saved at 300 dpi.  Inputs are the arrays
the runner saves in ``neighbors.npz`` and the records of ``metrics.jsonl`` (or
the runner's own history), and for ``partition.png`` the pool's labels as the
data set splits them; nothing here touches models or processes.  Each
plotting function returns the matplotlib Figure it saved, so that what it
drew can be checked.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch

from fedclust.algorithms import registry
from fedclust.data import cluster_of_clients, dataset
from fedclust.data.base import PoolDataSet
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


def phase_marks(cfg, warn=_warn) -> list[tuple[int, str]]:
    """The run's ``(R, label)`` phase marks, as its algorithm declares them (``Algorithm.phase_marks``): a new
    phase starts after round R.  None for an algorithm this process has not registered; a declaration that
    fails is reported through ``warn`` and marks nothing."""
    try:
        cls = registry.get(cfg.algorithm.name)
    except ConfigError:
        return []
    try:
        return [(int(r), str(label)) for r, label in cls.phase_marks(cfg)]
    except Exception as exc:   # a plug-in's declaration: the figure stands without its marks
        warn(f"{cfg.algorithm.name}: phase_marks failed ({type(exc).__name__}: {exc}); accuracy.png marks no phase")
        return []


def _setting(cfg, section: str, key: str, default):
    """``cfg.section.key``, ``default`` where the config (an older one, a hand-made namespace) has none."""
    return getattr(getattr(cfg, section, None), key, default)


def attack_fraction(cfg) -> float:
    return float(_setting(cfg, "attack", "fraction", 0.0) or 0.0)


def theorem_1_breaks(cfg) -> list[tuple[str, str]]:
    """What of the run breaks Theorem 1's assumptions, as (assumption, the run's key): the theorem counts
    candidates drawn from every other client, all online, every model delivered, none poisoned."""
    out = []
    graph = _setting(cfg, "network", "graph", "complete")
    if graph != "complete":
        out.append(("the complete graph", f"network.graph={graph}"))
    p_offline = float(_setting(cfg, "network", "p_offline", 0.0) or 0.0)
    if p_offline > 0:
        out.append(("every client online", f"network.p_offline={p_offline:g}"))
    if _setting(cfg, "network", "availability", ""):
        out.append(("every client online", "network.availability"))
    join = int(_setting(cfg, "network", "join_round", 0) or 0)
    if join:   # the late joiners are offline from round 1 until then
        out.append(("every client online", f"network.join_round={join}"))
    p_drop = float(_setting(cfg, "network", "p_drop", 0.0) or 0.0)
    if p_drop > 0:
        out.append(("every model delivered", f"network.p_drop={p_drop:g}"))
    if attack_fraction(cfg) > 0:
        out.append(("no attacker", f"attack.fraction={attack_fraction(cfg):g}"))
    return out


def theorem_1_note(breaks: list[tuple[str, str]], width: int = 52) -> str:
    """'Theorem 1 not drawn: it assumes ... (here ...)', broken to fit one printed column."""
    assumed = list(dict.fromkeys(a for a, _ in breaks))
    said = assumed[0] if len(assumed) == 1 else ", ".join(assumed[:-1]) + " and " + assumed[-1]
    here = ", ".join(h for _, h in breaks)
    return "\n".join(textwrap.wrap(f"Theorem 1 not drawn: it assumes {said} (here {here})", width))


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


def mark_phase(ax, after: int, label: str, last_round: int | None = None, color="0.35"):
    """A dashed vertical line halfway between round ``after``, the last of a phase, and the first round of the
    next (x = after + 0.5), labelled for the legend; nothing where the next phase is not in view."""
    if last_round is not None and last_round <= after:
        return None
    return ax.axvline(after + 0.5, ls="--", lw=0.8, color=color, zorder=0, label=label)


def mark_stage_two(ax, stage1_rounds: int | None, last_round: int | None = None, label: str | None = None):
    """The stage-two line (:func:`mark_phase` after round stage1_rounds); nothing for a method of one stage."""
    if stage1_rounds is None:
        return None
    return mark_phase(ax, stage1_rounds, label or f"stage two from round {stage1_rounds + 1}", last_round)


def palette(count: int) -> list:
    """``count`` colours, distinct up to 20: tab10, tab20 above 10 (repeating above 20)."""
    from matplotlib import colormaps

    cmap, size = (colormaps["tab10"], 10) if count <= 10 else (colormaps["tab20"], 20)
    return [cmap(i % size) for i in range(count)]


def cluster_starts(clusters: np.ndarray) -> list[int]:
    """The positions, among the clients ordered by true cluster, where a new cluster starts (0 and n left out)."""
    ends = np.cumsum(np.bincount(np.asarray(clusters, dtype=np.int64)))
    return sorted({int(e) for e in ends if 0 < e < len(clusters)})


# ---------------------------------------------------------------- the figures

def heatmap(counts: np.ndarray, path: Path, title: str, block: int = 1, by_cluster: bool = False,
            bounds=()):
    """counts[i, j]: how often client i averaged with peer j (summed over blocks of ``block`` clients a side);
    colour bar ticked at whole counts; ``by_cluster``: the clients are in the order of their true clusters;
    ``bounds``: the positions (in clients, in the heatmap's order) where a new true cluster starts, each drawn
    as a thin line between the blocks, at ``p / block - 0.5`` cells."""
    with print_style():
        fig = new_figure(WIDTH, 2.9)
        ax = fig.subplots()
        im = ax.imshow(counts, cmap="viridis", interpolation="nearest", vmin=0)
        per = ("" if block == 1 else f" (blocks of {block})") + (", by true cluster" if by_cluster else "")
        ax.set_xlabel("peer j" + per)
        ax.set_ylabel("client i" + per)
        integer_ticks(ax.xaxis)
        integer_ticks(ax.yaxis)
        for p in bounds:
            at = p / block - 0.5
            ax.axvline(at, color="white", lw=0.5, alpha=0.9)
            ax.axhline(at, color="white", lw=0.5, alpha=0.9)
        ax.set_title(title + ("\nwhite lines: between true clusters" if len(bounds) else ""))
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


LEGEND_CLUSTERS = 10   # more true clusters than this: one line of the legend says what colour means


def neighbor_graph(lists: np.ndarray, clusters: np.ndarray, path: Path, title: str, known: bool = True,
                   attackers=None):
    """``lists``: ``[n, m]`` index lists, or a bool ``[n, n]`` adjacency of older runs; ``known``: the clusters
    are the data's true ones (else one colour, no edge called wrong); ``attackers``: the ids of the clients
    that attack, crossed out in black.  The legend below names each cluster and its clients ("cluster c (n
    clients)"; above 10 clusters one line, "colour: true cluster (k clusters)") and the attackers."""
    from matplotlib.lines import Line2D

    clusters = np.asarray(clusters, dtype=np.int64)
    xy = circle_layout(clusters)
    ii, jj = list_edges(lists)
    same = clusters[ii] == clusters[jj] if known else np.ones(len(ii), dtype=bool)
    sizes = np.bincount(clusters) if len(clusters) else np.zeros(1, dtype=np.int64)
    colours = palette(len(sizes) if known else 1)
    bad = np.unique(np.asarray([] if attackers is None else attackers, dtype=np.int64))
    shown = [c for c in range(len(sizes)) if sizes[c]] if known else []
    note = None
    if len(shown) > LEGEND_CLUSTERS:
        note, shown = f"colour: true cluster ({len(shown)} clusters)", []
    entries = len(shown) + (len(bad) > 0)
    with print_style():
        fig = new_figure(WIDTH, 3.5 + 0.14 * (-(-entries // 2) + (note is not None)))
        ax = fig.subplots()
        for i, j, s in zip(ii, jj, same):
            ax.plot(xy[[i, j], 0], xy[[i, j], 1], color="0.6" if s else "red", lw=0.4, alpha=0.5, zorder=1)
        ax.scatter(xy[:, 0], xy[:, 1], c=[colours[c] for c in clusters] if known else [colours[0]] * len(clusters),
                   s=12, zorder=2)
        handles = [Line2D([], [], ls="", marker="o", ms=3.5, color=colours[c],
                          label=f"cluster {c} ({sizes[c]} client{'' if sizes[c] == 1 else 's'})") for c in shown]
        if len(bad):
            handles.append(ax.scatter(xy[bad, 0], xy[bad, 1], marker="x", color="black", s=22, linewidths=0.8,
                                      zorder=3, label=f"attacker ({len(bad)})"))
        ax.set_title(neighbor_graph_title(title, same, known))
        ax.set_axis_off()
        ax.set_aspect("equal")
        if handles or note:   # below the circle, where it covers no client
            fig.legend(handles=handles, loc="outside lower center", frameon=False, ncols=2, title=note,
                       title_fontsize=STYLE["legend.fontsize"])
        return _save(fig, path)


# legend lines broken to fit one printed column
ALL_SAME_LABEL = "measured: share of clients whose\nneighbours are all same-cluster"
PRECISION_LABEL = "mean neighbour precision\n(not the same quantity as Theorem 1)"
THEORY_LABEL = "Theorem 1: P(all k neighbours same-cluster)"


def cni_precision(rounds, measured, theory, path: Path, title: str, measured_is_share: bool = True,
                  note: str | None = None):
    """Stage one, per round: ``measured`` beside Theorem 1's P^t(k) (``theory``, rounds 1..T1).  ``measured``
    is the share of clients whose neighbours are all in their own cluster, the quantity Theorem 1 gives the
    probability of; runs that did not record it pass the mean neighbour precision with
    ``measured_is_share=False``, and the legend says it is another quantity.  ``note``: why Theorem 1 is not
    drawn, as the legend's title."""
    with print_style():
        fig = new_figure(WIDTH, 2.9 + (0.13 * (note.count("\n") + 1) if note else 0.0))
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
        fig.legend(loc="outside lower center", frameon=False, ncols=1, title=note,
                   title_fontsize=STYLE["legend.fontsize"])
        return _save(fig, path)


# the extra lines of accuracy.png's top panel: (record key, legend label, line style, colour); none dashed, so
# that a dashed line is always a phase mark
WORST_LABEL = "worst true cluster"
HONEST_LABEL = "honest clients (attackers left out)"
MEAN_LABEL = "mean over clients"
MARK_COLOURS = ("0.35", "tab:brown", "tab:purple")


def accuracy_curves(records: list[dict], path: Path, title: str, stage1_rounds: int | None = None, *,
                    marks: list[tuple[int, str]] | None = None, honest: bool = False):
    """Mean test accuracy (top) and loss (bottom) per evaluated round.  The top panel adds the worst true
    cluster's accuracy (``worst_cluster_accuracy``) where the records hold it and, where ``honest`` (the run
    had attackers), the honest clients' (``honest_accuracy``).  ``marks``: ``(R, label)`` of each phase that
    starts after round R (:func:`phase_marks`), each a dashed line in both panels; None: the stage-two line
    of ``stage1_rounds`` (None: no line).  The legend goes below the panels."""
    def series(key: str):
        return [(x["round"], v) for x in records if (v := _number(x.get(key))) is not None]

    acc, loss = series("accuracy"), series("loss")
    extra = [(label, points, ls, colour) for key, label, ls, colour in
             (("worst_cluster_accuracy", WORST_LABEL, ":", "tab:red"),
              ("honest_accuracy", HONEST_LABEL, "-.", "tab:green"))
             if (key != "honest_accuracy" or honest) and (points := series(key))]
    if marks is None:
        marks = [] if stage1_rounds is None else [(int(stage1_rounds), f"stage two from round {stage1_rounds + 1}")]
    last = max((x["round"] for x in records), default=None)
    shown_marks = [m for m in marks if last is None or last > m[0]]
    entries = (1 + len(extra) if extra and acc else len(extra)) + len(shown_marks)
    with print_style():
        fig = new_figure(WIDTH, 3.6 + 0.13 * max(0, entries - 1))
        a, b = fig.subplots(2, 1, sharex=True)
        marker = "o" if len(records) <= 20 else None
        handles = []
        for ax, points in ((a, acc), (b, loss)):
            if points:
                line, = ax.plot(*zip(*points), marker=marker, ms=3, label=MEAN_LABEL)
                if ax is a and extra:
                    handles.append(line)
        for label, points, ls, colour in extra:
            handles += a.plot(*zip(*points), ls=ls, color=colour, marker=marker, ms=2.5, label=label)
        a.set_ylabel("test accuracy (%)" if extra else "mean test accuracy (%)")
        b.set_ylabel("mean test loss")
        b.set_xlabel("round")
        for ax in (a, b):
            integer_ticks(ax.xaxis)
        for i, (after, label) in enumerate(shown_marks):
            colour = MARK_COLOURS[i % len(MARK_COLOURS)]
            line = mark_phase(a, after, label, last, colour)
            mark_phase(b, after, label, last, colour)
            handles.append(line)
        if handles:   # below the panels, where it covers no data
            fig.legend(handles=handles, loc="outside lower center", frameon=False)
        fig.suptitle(title)
        return _save(fig, path)


PARTITION_BARS = 200   # more clients than this: stacked steps instead of one bar per client


def partition_figure(counts: np.ndarray, clusters: np.ndarray, path: Path, title: str,
                     ylabel: str = "training examples"):
    """``counts [n, K]``: each client's training examples by label; a stacked bar per client (clients in the
    order of their true clusters, ``clusters [n]``, a thin line between clusters), one colour per label.  Above
    PARTITION_BARS clients the stacks are steps, and within each cluster the clients go by their most common
    label, then by size (largest first), so that the split's shape shows at print size."""
    counts = np.asarray(counts)
    clusters = np.asarray(clusters, dtype=np.int64)
    n, K = counts.shape
    many = n > PARTITION_BARS
    order = (np.lexsort((-counts.sum(1), counts.argmax(1), clusters)) if many
             else np.argsort(clusters, kind="stable"))
    shown = counts[order]
    x = np.arange(n)
    colours = palette(K) if K <= 20 else None
    legend_rows = -(-K // 10) if K <= 20 else 0
    with print_style():
        fig = new_figure(WIDTH if n <= 50 else WIDE, 2.5 + 0.14 * legend_rows + 0.13 * title.count("\n"))
        ax = fig.subplots()
        if colours is None:
            from matplotlib import colormaps

            cmap = colormaps["viridis"]
            colours = [cmap(c / max(K - 1, 1)) for c in range(K)]
        bottom = np.zeros(n)
        for c in range(K):
            if not many:
                ax.bar(x, shown[:, c], bottom=bottom, width=0.8 if n <= 50 else 1.0, color=colours[c], lw=0,
                       label=str(c))
            else:
                ax.fill_between(x, bottom, bottom + shown[:, c], step="mid", color=colours[c], lw=0, label=str(c))
            bottom = bottom + shown[:, c]
        for p in cluster_starts(clusters):
            ax.axvline(p - 0.5, color="0.15", lw=0.6, zorder=3)
        ax.set_xlim(-0.5, n - 0.5)
        in_order = bool((order == np.arange(n)).all())
        if n <= 20:
            ax.set_xticks(x, [str(i) for i in order])
        else:
            integer_ticks(ax.xaxis)
        ax.set_xlabel(("clients by true cluster, then most common label" if many else
                       "client" if in_order else "client, by true cluster")
                      + (" (lines: between true clusters)" if cluster_starts(clusters) else ""))
        ax.set_ylabel(ylabel)
        integer_ticks(ax.yaxis)
        ax.set_title(title)
        if K <= 20:   # below the axes, where it covers no bar
            fig.legend(loc="outside lower center", frameon=False, ncols=min(K, 10), title="label",
                       title_fontsize=STYLE["legend.fontsize"], handlelength=1.0, columnspacing=0.8)
        else:
            from matplotlib.cm import ScalarMappable
            from matplotlib.colors import Normalize

            fig.colorbar(ScalarMappable(Normalize(0, K - 1), "viridis"), ax=ax, label=f"label ({K} labels)")
        return _save(fig, path)


def partition_shown(cfg) -> bool:
    """Whether the run's pool split is one worth a figure: dirichlet or shards, or sizes skewed."""
    data = getattr(cfg, "data", None)
    return (getattr(data, "partition", "iid") in ("dirichlet", "shards")
            or float(getattr(data, "quantity_skew", 0.0) or 0.0) > 0)


def partition_counts(cfg) -> tuple[np.ndarray, np.ndarray] | None:
    """``(counts [n, K], clusters [n])``: each client's training examples by raw label (before any cluster's
    label swap), exactly as the run split the pool (the data set's ``client_rows`` for every client, with the
    run's seed), and its true cluster; None for a data set that is not a pool (its clients are its own)."""
    ds = dataset(cfg.data)
    if not isinstance(ds, PoolDataSet):
        return None
    n = int(cfg.clients)
    raw = ds.raw(cfg.data)
    K = int(ds.num_classes(cfg.data))
    rows, _ = ds.client_rows(cfg.data, raw, n, int(cfg.seed), torch.arange(n))
    index, real = rows[0]                                   # the training split
    counts = torch.zeros(n, K, dtype=torch.int64)
    for at in range(0, n, 4096):                            # a block of clients at a time: little memory
        y = raw.train_y[index[at:at + 4096]].to(torch.int64)
        keep = torch.ones_like(y) if real is None else real[at:at + 4096].to(torch.int64)
        counts[at:at + 4096].scatter_add_(1, y, keep)
    clusters = cluster_of_clients(n, cfg.data.num_clusters, cfg.data.cluster_sizes)
    return counts.numpy(), clusters.numpy()


def partition_title(name: str, cfg) -> str:
    """"NAME: training examples by label" and the split in words ("dirichlet α=0.1, quantity skew 1.5"); where
    clusters swap labels, that the labels are the pool's, before the swap."""
    data = cfg.data
    parts = []
    if data.partition == "dirichlet":
        parts.append(f"dirichlet α={data.alpha:g}")
    elif data.partition == "shards":
        parts.append(f"shards, {data.shards_per_client} per client")
    if float(data.quantity_skew or 0) > 0:
        parts.append(f"quantity skew {data.quantity_skew:g}")
    swapped = getattr(data, "clusters", None) == "label_swap" and int(getattr(data, "num_clusters", 1)) > 1
    return (f"{name}: training examples by label\n{', '.join(parts)}"
            + ("\nlabels of the pool, before each cluster's label swap" if swapped else ""))


def heatmap_title(name: str, cfg) -> str:
    """What the stage-one counts cover: stage one for a method with stages, else rounds 1..T, T =
    min(stage1_rounds, rounds) (the runner adds a round's averaging to the counts up to that round)."""
    try:
        staged = registry.get(cfg.algorithm.name).needs_stages
    except ConfigError:
        staged = False
    if staged:
        return f"{name}: aggregations in stage one"
    t = min(int(cfg.stage1_rounds), int(cfg.rounds))
    return f"{name}: aggregations in round 1" if t == 1 else f"{name}: aggregations in rounds 1–{t}"


def _drawn(name: str, draw, written: list[str], warn) -> None:
    """Draw one figure; one that fails is reported through ``warn`` and the others are still drawn."""
    try:
        draw()
    except Exception as exc:   # matplotlib, fonts, odd data, a data set that cannot be read again
        warn(f"figures/{name} not drawn ({type(exc).__name__}: {exc}); the other figures stand")
        return
    written.append(name)


def write_run_figures(run_dir: str | Path, summary: dict, cfg, records: list[dict] | None = None,
                      warn=_warn) -> list[str]:
    """All figures the run's saved arrays allow; returns the file names.  ``records``: the run's metrics
    records (the runner's history); None reads them from metrics.jsonl, skipping lines that are not records
    with a warning naming file and line.  A figure that cannot be drawn is reported through ``warn``; the
    others are still drawn."""
    run_dir = Path(run_dir)
    fig_dir = run_dir / "figures"
    fig_dir.mkdir(exist_ok=True)
    if records is None:
        p = run_dir / "metrics.jsonl"
        records = read_records(p, warn) if p.is_file() else []
    name = summary["algorithm"]
    written: list[str] = []
    if records:
        marks = phase_marks(cfg, warn)
        _drawn("accuracy.png", lambda: accuracy_curves(records, fig_dir / "accuracy.png",
                                                       f"{name}: accuracy and loss", marks=marks,
                                                       honest=attack_fraction(cfg) > 0), written, warn)
    if partition_shown(cfg):
        def draw_partition():
            got = partition_counts(cfg)
            if got is None:   # not a pool: no split of ours to show
                raise ValueError(f"data set {cfg.data.name!r} is not a pool split over clients")
            validation = float(getattr(cfg.data, "validation", 0.0) or 0.0)
            partition_figure(*got, fig_dir / "partition.png", partition_title(name, cfg),
                             "training examples" + (" (validation\nhold-out included)" if validation > 0 else ""))

        _drawn("partition.png", draw_partition, written, warn)
    npz = run_dir / "neighbors.npz"
    if not npz.exists():
        return written
    arrays = np.load(npz)
    known = "clusters" in arrays   # absent: the data gives no true clusters
    clusters = arrays["clusters"] if known else np.zeros(cfg.clients, dtype=np.int64)   # one colour in the graph
    table, block, by_cluster = _stage_one_table(arrays, clusters, known, cfg.clients)
    if table is not None and table.any():
        bounds = cluster_starts(clusters) if known else []
        _drawn("heatmap_stage1.png", lambda: heatmap(table, fig_dir / "heatmap_stage1.png", heatmap_title(name, cfg),
                                                     block, by_cluster, bounds), written, warn)
    if known and "similarity_client0" in arrays and np.isfinite(arrays["similarity_client0"]).any():
        _drawn("similarity_hist.png", lambda: similarity_histogram(
            arrays["similarity_client0"], clusters, 0, fig_dir / "similarity_hist.png",
            f"{name}: client 0's similarities after stage one"), written, warn)
    if "final_lists" in arrays and len(list_edges(arrays["final_lists"])[0]):
        attackers = arrays["attackers"] if "attackers" in arrays else None
        _drawn("neighbor_graph.png", lambda: neighbor_graph(
            arrays["final_lists"], clusters, fig_dir / "neighbor_graph.png",
            f"{name}: neighbour lists, round {summary['rounds_completed']}", known, attackers), written, warn)
    stage1 = [x for x in records if x.get("stage") == 1 and _number(x.get("neighbor_precision")) is not None]
    try:
        stage_one_figures = registry.get(cfg.algorithm.name).stage_one_figures
    except ConfigError:   # a plug-in algorithm not imported here
        stage_one_figures = False
    if stage1 and stage_one_figures:
        _drawn("cni_precision.png", lambda: _cni_figure(stage1, clusters, known, cfg, fig_dir / "cni_precision.png",
                                                        f"{name}: stage one"), written, warn)
    return written


def _stage_one_table(arrays, clusters: np.ndarray, known: bool, n: int):
    """``(table, block, by_cluster)``: who averaged with whom over stage one as the heatmap draws it (None: no
    counts kept), each cell a block of ``block`` clients a side, clients in the order of their true clusters
    where that is not their ids' order (``by_cluster``), so that every cluster shows as a block."""
    order = np.argsort(clusters, kind="stable")
    by_cluster = known and bool((np.diff(clusters) < 0).any())
    rank = np.argsort(order, kind="stable") if by_cluster else np.arange(len(clusters))
    if "stage1_peers" in arrays:   # count lists; runs before them kept the [n, n] table
        peers = arrays["stage1_peers"]
        if by_cluster:
            peers = np.where(peers >= 0, rank[np.clip(peers, 0, None)], -1)[order]
        counts = arrays["stage1_counts"][order] if by_cluster else arrays["stage1_counts"]
        table, block = count_table(peers, counts, n)
        return table, block, by_cluster
    kept: np.ndarray | None = arrays["stage1_counts"] if "stage1_counts" in arrays else None
    if kept is not None and by_cluster:
        kept = kept[np.ix_(order, order)]
    return kept, 1, by_cluster


def _cni_figure(stage1: list[dict], clusters: np.ndarray, known: bool, cfg, path: Path, title: str):
    """cni_precision.png from the stage-one records, Theorem 1 beside them only where its assumptions hold (the
    complete graph, every client online, every model delivered, no attacker, clusters of one size); else the
    legend says why it is left out."""
    theory, note = None, None
    sizes = np.bincount(clusters) if known else np.array([cfg.clients // cfg.data.num_clusters])
    breaks = theorem_1_breaks(cfg)
    if len(set(sizes[sizes > 0].tolist())) != 1:   # Theorem 1 is for clusters of one size
        breaks.append(("clusters of one size", "clients per cluster " + ", ".join(map(str, sizes[sizes > 0]))))
    if breaks:
        note = theorem_1_note(breaks)
    else:
        try:
            a = int(sizes[sizes > 0][0])
            theory = cni_probabilities(cfg.clients, a, cfg.algorithm.l, cfg.algorithm.k, cfg.stage1_rounds)
        except Exception as exc:  # theory needs an even split etc.; the measured curve still stands alone
            note = "\n".join(textwrap.wrap(f"Theorem 1 not drawn: {exc}", 52))
    # the share of clients with all neighbours same-cluster where every stage-one record holds it
    share = [_number(x.get("neighbor_all_same_share")) for x in stage1]
    is_share = all(v is not None for v in share)
    measured = share if is_share else [_number(x["neighbor_precision"]) for x in stage1]
    return cni_precision([x["round"] for x in stage1], measured, theory, path, title, measured_is_share=is_share,
                         note=note)
