"""One run profiled by phase (issue 47, part 2): ``fedclust.runner.run`` of a config in this process under
torch.profiler, each phase of the round inside a labelled range, so the profile splits a round into local training,
the round's gather, the similarity (PANM's, PENS's and DAC's scores), the rest of the algorithm's aggregation,
evaluation, the checkpoint and the rank-0 records, and what is left (host work between them: the plan, the
conditions, the loop).  Rounds ``--skip`` + 1 .. ``--skip`` + ``--rounds`` are recorded (a schedule: the first
rounds warm the caches and, on a GPU, the kernels), the rest of the run goes on unprofiled.

Prints the phase split (milliseconds a profiled round on the host and, on a GPU, on the device) and the top
operators by self time; ``--json`` writes both.  The product is not changed: the phases are wrapped here, where the
round looks them up, and the wrappers are removed after the run.

    python3 experiments/profile_run.py configs/cifar_rotation4.yaml data.name=npz data.path=POOL.npz model=cnn \\
        algorithm.name=panm_grad device=cuda rounds=40 --skip 20 --rounds 10 --json $OUT/profile.json
    python3 experiments/profile_run.py configs/synthetic_cluster4.yaml algorithm.name=panm_grad rounds=6 \\
        --skip 2 --rounds 3        # on a CPU, seconds

Cost: the profiler's own overhead on the recorded rounds (a few percent on a GPU, more for many small operators on a
CPU); the unprofiled rounds run at full speed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import sys
import time
from pathlib import Path

# (module, attribute, phase): the functions the round calls, patched in the module that calls them
PHASES = [
    ("fedclust.round", "_local_training", "train"),
    ("fedclust.round", "exchange", "gather"),
    ("fedclust.algorithms.panm", "similarity_for", "similarity"),
    ("fedclust.algorithms.pens", "similarity_for", "similarity"),
    ("fedclust.algorithms.dac", "similarity_for", "similarity"),
    ("fedclust.runner", "evaluate_round", "evaluate"),
]
METHODS = [   # (module, class, method, phase): the per-round calls on objects
    ("fedclust.checkpoint", "Checkpointer", "after_round", "checkpoint"),
    ("fedclust.rank0", "RankZeroOutput", "log_round", "records"),
    ("fedclust.rank0", "RankZeroOutput", "round_done", "records"),
]
ROUND = "round"          # the whole of round_step
AGGREGATE = "aggregate"  # the algorithm's aggregate, the similarity inside it included
LABELS = [ROUND, "train", "gather", AGGREGATE, "similarity", "evaluate", "checkpoint", "records"]   # in print order


def device_ms(e, name: str) -> float:
    """An event's device time ``name`` (``device_time_total`` or ``self_device_time_total``; older torch calls it
    cuda_...) in milliseconds; 0 without one."""
    got = getattr(e, name, None)
    return (got if got is not None else getattr(e, name.replace("device", "cuda"), 0.0)) / 1e3


def labelled(fn, label: str):
    from torch.profiler import record_function

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with record_function(label):
            return fn(*args, **kwargs)
    return wrapper


@contextlib.contextmanager
def phases():
    """Every phase of PHASES and METHODS, the round and the algorithm's aggregate in labelled ranges while inside;
    restored after.  A (module, attribute) that does not exist (an algorithm without a similarity) is skipped."""
    import fedclust.runner as runner

    undo = []

    def patch(owner, name, label):
        if hasattr(owner, name):
            original = getattr(owner, name)
            setattr(owner, name, labelled(original, label))
            undo.append((owner, name, original))

    for module, attr, label in PHASES:
        with contextlib.suppress(ImportError):
            patch(importlib.import_module(module), attr, label)
    for module, cls, method, label in METHODS:
        patch(getattr(importlib.import_module(module), cls), method, label)
    patch(runner, "round_step", ROUND)
    build = runner.build

    def build_labelled(cfg, fabric):   # the run's algorithm object: its aggregate labelled on the instance
        setup = build(cfg, fabric)
        setup.algo.aggregate = labelled(setup.algo.aggregate, AGGREGATE)
        return setup

    runner.build = build_labelled
    undo.append((runner, "build", build))
    try:
        yield
    finally:
        for owner, name, original in reversed(undo):
            setattr(owner, name, original)


def phase_split(events, rounds: int) -> dict:
    """Milliseconds a profiled round per phase from the profiler's averages ``events`` (``key_averages()``):
    ``host`` (CPU time inside the range, children included) and ``device`` (kernels launched inside it); ``other``:
    the round's host time outside every phase; ``aggregate`` without its similarity."""
    by_key = {e.key: e for e in events}
    out = {}
    for label in LABELS:
        e = by_key.get(label)
        if e is None:
            continue
        out[label] = {"calls": e.count, "host_ms": e.cpu_time_total / 1e3 / rounds,
                      "device_ms": device_ms(e, "device_time_total") / rounds}
    if AGGREGATE in out and "similarity" in out:
        for key in ("host_ms", "device_ms"):
            out[AGGREGATE][key + "_without_similarity"] = out[AGGREGATE][key] - out["similarity"][key]
    if ROUND in out:
        inside = sum(out[k]["host_ms"] for k in ("train", "gather", AGGREGATE) if k in out)
        out["other_in_round"] = {"host_ms": out[ROUND]["host_ms"] - inside}
    return out


