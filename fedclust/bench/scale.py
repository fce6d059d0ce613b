"""``fedclust bench-scale``: how a round's time, its gather and each
process's memory grow with the number of clients, on the current process
group (plain: one process; under ``torchrun --nproc_per_node=W``: W).

For each ``--clients`` count (smallest first) the config (default
``configs/fmnist_rotation2.yaml``, the MLP on Fashion-MNIST, with
``data.share_images=true`` so that thousands of clients can share the 60,000
images) runs ``--rounds`` rounds of ``--algorithm`` (default random) through
the runner's round step, without evaluation or output.  Round 1 is a
warm-up; the medians of the others are reported:

- s/round: the runner's ``round_seconds`` on rank 0 (local training, the
  gather, the aggregation);
- gather s and MB per round: the all-gathers of the round step
  (:class:`fedclust.dist.GatherMeter`); MB is the gathered buffer each rank
  receives (every rank's shard, its own included); one process gathers
  nothing ("-");
- peak RSS per process (every rank's, MB): the high-water mark of this
  count alone (reset before its setup through /proc/self/clear_refs where
  the kernel allows, else ``getrusage``'s lifetime maximum); peak CUDA
  memory too on a GPU.

The growth law printed beside the measurements (``--predict`` prints it
alone, without running), with C = ceil(n / W) clients per process, P
parameters, W_g = P (+ P if the algorithm gathers the models before
training) + 2 gathered columns (training loss, stop/checkpoint flags; 3 with
the cluster each client started from, for IFCA and CFL) and d
the bytes of one client's data ((train + test) x (pixels x bytes + 8)):

    gather bytes per rank per round = W x C x W_g x 4            (= n x W_g x 4 when W divides n)
    peak RSS per process ~ RSS before setup (base images read) + C x d + 2 x C x P x 4
                           + [masks] x C x n x 8 + (W > 1) x 2 x n x W_g x 4

(own models, and either the models from before training or the aggregated
ones: the first are dropped before the second are made; for algorithms
that choose by masks (``choice_masks``: PANM, PENS) the bool [C, n] masks of
a round's neighbour choice, at most 8 bytes an entry together as
experiments/select_memory.py measures them, while Random, FixTopology and Oracle
choose by index lists, C x k numbers; the gathered buffer and the copies that split it,
which exist together in :func:`fedclust.dist.gather_parts`).  With
``exchange_mb`` (column blocks) the last term is one block,
``columns x`` :func:`fedclust.dist.exchange_column_bytes` (at most the
budget), and the gathered columns are P + 2 (3P + 2 for PANMGrad, which
reads after and before for its similarity, then after again for the gossip).
Algorithms that gather the models before training (PANMGrad) add their
similarity's pieces: 4 x n x min(POOL_BLOCK, block columns) x 4 bytes.
On a GPU the same terms but the base are device memory (compare with the
peak CUDA column).  MB = 2**20 bytes throughout.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import resource
import statistics
import sys

import torch

from fedclust import runner
from fedclust.algorithms import registry
from fedclust.algorithms.similarity import POOL_BLOCK
from fedclust.config import load_config, run_facts
from fedclust.data import dataset
from fedclust.data.base import PoolDataSet
from fedclust.dist import (
    exchange_column_bytes,
    exchange_columns,
    gather_rows,
    import_fabric,
    make_fabric,
    measure_gathers,
    world_from_env,
)
from fedclust.runmodel import model_spec, parameter_count

MB = 2**20
# Gathered per client besides the weights: the training loss and the stop/checkpoint flags (runner.round_step).
EXTRA_COLUMNS = 2


def _read_status(key: str) -> int | None:
    """A ``/proc/self/status`` size in bytes (VmRSS, VmHWM), None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss(reset_done: bool) -> int:
    """Bytes: the high-water mark since the reset, else getrusage's maximum over the process's life."""
    hwm = _read_status("VmHWM") if reset_done else None
    if hwm is not None:
        return hwm
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def current_rss() -> int:
    return _read_status("VmRSS") or 0


