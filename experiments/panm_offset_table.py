"""The table of docs/results_fmnist.md's "The PANM offset" from the runs of experiments/panm_offset.sh.

    python experiments/panm_offset_table.py runs/offset

Reads OUT/<normalize>/v<0|20>/<method>-s<seed>/{summary.json,metrics.jsonl} and prints, per method and input
scaling, mean ± std over the seeds present, the accuracy under each evaluation protocol, beside the PANM paper's
Table 2 (Fashion-MNIST, 2 rotations):
  final       the last round's accuracy, mean over clients (fedclust's default; summary.json's final_accuracy);
  best round  the highest of the per-round means (one round for all clients);
  best test   each client's highest test accuracy over the rounds, then the mean over clients (a client picking
              its round by its test images; ``fedclust report --metrics best_test_accuracy`` reads the same);
  best val    each client's test accuracy at its best-validation round, mean over clients (summary.json's
              best_validation_accuracy; v20 runs: 20% of the training images held out);
and, for v20, its final accuracy (trained on 160 images, not 200). A missing run is shown as "-".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynamics_table import cell  # noqa: E402  (mean ± std over seeds, "-" for none)

from fedclust.report import best_test_accuracy  # noqa: E402  (the report's reading: --metrics best_test_accuracy)

METHODS = ["local", "random", "panm_grad"]
NORMS = ["standard", "unit", "symmetric"]
PAPER = {"local": 76.24, "random": 85.94, "panm_grad": 86.88}   # PANM, Table 2, Fashion-MNIST
COLUMNS = ["final", "best round", "best test", "best val", "final (v20)"]


def runs(folder: Path, method: str) -> list[tuple[dict, list[dict], Path]]:
    """Each finished run's summary, evaluated records and directory, by seed."""
    found = []
    for p in sorted(folder.glob(f"{method}-s*/summary.json")):
        lines = (p.parent / "metrics.jsonl").read_text().splitlines()
        records = [r for r in (json.loads(x) for x in lines if x) if r.get("client_accuracy") is not None]
        found.append((json.loads(p.read_text()), records, p.parent))
    return found


def best_round(records: list[dict]) -> float | None:
    return max((r["accuracy"] for r in records), default=None)


def measures(out: Path, norm: str, method: str) -> dict[str, list[float | None]]:
    v0, v20 = runs(out / norm / "v0", method), runs(out / norm / "v20", method)
    return {"final": [s["final_accuracy"] for s, _, _ in v0],
            "best round": [best_round(r) for _, r, _ in v0],
            "best test": [best_test_accuracy(d) for _, _, d in v0],
            "best val": [s.get("best_validation_accuracy") for s, _, _ in v20],
            "final (v20)": [s["final_accuracy"] for s, _, _ in v20]}


def seeds(values: list[float | None]) -> int:
    return sum(v is not None for v in values)


def table(out: Path) -> list[str]:
    lines = ["| method | inputs | seeds (v0/v20) | paper | " + " | ".join(COLUMNS) + " |",
             "|---|---|---|---|" + "---|" * len(COLUMNS)]
    for method in METHODS:
        for norm in NORMS:
            m = measures(out, norm, method)
            cells = [cell(m[c]) for c in COLUMNS]
            lines.append(f"| {method} | {norm} | {seeds(m['final'])}/{seeds(m['best val'])} | {PAPER[method]:.2f} | "
                         + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="the OUT folder of experiments/panm_offset.sh")
    args = p.parse_args(argv)
    print("\n".join(table(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
