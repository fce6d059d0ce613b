"""The tables of docs/results_paper_settings.md from the run directories of experiments/sets/paper_settings.txt:
one table per setting (the list's folders), one row per run, in the list's order, from each run's summary.json,
config.yaml and the last record of metrics.jsonl (precision and ARI left blank where the data has one true
cluster or none known).  Per-cluster accuracy: the mean final accuracy of each true cluster's clients (contiguous
blocks of data.cluster_sizes, else near-equal ones, as fedclust deals them).

    python3 experiments/paper_settings_table.py runs > table.md
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import yaml

from fedclust.data.partition import block_sizes

LIST = Path(__file__).parent / "sets" / "paper_settings.txt"


def fmt(x, scale: float = 1.0, digits: int = 2) -> str:
    return "" if x is None else f"{x * scale:.{digits}f}"


def row(run: Path) -> dict | None:
    if not (run / "summary.json").exists():
        return None
    s = json.loads((run / "summary.json").read_text())
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    last = json.loads((run / "metrics.jsonl").read_text().strip().splitlines()[-1])
    acc = last.get("client_accuracy") or []
    data = cfg.get("data") or {}
    count = int(data.get("num_clusters") or 1)
    clusters = ""
    if data.get("name") != "npz" and count > 1 and acc:
        cuts = [0]
        for b in block_sizes(len(acc), count, data.get("cluster_sizes") or ()):
            cuts.append(cuts[-1] + b)
        means = [sum(acc[a:b]) / (b - a) for a, b in zip(cuts, cuts[1:])]
        clusters = " / ".join(f"{m:.1f}" for m in means)
    return {
        "label": s.get("label") or s["algorithm"], "accuracy": s.get("final_accuracy"),
        "worst": s.get("worst_cluster_accuracy") if (s.get("true_clusters") or 0) > 1 else None, "clusters": clusters,
        "oracle_head": s.get("final_accuracy_oracle_head"),
        # one true cluster (or none known): every peer is in it, so precision and ARI say nothing
        "precision": s.get("neighbor_precision") if (s.get("true_clusters") or 0) > 1 else None,
        "ari": s.get("ari") if (s.get("true_clusters") or 0) > 1 else None,
        "seconds": s.get("mean_round_seconds"), "rounds": s.get("rounds_completed"),
    }


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "runs")
    settings: dict[str, list[str]] = defaultdict(list)
    for line in LIST.read_text().splitlines():
        if line.strip():
            d = line.split()[0]
            settings[str(Path(d).parent)].append(d)
    for setting, dirs in settings.items():
        rows = [r for r in (row(root / d) for d in dirs) if r is not None]
        missing = [Path(d).name for d in dirs if not (root / d / "summary.json").exists()]
        print(f"### {setting}\n")
        print("| run | accuracy | worst cluster | per cluster | precision | ARI | rounds | s / round |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            acc = fmt(r["accuracy"])
            if r["oracle_head"] is not None:
                acc += f" (oracle head {fmt(r['oracle_head'])})"
            print(f"| {r['label']} | {acc} | {fmt(r['worst'])} | {r['clusters']} | {fmt(r['precision'], 100, 1)} | "
                  f"{fmt(r['ari'])} | {r['rounds']} | {fmt(r['seconds'])} |")
        if missing:
            print(f"\nNot run: {', '.join(missing)}.")
        print()


if __name__ == "__main__":
    main()
