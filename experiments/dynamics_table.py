"""The tables and curves of docs/results_dynamics.md from the runs of experiments/dynamics.sh.

    python experiments/dynamics_table.py runs/dynamics [--docs docs]

Reads OUT/<drift|join>/<method>-s<seed>/{summary.json,metrics.jsonl} and prints, mean ± std over the seeds
present, for drift: the final accuracy, the moved clients' accuracy before the drift (the mean of the 10 evaluated
rounds before it) and over the 50 rounds after it, the rounds until they are back within 1 point (summary.json's
``drift``), the neighbour precision and the ARI of the clusters found (a method's own assignment, or its lists'
components) against the current truth just before the drift and at the end, and where the
moved clients end (neighbors.npz: the share of their final list entries in their new cluster and in their old one;
for a method with an assignment and no lists, the share assigned to the model their new, and their old, cluster's
stayers mostly hold); for late
joiners: the final accuracy, the joiners' and the incumbents' accuracy and precision over the rounds after the
join (summary.json's ``join``) and the rounds until the joiners are within 1 point of the incumbents.  Writes
one figure per condition beside the Markdown (docs/dynamics_drift.png, docs/dynamics_join.png).  A method with no
finished run is shown as "-".
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

METHODS = ["random", "oracle", "panm_grad", "panm_loss", "pens", "dac", "ifca", "dfca", "facade", "dpfl", "cobo"]


def runs(out: Path, cond: str, method: str) -> list[tuple[dict, list[dict], Path]]:
    """Each finished run's summary, metric records and folder."""
    found = []
    for p in sorted((out / cond).glob(f"{method}-s*/summary.json")):
        records = [json.loads(line) for line in (p.parent / "metrics.jsonl").read_text().splitlines() if line]
        found.append((json.loads(p.read_text()), records, p.parent))
    return found


def moved_lists(folder: Path) -> tuple[float | None, float | None]:
    """Where the moved clients end (neighbors.npz), percent, as (with their new cluster, with their old one): for
    a method with lists, the share of the moved clients' final list entries in the client's current cluster and in
    its cluster before the drift; for a method with a cluster assignment and no lists (IFCA), the share of moved
    clients assigned to the model most of their new cluster's clients that stayed hold, and to the one most of their
    old cluster's stayers hold.  None: neither is saved, or nobody moved."""
    path = folder / "neighbors.npz"
    if not path.exists():
        return None, None
    import numpy as np

    z = np.load(path)
    if "drift_clusters" not in z:
        return None, None
    first, last = z["drift_clusters"][0], z["drift_clusters"][-1]
    moved = np.nonzero(first != last)[0]
    if "final_lists" in z:
        entries = [(i, j) for i in moved for j in z["final_lists"][i] if j >= 0]
        if not entries:
            return None, None
        now = sum(last[j] == last[i] for i, j in entries) / len(entries)
        before = sum(first[j] == first[i] for i, j in entries) / len(entries)
        return 100.0 * float(now), 100.0 * float(before)
    if "assignment" not in z or not len(moved):
        return None, None
    a, stayed = z["assignment"], first == last

    def modal(cluster: int) -> int:
        held = a[stayed & (last == cluster)]
        return int(np.bincount(held).argmax()) if len(held) else -1

    now = np.mean([a[i] == modal(last[i]) for i in moved])
    before = np.mean([a[i] == modal(first[i]) for i in moved])
    return 100.0 * float(now), 100.0 * float(before)


def cell(values: list[float | None], digits: int = 2) -> str:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f}"
    return f"{statistics.mean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f}"


def at(records: list[dict], field: str, last_round: int) -> float | None:
    """``field`` in the last evaluated record at or before ``last_round`` (None: none has it)."""
    rows = [r for r in records if r["round"] <= last_round and r.get(field) is not None]
    return rows[-1][field] if rows else None


def percent(v: float | None) -> float | None:
    return None if v is None else 100.0 * v


def drift_row(summary: dict, records: list[dict], folder: Path) -> dict:
    event = summary["drift"][0]
    t = event["round"]
    before = [r["drift_moved_accuracy"][0] for r in records if t - 10 <= r["round"] < t]
    back = event["recovery_rounds"]
    return {"final": summary["final_accuracy"], "pre": statistics.mean(before) if before else None,
            "after": event["accuracy_after"], "recover": None if back is None else float(back),
            "never": back is None, "prec_before": percent(at(records, "neighbor_precision", t - 1)),
            "prec_end": percent(summary.get("neighbor_precision")),
            "ari_before": at(records, "ari", t - 1), "ari_end": summary.get("ari"),
            **dict(zip(("lists_now", "lists_before"), moved_lists(folder), strict=True))}


