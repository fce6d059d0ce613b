"""Record the golden metrics of a short run of every registered algorithm (and of SCENARIOS).

    python tests/golden/record.py            # writes tests/golden/<algorithm>.jsonl
    python tests/golden/record.py --machine  # this machine's recording, tests/golden/machines/<id>/

tests/integration/test_golden_runs.py runs the same runs and compares every number (wall
times aside).  Re-record only on a deliberate change of results, and say so
in the commit.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Small enough for CI, long enough that every algorithm's stages, restarts and splits happen.
GOLDEN_OVERRIDES = [
    "data.name=synthetic", "model=mlp", "data.train_size=40", "data.test_size=20", "data.num_clusters=2",
    "clients=8", "rounds=8", "stage1_rounds=4", "algorithm.k=2", "algorithm.l=3", "seed=3",
    "ifca.restart_rounds=2", "cfl.warmup=2", "fedgroup.pretrain_scale=2", "facade.warmup=3", "progress=false",
    "figures=false", "fedspd.finetune_rounds=2",
    "other_sections=true",   # one config for every algorithm: each reads its own section (the run's numbers unchanged)
]
WALL_TIME_KEYS = ("round_seconds", "wall_seconds", "mean_round_seconds", "process_seconds", "starts")
# Runs of a condition rather than of an algorithm (issue 48), each a golden file under its own name: DFCA on real
# Fashion-MNIST (8 clients of 2 rotations) whose clients move cluster at rounds 3 and 5; PANMGrad with 2 clients
# joining at round 5, after stage one (their lists filled at HNM), from a present client's model.
SCENARIOS = {
    "drift_dfca": ["algorithm.name=dfca", "data.name=fmnist", "data.root=data", "data.clusters=rotation",
                   "data.drift_rounds=[3,5]", "data.drift_fraction=0.5"],
    "join_panm_grad": ["algorithm.name=panm_grad", "network.join_round=5", "network.join_fraction=0.25",
                       "network.join_init=peer"],
}


def run_on_one_thread(cfg) -> dict:
    """``fedclust.runner.run`` of ``cfg`` in this process on one CPU thread (sums over threads round differently
    with their number), the thread count restored after; its summary."""
    import torch

    from fedclust.runner import prepare, run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(cfg, prepare(cfg))
    finally:
        torch.set_num_threads(threads)


def golden_run(name: str, out: Path) -> list[dict]:
    """The run on one CPU thread (sums over threads round differently with
    their number: the files must not depend on the machine's cores)."""
    from fedclust.config import load_config

    what = SCENARIOS.get(name, [f"algorithm.name={name}"])
    run_on_one_thread(load_config(None, GOLDEN_OVERRIDES + what + [f"out={out}"]))
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in WALL_TIME_KEYS} for r in lines]


def golden_summary(out: Path) -> dict:
    """summary.json of a golden run, wall times removed."""
    return {k: v for k, v in json.loads((out / "summary.json").read_text()).items() if k not in WALL_TIME_KEYS}


def algorithm_names() -> list[str]:
    """Every registered algorithm's run, then the SCENARIOS."""
    from fedclust.algorithms import registry

    return registry.names() + list(SCENARIOS)


def main() -> int:
    args = sys.argv[1:]
    out = HERE
    if "--machine" in args:   # a machine whose CPU rounds differently: its own files, the same runs
        sys.path.insert(0, str(HERE.parent))
        from run_files import machine_fingerprint, machine_id

        args.remove("--machine")
        out = HERE / "machines" / machine_id()
        out.mkdir(parents=True, exist_ok=True)
        (out / "environment.json").write_text(json.dumps(machine_fingerprint(), indent=1) + "\n")
    names = args or algorithm_names()
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            lines = golden_run(name, Path(tmp) / name)
            (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
            (out / f"{name}.summary.json").write_text(json.dumps(golden_summary(Path(tmp) / name), indent=1) + "\n")
            print(f"{name}: {len(lines)} rounds, final accuracy {lines[-1]['accuracy']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
