"""The tables and figures of docs/results_network.md from the runs of experiments/network_conditions.sh.

    python experiments/network_table.py runs/network [--docs docs]

Reads OUT/<condition>/<method>-s<seed>/summary.json; for each group of conditions (graphs, offline, attack)
writes a table of the final accuracy, the neighbour precision and the worst-cluster accuracy (the honest
clients' accuracy too under attack), mean ± std over the seeds present, and one figure per group; prints the
Markdown and writes the figures beside it.  A condition or method with no finished run is shown as "-".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

METHODS = ["panm_grad", "panm_loss", "pens", "random", "local"]
GROUPS = {
    "graphs": ["complete", "ring", "regular4", "regular8", "small_world8"],
    "offline": ["complete", "offline10", "offline30", "offline50"],
    "attack": ["complete", "signflip10", "signflip20"],
}
TITLES = {"complete": "complete", "ring": "ring (k=2)", "regular4": "4-regular (k=4)", "regular8": "8-regular",
          "small_world8": "small world (8, 0.1)", "offline10": "10% offline", "offline30": "30% offline",
          "offline50": "50% offline", "signflip10": "10% sign-flip", "signflip20": "20% sign-flip"}
FIELDS = {"final_accuracy": "accuracy", "neighbor_precision": "precision", "worst_cluster_accuracy": "worst cluster",
          "honest_accuracy": "honest"}


def summaries(out: Path, cond: str, method: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / cond).glob(f"{method}-s*/summary.json"))]


def cell(values: list[float | None], scale: float = 1.0) -> str:
    vals = [v * scale for v in values if v is not None]
    if not vals:
        return "-"
    if len(vals) == 1:
        return f"{vals[0]:.2f}"
    return f"{statistics.mean(vals):.2f} ± {statistics.stdev(vals):.2f}"


def table(out: Path, conds: list[str], fields: list[str]) -> list[str]:
    head = "| method | " + " | ".join(f"{TITLES[c]}: {FIELDS[f]}" for c in conds for f in fields) + " |"
    lines = [head, "| --- |" + " --- |" * (len(conds) * len(fields))]
    for m in METHODS:
        row = []
        for c in conds:
            runs = summaries(out, c, m)
            for f in fields:
                row.append(cell([r.get(f) for r in runs], 100.0 if f == "neighbor_precision" else 1.0))
        lines.append(f"| {m} | " + " | ".join(row) + " |")
    return lines


def figure(out: Path, conds: list[str], path: Path, title: str) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    width = 0.8 / len(METHODS)
    drawn = False
    for ax, field in zip(axes, ("final_accuracy", "worst_cluster_accuracy")):
        for i, m in enumerate(METHODS):
            ys = []
            for c in conds:
                vals = [r.get(field) for r in summaries(out, c, m) if r.get(field) is not None]
                ys.append(statistics.mean(vals) if vals else float("nan"))
            drawn |= any(y == y for y in ys)
            ax.bar([x + i * width for x in range(len(conds))], ys, width, label=m)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(conds))], [TITLES[c] for c in conds], rotation=20,
                      fontsize=7)
        ax.set_title({"final_accuracy": "final accuracy (%)", "worst_cluster_accuracy": "worst cluster (%)"}[field],
                     fontsize=9)
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=len(METHODS), fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    if drawn:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--docs", type=Path, default=Path("docs"))
    args = p.parse_args(argv)
    args.docs.mkdir(parents=True, exist_ok=True)
    lines = []
    for group, conds in GROUPS.items():
        fields = ["final_accuracy", "neighbor_precision", "worst_cluster_accuracy"]
        if group == "attack":
            fields = ["final_accuracy", "honest_accuracy", "worst_cluster_accuracy"]
        lines += [f"### {group}", ""] + table(args.out, conds, fields) + [""]
        png = args.docs / f"network_{group}.png"
        if figure(args.out, conds, png, f"Fashion-MNIST, 4 rotations: {group}"):
            lines += [f"![{group}]({png.name})", ""]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