def join_row(summary: dict, records: list[dict], folder: Path) -> dict:
    j = summary["join"]
    back = j["catch_up_rounds"]
    return {"final": summary["final_accuracy"], "joiner": j["joiner_accuracy_after"],
            "incumbent": j["incumbent_accuracy_after"], "joiner_prec": percent(j["joiner_neighbor_precision_after"]),
            "incumbent_prec": percent(j["incumbent_neighbor_precision_after"]),
            "catch_up": None if back is None else float(back), "never": back is None}


COLUMNS = {
    "drift": [("final", "final accuracy"), ("pre", "moved: before"), ("after", "moved: 50 rounds after"),
              ("recover", "moved: rounds to recover"), ("prec_before", "precision before"),
              ("prec_end", "precision at the end"), ("ari_before", "ARI before"), ("ari_end", "ARI at the end"),
              ("lists_now", "moved: with their new cluster"),
              ("lists_before", "moved: with their old cluster")],
    "join": [("final", "final accuracy"), ("joiner", "joiners after"), ("incumbent", "incumbents after"),
             ("joiner_prec", "joiners' precision"), ("incumbent_prec", "incumbents' precision"),
             ("catch_up", "rounds to catch up")],
}


def table(out: Path, cond: str) -> list[str]:
    make = drift_row if cond == "drift" else join_row
    cols = COLUMNS[cond]
    lines = ["| method | seeds | " + " | ".join(t for _, t in cols) + " |", "| --- | --- |" + " --- |" * len(cols)]
    for m in METHODS:
        rows = [make(s, r, d) for s, r, d in runs(out, cond, m)]
        cells = []
        for key, _ in cols:
            text = cell([r[key] for r in rows], 0 if key in ("recover", "catch_up") else 2)
            never = sum(r["never"] for r in rows) if key in ("recover", "catch_up") else 0
            if never:
                text = "never" if never == len(rows) else f"{text} (never in {never})"
            cells.append(text)
        lines.append(f"| {m} | {len(rows)} | " + " | ".join(cells) + " |")
    return lines


def style(i: int) -> dict:
    """The i-th method's line, the same in every panel (a panel without the method's series skips it, so the
    axes' own colour cycles would disagree): tab10's ten colours, then again dashed."""
    return {"color": f"C{i % 10}", "linestyle": "-" if i < 10 else "--"}


def figure(out: Path, cond: str, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {"drift": [("accuracy", "every client's accuracy (%)"),
                        ("drift_moved_accuracy", "the moved clients' accuracy (%)"),
                        ("neighbor_precision", "neighbour precision (current truth, %)")],
              "join": [("accuracy", "every client's accuracy (%)"), ("joiner_accuracy", "the joiners' accuracy (%)"),
                       ("joiner_neighbor_precision", "the joiners' neighbour precision (%)")]}[cond]
    fig, axes = plt.subplots(1, len(series), figsize=(13, 3.6))
    drawn = False
    for i, m in enumerate(METHODS):
        found = runs(out, cond, m)
        if not found:
            continue
        records = found[0][1]   # the first seed's curve
        for ax, (field, _) in zip(axes, series, strict=True):
            pts = [(r["round"], r[field][0] if isinstance(r.get(field), list) else r.get(field)) for r in records]
            pts = [(x, y * (100.0 if "precision" in field else 1.0)) for x, y in pts if y is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=m, linewidth=0.9, **style(i))
                drawn = True
    for ax, (_, title) in zip(axes, series, strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round", fontsize=8)
        ax.axvline(150, color="grey", linewidth=0.6, linestyle=":")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(METHODS), fontsize=7)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    if drawn:
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--docs", type=Path, default=Path("docs"))
    args = p.parse_args(argv)
    args.docs.mkdir(parents=True, exist_ok=True)
    lines = []
    for cond in ("drift", "join"):
        lines += [f"### {cond}", ""] + table(args.out, cond) + [""]
        png = args.docs / f"dynamics_{cond}.png"
        if figure(args.out, cond, png):
            lines += [f"![{cond}]({png.name})", ""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