def _cfg(config: str, clients: int, rounds: int, algorithm: str, overrides: list[str]):
    # rounds + 1: the timed rounds never end stage one (its end gathers the stage-one counts); a two-stage
    # algorithm's stage one covers them all unless the overrides say otherwise
    registry.load_builtin()
    stages = [] if any(o.startswith("stage1_rounds=") for o in overrides) or algorithm not in registry.names() \
        or not registry.get(algorithm).needs_stages else [f"stage1_rounds={rounds + 1}"]
    return load_config(config or None, [f"algorithm.name={algorithm}", "data.share_images=true", f"clients={clients}",
                                        f"rounds={rounds + 1}", "figures=false", "progress=false", *stages,
                                        *overrides])


def input_bytes(cfg) -> int:
    """Bytes a client keeps per input element: 1 for a pool of uint8 images (kept as stored, normalized when
    read: fedclust.data.base.StoredInputs), 4 (float32) otherwise."""
    ds = dataset(cfg.data)
    if (ds.kind_of(cfg.data) == "pool" and isinstance(ds, PoolDataSet)
            and ds.raw(cfg.data).train_x.dtype == torch.uint8):
        return 1
    return 4


# Bytes per [C, n] entry of the bool masks a round's neighbour choice holds at once (the kept state and the
# round's draws), for algorithms that choose by masks (Algorithm.choice_masks: PANM, PENS): experiments/select_memory.py
# measured 6.7 (PENS) to 8.0 (PANMLoss) at 4,000-10,000 clients.  Index lists (Random, FixTopology, Oracle):
# 0.4-0.8, counted as 0.
MASK_BYTES = 8


def law(cfg, world: int, base: float = 0.0) -> dict:
    """The growth law's gather bytes per rank per round and peak RSS bytes of one process (see the module doc)."""
    n, P = cfg.clients, parameter_count(cfg)
    algo = registry.build(cfg, run_facts(cfg))
    before = algo.gathers_before      # it gathers its models from before training too
    mask_bytes = MASK_BYTES if algo.choice_masks else 0   # bool [C, n] masks of the round's choice, or none
    extra = EXTRA_COLUMNS + (1 if algo.gathers_labels else 0)   # IFCA, CFL: each client's cluster too
    width = P * (2 if before else 1) + extra
    C = math.ceil(n / world)
    _, shape, _ = model_spec(cfg)
    d = (cfg.data.train_size + cfg.data.test_size) * (math.prod(shape) * input_bytes(cfg) + 8)
    columns = P
    if cfg.exchange_mb > 0:   # column blocks: PANMGrad reads after and before for its similarity, then after again
        parts = 2 if before else 1
        columns = min(exchange_columns(cfg.exchange_mb, n, world, parts), P)
        gathered = P * (3 if before else 1) + extra
        held = columns * exchange_column_bytes(n, world, parts)
    else:
        gathered, held = width, (2 * world * C * width * 4 if world > 1 else 0)
    # PANMGrad's similarity: the update, the distance from w0 and their squares, [n, piece] float32 each
    pieces = 4 * n * min(POOL_BLOCK, columns) * 4 if before else 0
    gather = world * C * gathered * 4 if world > 1 else 0
    banks = 2 * C * algo.kept_numbers * 4   # DFCA's [C, k, P] bank, Facade's heads: kept and made anew in a round
    banks += 2 * n * n * algo.pair_bytes      # DAC: its [n, n] tables on every process, kept and made anew
    memory = base + C * d + 2 * C * P * 4 + C * n * mask_bytes + held + pieces + banks
    return {"params": P, "columns": gathered, "data_bytes_per_client": d, "gather_bytes": gather,
            "exchange_bytes": held, "similarity_bytes": pieces, "bank_bytes": banks,
            "memory_bytes": memory}


