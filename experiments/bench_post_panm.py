"""Issue 35's speed check: a round of each method published since PANM beside Random's, at 100, 200 and 2,000
clients on one process (``fedclust bench-scale``: the MLP on Fashion-MNIST, data.share_images=true), and each
one's per-client cost from 200 to 2,000 clients.

    OMP_NUM_THREADS=2 python3 experiments/bench_post_panm.py --out docs/bench/post_panm_cpu_DATE.json

Targets (issue 35): a round within 2x of Random's at 100 and 2,000 clients, and the per-client cost from 200 to
2,000 clients within 1.3x.  Each algorithm runs in its own process (its peak RSS alone), one after another; the
medians of rounds 2.. are compared.  Prints a Markdown table of the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

METHODS = ["random", "epidemic", "dac", "deprl", "dfca", "facade", "fedspd"]
CLIENTS = [100, 200, 2000]


def bench(algorithm: str, clients: list[int], rounds: int, extra: list[str]) -> list[dict]:
    cmd = [sys.executable, "-m", "fedclust", "bench-scale", "--clients", ",".join(map(str, clients)),
           "--rounds", str(rounds), "--algorithm", algorithm, "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out[out.index("["):])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("extra", nargs="*", help="config overrides for every run")
    args = p.parse_args(argv)
    runs = {}
    for name in args.methods.split(","):
        t0 = time.time()
        runs[name] = bench(name, CLIENTS, args.rounds, args.extra)
        print(f"{name}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    per = {name: {r["clients"]: r for r in recs} for name, recs in runs.items()}
    ratios = {}
    for name in runs:
        a = per[name]
        ratios[name] = {
            "over_random_100": a[100]["s_per_round"] / per["random"][100]["s_per_round"],
            "over_random_2000": a[2000]["s_per_round"] / per["random"][2000]["s_per_round"],
            "per_client_2000_over_200": (a[2000]["s_per_round"] / 2000) / (a[200]["s_per_round"] / 200),
            "peak_rss_mb_2000": a[2000]["peak_rss_mb_max"],
            "predicted_peak_rss_mb_2000": a[2000]["predicted_peak_rss_mb"][0],
        }
    doc = {"what": "issue 35: a round of each post-PANM method beside Random's, fedclust bench-scale, one process, "
                   "Fashion-MNIST MLP, data.share_images=true, 200 training images a client",
           "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, OMP_NUM_THREADS="
                      f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, no GPU",
           "date": time.strftime("%Y-%m-%d"),
           "command": "OMP_NUM_THREADS=2 python3 experiments/bench_post_panm.py --out FILE " + " ".join(args.extra),
           "ratios": ratios, "runs": runs}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print("| method | s/round at 100 | x Random | s/round at 2,000 | x Random | per client 2,000 / 200 | "
          "peak RSS MB at 2,000 (law) |")
    print("|---|---|---|---|---|---|---|")
    for name, r in ratios.items():
        a = per[name]
        print(f"| {name} | {a[100]['s_per_round']:.3f} | {r['over_random_100']:.2f} | {a[2000]['s_per_round']:.2f} | "
              f"{r['over_random_2000']:.2f} | {r['per_client_2000_over_200']:.2f} | {r['peak_rss_mb_2000']:.0f} "
              f"({r['predicted_peak_rss_mb_2000']:.0f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
