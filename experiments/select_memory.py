"""What a peer algorithm's neighbour choice costs in memory per [C, n] entry, apart from the models.

Each algorithm runs alone in a fresh process: n clients on one process, models of P = 4 parameters (so that
the models, the exchange and the data are negligible), losses of peer models from a cheap formula.  It runs
the algorithm's own round (``aggregate``: the choice and the gossip) for two stage-one and two stage-two
rounds, and prints, per entry of the [C, n] = n² table:

- ``kept``: bytes of the tensors the algorithm's state keeps between rounds (what a checkpoint saves, and
  what stays on the device the whole run);
- ``peak``: the process's peak RSS over the rounds minus its RSS before them (getrusage), the kept state and
  the round's temporaries together.

    python experiments/select_memory.py --clients 10000                 # every peer algorithm, one line each
    python experiments/select_memory.py --clients 10000 --json          # the records
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys

PEER = ("random", "fixtopology", "oracle", "pens", "panm_grad", "panm_loss")


def rss_peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def kept_bytes(state) -> int:
    import torch

    if state is None or not dataclasses.is_dataclass(state):
        return 0
    return sum(v.numel() * v.element_size() for f in dataclasses.fields(state)
               if isinstance(v := getattr(state, f.name), torch.Tensor))


def one(name: str, n: int) -> dict:
    """The record of one algorithm (run in this process)."""
    import torch

    from fedclust.algorithms import registry
    from fedclust.algorithms.base import Context, RoundView
    from fedclust.config import load_config

    torch.set_num_threads(1)
    P, T1 = 4, 2
    cfg = load_config(None, [f"algorithm.name={name}", f"clients={n}", "rounds=4", f"stage1_rounds={T1}",
                             "algorithm.k=5", "algorithm.l=10", "data.name=synthetic", "data.num_clusters=4"])
    alg = registry.build(cfg)
    clusters = torch.arange(n) % 4
    g = torch.Generator().manual_seed(0)
    centers = torch.randn(4, P, generator=g)
    targets = centers[clusters]
    ids = torch.arange(n)

    def pair_loss(models, local_index):
        return ((models - targets[local_index]) ** 2).mean(1) + 0.1

    ctx = Context(n=n, client_ids=ids, clusters=clusters, seed=0, stage1_rounds=T1, w0=torch.zeros(P),
                  device=torch.device("cpu"), pair_loss=pair_loss)
    state = alg.init(ctx)
    before_models = targets + torch.randn(n, P, generator=g)
    base = current_rss_bytes()
    peak0 = rss_peak_bytes()
    kept = 0
    for t in range(1, 5):
        after = before_models + 0.1 * torch.randn(n, P, generator=g)
        view = RoundView(round=t, before=before_models, after=after, all_after=after,
                         all_before=before_models if alg.gathers_before else None)
        state, result = alg.aggregate(state, ctx, view)
        before_models = result.models
        kept = max(kept, kept_bytes(state))
        del result, view
    peak = rss_peak_bytes()
    entries = n * n
    return {"algorithm": name, "clients": n, "kept_bytes_per_entry": kept / entries,
            "peak_bytes_per_entry": (max(peak, peak0) - base) / entries,
            "peak_before_rounds_above_base_mb": (peak0 - base) / 2**20}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=10000)
    ap.add_argument("--algorithms", default=",".join(PEER))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one, a.clients)))
        return 0
    records = []
    for name in a.algorithms.split(","):   # a fresh process each: getrusage's peak is per process
        out = subprocess.run([sys.executable, __file__, "--one", name, "--clients", str(a.clients)],
                             capture_output=True, text=True, check=True)
        records.append(json.loads(out.stdout.splitlines()[-1]))
        r = records[-1]
        if not a.json:
            print(f"{name:12s} n={a.clients}: kept {r['kept_bytes_per_entry']:.2f} B, peak "
                  f"{r['peak_bytes_per_entry']:.2f} B per [C, n] entry", flush=True)
    if a.json:
        print(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