def load_base_data(cfg) -> None:
    """Read the base data (a pool's images, a file) into the per-process cache, so that every count's "RSS
    before setup" holds it (generated data: nothing)."""
    dataset(cfg.data).preload(cfg.data)


def measure(fabric, cfg, rounds: int) -> dict:
    """Run ``rounds`` round steps of ``cfg`` on ``fabric``; this rank's figures and, gathered, every rank's."""
    gc.collect()
    device = fabric.device
    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    base = current_rss()
    reset_done = reset_peak()
    setup = runner.build(cfg, fabric)
    state = runner.fresh_state(setup)
    seconds, gather_s, gather_b, calls = [], [], [], []
    try:
        for t in range(1, rounds + 1):
            with measure_gathers() as meter:
                seconds.append(runner.round_step(setup, state, t).seconds)   # no outcome kept: the run loop keeps none
            gather_s.append(meter.seconds)
            gather_b.append(meter.bytes)
            calls.append(meter.calls)
        params = int(state.flat.shape[1])
    finally:
        del state, setup
        gc.collect()
    peak = peak_rss(reset_done)
    peak_cuda = torch.cuda.max_memory_allocated(device) if on_cuda else -1
    timed = slice(1, None)
    mine = [statistics.median(seconds[timed]), statistics.median(gather_s[timed]),
            statistics.median(gather_b[timed]), statistics.median(calls[timed]), peak, base, peak_cuda]
    row = torch.tensor([mine], dtype=torch.float64, device=device)
    every = gather_rows(fabric, row, fabric.world_size).cpu()   # [world, 7]; the meter is off
    return {"params": params, "round_seconds": seconds, "ranks": every.tolist(), "reset": reset_done}


def record(cfg, world: int, got: dict, device: str) -> dict:
    ranks = got["ranks"]
    s_round, g_s, g_b, calls = ranks[0][:4]
    peaks = [r[4] / MB for r in ranks]
    bases = [r[5] for r in ranks]
    predicted = [law(cfg, world, b)["memory_bytes"] / MB for b in bases]
    lw = law(cfg, world)
    cuda = [r[6] / MB for r in ranks] if ranks[0][6] >= 0 else None
    return {
        "clients": cfg.clients, "processes": world, "algorithm": cfg.algorithm.name, "device": device,
        "threads": torch.get_num_threads(), "train_size": cfg.data.train_size, "test_size": cfg.data.test_size,
        "params": got["params"], "gathered_columns": lw["columns"],
        "s_per_round": s_round, "s_per_round_min": min(got["round_seconds"][1:]),
        "round_seconds": got["round_seconds"],
        "gather_s_per_round": g_s if world > 1 else None,
        "gathers_per_round": int(calls),
        "gather_bytes_per_round": int(g_b) if world > 1 else None,
        "gather_mb_per_round": g_b / MB if world > 1 else None,
        "gather_mb_from_others_per_round": g_b / MB * (world - 1) / world if world > 1 else None,
        "predicted_gather_mb_per_round": lw["gather_bytes"] / MB if world > 1 else None,
        "peak_rss_mb": peaks, "peak_rss_mb_max": max(peaks), "peak_rss_mb_total": sum(peaks),
        "predicted_peak_rss_mb": predicted, "rss_before_setup_mb": [b / MB for b in bases],
        "peak_reset": got["reset"], "peak_cuda_mb": cuda,
    }


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table(rows: list[dict]) -> str:
    gpu = any(r["peak_cuda_mb"] for r in rows)
    head = ("| clients | processes | threads | s/round | gather s/round | gather MB/round per rank (law) | "
            "peak RSS MB per process (law) | total RSS MB |" + (" peak CUDA MB |" if gpu else ""))
    lines = [head, "|" + "---|" * (8 + gpu)]
    for r in rows:
        rss = ", ".join(f"{m:.0f}" for m in r["peak_rss_mb"])
        law_rss = ", ".join(f"{m:.0f}" for m in r["predicted_peak_rss_mb"])
        lines.append(f"| {r['clients']} | {r['processes']} | {r['threads']} | {r['s_per_round']:.3f} | "
                     f"{_f(r['gather_s_per_round'], '.3f')} | {_f(r['gather_mb_per_round'], '.4g')} "
                     f"({_f(r['predicted_gather_mb_per_round'], '.4g')}) | {rss} ({law_rss}) | "
                     f"{r['peak_rss_mb_total']:.0f} |"
                     + (f" {', '.join(f'{m:.0f}' for m in r['peak_cuda_mb'])} |" if gpu else ""))
    r0 = rows[0] if rows else None
    note = (f"\n{r0['algorithm']} on {r0['device']}, P = {r0['params']}, {r0['gathered_columns']} gathered columns, "
            f"train/test size {r0['train_size']}/{r0['test_size']}; medians of rounds 2..{len(r0['round_seconds'])}"
            f"{'' if r0['peak_reset'] else '; peak RSS over the process life (no reset)'}\n") if r0 else ""
    return "\n".join(lines) + "\n" + note