def top_operators(events, n: int = 15, device: bool = False) -> list[dict]:
    """The ``n`` operators of largest self time (on the device where ``device``), the phase labels left out."""
    def self_ms(e) -> float:
        return device_ms(e, "self_device_time_total") if device else e.self_cpu_time_total / 1e3

    rows = sorted((e for e in events if e.key not in LABELS and not e.key.startswith("ProfilerStep")),
                  key=self_ms, reverse=True)[:n]
    return [{"operator": e.key, "calls": e.count, "self_ms": self_ms(e)} for e in rows]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", help="a config file (or - for none)")
    p.add_argument("overrides", nargs="*", help="KEY=VALUE, as fedclust run takes them")
    p.add_argument("--skip", type=int, default=2, help="rounds run before the profiled ones")
    p.add_argument("--rounds", type=int, default=3, help="rounds profiled")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--json", help="write the split and the top operators here")
    args = p.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    import fedclust.runner as runner
    from fedclust.config import load_config

    cfg = load_config(None if args.config == "-" else args.config, args.overrides)
    if cfg.rounds < args.skip + args.rounds:
        raise SystemExit(f"rounds={cfg.rounds}: the run needs at least --skip + --rounds = "
                         f"{args.skip + args.rounds} rounds; raise rounds=")
    cuda = cfg.device != "cpu" and torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, schedule=schedule(wait=max(args.skip - 1, 0), warmup=min(args.skip, 1),
                                                            active=args.rounds, repeat=1))

    def step(setup, state, run_dir):
        if cuda:
            torch.cuda.synchronize()
        prof.step()

    remove = runner.add_round_end_hook(step)
    t0 = time.perf_counter()
    try:
        with phases(), prof:
            summary = runner.run(cfg, runner.prepare(cfg))
    finally:
        remove()
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    result = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__,
              "config": args.config, "overrides": args.overrides, "profiled_rounds": args.rounds,
              "skipped_rounds": args.skip, "run_seconds": wall,
              "mean_round_seconds": summary.get("mean_round_seconds"),
              "phases_ms_per_round": phase_split(events, args.rounds),
              "top_host": top_operators(events, args.top),
              "top_device": top_operators(events, args.top, device=True) if cuda else []}
    print(f"phase split, ms a profiled round ({result['device']}, {args.rounds} rounds after {args.skip}):")
    print("| phase | host ms | device ms |\n|---|---|---|")
    for label, row in result["phases_ms_per_round"].items():
        print(f"| {label} | {row['host_ms']:.2f} | {row.get('device_ms', float('nan')):.2f} |")
    for title, rows in (("host", result["top_host"]), ("device", result["top_device"])):
        if rows:
            print(f"\ntop operators by self {title} time, ms over the profiled rounds:")
            print("| operator | calls | self ms |\n|---|---|---|")
            for r in rows:
                print(f"| {r['operator']} | {r['calls']} | {r['self_ms']:.2f} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
