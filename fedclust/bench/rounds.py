"""``fedclust bench-rounds``: whole-round time of algorithms on one config,
side by side (same process, same device, same data).

Each algorithm runs ``--rounds`` rounds of the config (default
``configs/fmnist_rotation2.yaml``: 100 clients on Fashion-MNIST) with
``stage1_rounds`` = ``--stage1``, so both PANM stages are timed.  A round's
time is the runner's ``round_seconds``: local training, the gather and the
algorithm's aggregation (similarities, CNI/HNM, gossip), not the
evaluation.  Round 1 is a warm-up and is left out; the median of the other
stage-one rounds and of the stage-two rounds is printed, and the ratio to
the first algorithm (the baseline, Random by default).  ``--cycles`` runs the
whole list again, interleaved, and takes the median over all cycles.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

from fedclust import checkpoint, runner
from fedclust.config import load_config
from fedclust.dist import make_fabric

DEFAULT_ALGORITHMS = "random,panm_grad,panm_loss"


def time_algorithm(config: str, name: str, rounds: int, stage1: int, overrides: list[str]) -> dict[str, list[float]]:
    """Round seconds of one run, split into stage one (after round 1) and stage two."""

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "run")
        cfg = load_config(config or None, [f"algorithm.name={name}", f"rounds={rounds}", f"stage1_rounds={stage1}",
                                   "eval_every=1", "figures=false", "progress=false", f"out={out}", *overrides])
        with contextlib.redirect_stdout(sys.stderr):   # the run's own summary line
            runner.run(cfg)   # into cfg.out
        recs = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {"stage1": [r["round_seconds"] for r in recs if 1 < r["round"] <= stage1],
            "stage2": [r["round_seconds"] for r in recs if r["round"] > stage1]}


def checkpoint_cost(config: str, clients: int, rounds: int, overrides: list[str]) -> dict:
    """Seconds and bytes of one checkpoint of the whole run (every client's
    weights, the algorithm state, counters) beside the median round time,
    and the share of run time checkpoints take under the default policy
    (every max(CHECKPOINT_SECONDS, 50 x cost) seconds) and every 10 rounds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "run")
        cfg = load_config(config or None, [f"clients={clients}", f"rounds={rounds + 1}", "figures=false",
                                           "progress=false", f"out={out}", *overrides])
        setup = runner.build(cfg, make_fabric(cfg.device, cfg.collective_timeout))
        state = runner.fresh_state(setup)
        seconds = []
        for t in range(1, rounds + 1):
            seconds.append(runner.round_step(setup, state, t).seconds)
        writer = checkpoint.Checkpointer(setup, out)
        costs = []
        for _ in range(3):
            writer.write(state)
            costs.append(writer.last_cost)
        if writer.last_path is None:
            raise RuntimeError("checkpoint_cost: no checkpoint file was written (rank 0 writes it: run one process)")
        size = writer.last_path.stat().st_size
    round_s, cost = statistics.median(seconds[1:] or seconds), statistics.median(costs)
    interval = max(checkpoint.CHECKPOINT_SECONDS, 50 * cost)
    return {"algorithm": cfg.algorithm.name, "clients": clients, "params": int(state.flat.shape[1]),
            "round_seconds": round_s, "checkpoint_seconds": cost, "checkpoint_mb": size / 2**20,
            "share_default": cost / (interval + cost), "share_every_10_rounds": cost / (10 * round_s + cost)}


def checkpoint_table(rows: list[dict]) -> str:
    lines = ["| algorithm | clients | P | s/round | checkpoint s | checkpoint MB | share of run (default policy) | "
             "share (every 10 rounds) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['algorithm']} | {r['clients']} | {r['params']} | {r['round_seconds']:.3f} | "
                     f"{r['checkpoint_seconds']:.3f} | {r['checkpoint_mb']:.1f} | {100 * r['share_default']:.2f}% | "
                     f"{100 * r['share_every_10_rounds']:.2f}% |")
    return "\n".join(lines) + "\n"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def table(results: dict[str, dict[str, list[float]]]) -> str:
    names = list(results)
    base = {s: _median(results[names[0]][s]) for s in ("stage1", "stage2")}
    lines = ["| algorithm | stage one s/round | x baseline | stage two s/round | x baseline |",
             "|---|---|---|---|---|"]
    for name in names:
        cells = [name]
        for s in ("stage1", "stage2"):
            m, b = _median(results[name][s]), base[s]
            cells += ["" if m is None else f"{m:.3f}",
                      "" if m is None or not b else f"{m / b:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fedclust bench-rounds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="", help="YAML config (default: the built-in defaults, which are "
                   "configs/fmnist_rotation2.yaml's setting, so it runs from any folder)")
    p.add_argument("--algorithms", default=DEFAULT_ALGORITHMS, help="comma-separated; the first is the baseline")
    p.add_argument("--rounds", type=int, default=8, help="rounds per run (round 1 is not timed)")
    p.add_argument("--stage1", type=int, default=4, help="stage-one rounds of each run")
    p.add_argument("--cycles", type=int, default=1, help="run the whole list this many times, interleaved")
    p.add_argument("--json", action="store_true", help="print the raw round seconds as JSON")
    p.add_argument("--checkpoint", default="", metavar="CLIENTS",
                   help="instead: the cost of one checkpoint at these client counts (comma-separated, e.g. 100,1000)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. device=cuda")
    args = p.parse_args(argv)
    if args.rounds < 2 or not 1 <= args.stage1 <= args.rounds:
        p.error("need --rounds >= 2 and 1 <= --stage1 <= --rounds")
    if args.checkpoint:
        rows = [checkpoint_cost(args.config, int(c), args.rounds, args.overrides)
                for c in args.checkpoint.split(",") if c]
        print(json.dumps(rows, indent=1) if args.json else checkpoint_table(rows), end="")
        return 0
    names = [a for a in args.algorithms.split(",") if a]
    results: dict[str, dict[str, list[float]]] = {a: {"stage1": [], "stage2": []} for a in names}
    for _ in range(args.cycles):
        for name in names:
            got = time_algorithm(args.config, name, args.rounds, args.stage1, args.overrides)
            for s in got:
                results[name][s] += got[s]
    print(json.dumps(results, indent=1) if args.json else table(results), end="")
    return 0