def predict_table(config: str, counts: list[int], world: int, algorithm: str, overrides: list[str]) -> str:
    if world > 1:
        import_fabric()      # what a run of several processes has imported before its setup

    load_base_data(_cfg(config, counts[0], 2, algorithm, overrides))
    base = current_rss()
    lines = [f"growth law, {world} process(es), RSS before setup {base / MB:.0f} MB (this process now)",
             "| clients | gather MB/round per rank | peak RSS MB per process | all processes MB |", "|---|---|---|---|"]
    for n in counts:
        lw = law(_cfg(config, n, 2, algorithm, overrides), world, base)
        lines.append(f"| {n} | {lw['gather_bytes'] / MB:.1f} | {lw['memory_bytes'] / MB:.0f} | "
                     f"{world * lw['memory_bytes'] / MB:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fedclust bench-scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="", help="YAML config (default: the built-in defaults, which are "
                   "configs/fmnist_rotation2.yaml's setting, so it runs from any folder)")
    p.add_argument("--clients", default="100,1000", help="comma-separated client counts (run smallest first)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per count (round 1 is not timed)")
    p.add_argument("--algorithm", default="random")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    p.add_argument("--predict", action="store_true",
                   help="print only the growth law's gather and memory for the counts (run nothing)")
    p.add_argument("--processes", type=int, default=0, help="with --predict: processes (default: this launch's)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. data.train_size=50")
    args = p.parse_args(argv)
    try:
        counts = sorted({int(c) for c in args.clients.split(",") if c.strip()})
    except ValueError:
        p.error(f"--clients takes comma-separated integers, got {args.clients!r}")
    if not counts or args.rounds < 2:
        p.error("need at least one client count and --rounds >= 2")
    if args.predict:
        local, nodes = world_from_env()
        print(predict_table(args.config, counts, args.processes or local * nodes, args.algorithm, args.overrides),
              end="")
        return 0
    cfgs = [_cfg(args.config, n, args.rounds, args.algorithm, args.overrides) for n in counts]   # all checked first
    fabric = make_fabric(cfgs[0].device, cfgs[0].collective_timeout)
    load_base_data(cfgs[0])
    rows = []
    for cfg in cfgs:
        with contextlib.redirect_stdout(sys.stderr):
            got = measure(fabric, cfg, args.rounds)
        rows.append(record(cfg, fabric.world_size, got, str(fabric.device)))
        if fabric.global_rank == 0:
            print(f"bench-scale: {cfg.clients} clients done ({rows[-1]['s_per_round']:.2f} s/round)",
                  file=sys.stderr, flush=True)
    if fabric.global_rank == 0:
        print(json.dumps(rows, indent=1) if args.json else table(rows), end="", flush=True)
    runner.finish(fabric)   # every rank leaves the process group together
    return 0
