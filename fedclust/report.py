"""``fedclust report RUN_DIR ...``: a results table (mean ± std over seeds
per label and data setting) beside the paper's numbers for that setting
(PANM paper Table 2's Fashion-MNIST column for Fashion-MNIST with 2
rotations, FPFC paper Table 1 for clustered Synthetic with 4 clusters), and
one figure with every run's accuracy curve."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fedclust.algorithms import registry

def paper_table() -> dict[tuple, dict[str, tuple[float, float]]]:
    """(data set, cluster kind or None for any, number of clusters) -> {algorithm: (mean, std)}, from
    what each registered algorithm declares (``paper_results``): PANM paper Table 2's Fashion-MNIST column
    (docs/results_fmnist.md), FPFC paper Table 1 (clustered Synthetic, m = 100, L = 4)."""
    table: dict[tuple, dict] = {}
    for cls in registry.classes():
        for key, numbers in cls.paper_results.items():
            table.setdefault(key, {})[cls.name] = numbers
    return table


def _position(name: str) -> float:
    classes = {c.name: c for c in registry.classes()}
    return classes[name].report_position if name in classes else float("inf")


def load_runs(dirs) -> list[dict]:
    runs = []
    for d in dirs:
        p = Path(d) / "summary.json"
        if p.is_file():
            s = json.loads(p.read_text())
            s["_dir"] = str(d)
            if "true_clusters" not in s and (Path(d) / "config.yaml").is_file():   # runs from before the field
                import yaml

                data = (yaml.safe_load((Path(d) / "config.yaml").read_text()) or {}).get("data", {})
                s.update(data=data.get("name", s.get("data")), data_clusters=data.get("clusters"),
                         true_clusters=data.get("num_clusters"))
            runs.append(s)
    return runs


def setting(run: dict) -> tuple[str, str, int]:
    """(data set, cluster kind, number of true clusters) of a run; a summary
    without them counts as PANM paper's Fashion-MNIST with 2 rotations."""
    return (run.get("data") or "fmnist", run.get("data_clusters") or "rotation", int(run.get("true_clusters") or 2))


def paper_numbers(run: dict) -> dict:
    """The paper's numbers for the run's setting ({} where no paper reports it)."""
    data, kind, k = setting(run)
    papers = paper_table()
    return papers.get((data, kind, k)) or papers.get((data, None, k)) or {}


def _setting_text(key: tuple[str, str, int]) -> str:
    data, kind, k = key
    return f"{data} {k} clusters" if data == "synthetic" else f"{data} {kind} x{k}"


def _mean_std(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _fmt(m, s, digits=2):
    return "" if m is None else f"{m:.{digits}f} ±{s:.{digits}f}"


def _order(label: str) -> tuple[float, str]:
    """Table order: the algorithm's declared ``report_position`` (a label's first word names it), then the label."""
    return (_position(label.split()[0].split("[")[0]), label)


def table(runs: list[dict]) -> str:
    by_alg: dict[tuple, list[dict]] = {}
    for r in runs:
        by_alg.setdefault((setting(r), r.get("label") or r["algorithm"]), []).append(r)
    several = len({key for key, _ in by_alg}) > 1
    head = ("| method | seeds | final acc. (ours) | paper | diff | best acc. | precision | recall | clusters | ARI "
            "| models received per client | most received in a round | s/round |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = [head]
    for key in sorted(by_alg, key=lambda k: (k[0], _order(k[1]))):
        rs = by_alg[key]
        alg = f"{key[1]} ({_setting_text(key[0])})" if several else key[1]
        fm, fs = _mean_std([r["final_accuracy"] for r in rs])
        bm, bs = _mean_std([r["best_accuracy"] for r in rs])
        pm, ps = _mean_std([r.get("neighbor_precision") for r in rs])
        qm, qs = _mean_std([r.get("neighbor_recall") for r in rs])
        km, _ = _mean_std([r.get("num_clusters") for r in rs])
        am, as_ = _mean_std([r.get("ari") for r in rs])
        tm, _ = _mean_std([r.get("mean_round_seconds") for r in rs])
        rm, _ = _mean_std([r.get("models_received_per_client") for r in rs])
        xm, _ = _mean_std([r.get("max_models_received_per_round") for r in rs])
        paper = paper_numbers(rs[0]).get(rs[0]["algorithm"])
        rows.append("| " + " | ".join([
            alg, str(len(rs)), _fmt(fm, fs), _fmt(*paper) if paper else "",
            f"{fm - paper[0]:+.2f}" if paper and fm is not None else "", _fmt(bm, bs), _fmt(pm, ps, 3),
            _fmt(qm, qs, 3), "" if km is None else f"{km:.1f}", _fmt(am, as_, 3),
            "" if rm is None else f"{rm:.0f}", "" if xm is None else f"{xm:.0f}",
            "" if tm is None else f"{tm:.2f}"]) + " |")
    return "\n".join(rows) + "\n"


def mean_curves(runs: list[dict]) -> dict[str, tuple[list[int], list[float], int]]:
    """Per label: (rounds, accuracy averaged over the label's seeds, seeds), on
    the rounds every one of its runs evaluated."""
    by_label: dict[str, list[dict[int, float]]] = {}
    for r in runs:
        recs = [json.loads(x) for x in (Path(r["_dir"]) / "metrics.jsonl").read_text().splitlines() if x.strip()]
        by_label.setdefault(r.get("label") or r["algorithm"], []).append({x["round"]: x["accuracy"] for x in recs})
    out = {}
    for label in sorted(by_label, key=_order):
        seeds = by_label[label]
        rounds = sorted(set.intersection(*(set(c) for c in seeds)))
        out[label] = (rounds, [statistics.fmean(c[t] for c in seeds) for t in rounds], len(seeds))
    return out


def curves(runs: list[dict], path: Path) -> None:
    """One line per label: mean test accuracy over its seeds, per round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (rounds, acc, seeds) in mean_curves(runs).items():
        ax.plot(rounds, acc, lw=1, label=f"{label} ({seeds} seed{'s' if seeds > 1 else ''})")
    ax.set_xlabel("round")
    ax.set_ylabel("mean test accuracy (%)")
    ax.set_ylim(bottom=max(0.0, ax.get_ylim()[0]))
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="fedclust report", description=__doc__)
    p.add_argument("runs", nargs="+", help="run directories (each with summary.json)")
    p.add_argument("--curves", help="write a PNG of the accuracy curves here (one line per label, mean over seeds)")
    args = p.parse_args(argv)
    runs = load_runs(args.runs)
    if not runs:
        print("fedclust report: no summary.json in the given directories")
        return 2
    print(table(runs), end="")
    if args.curves:
        curves(runs, Path(args.curves))
    return 0
