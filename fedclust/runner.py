"""The round loop (docs/algorithms.md) on Lightning Fabric.

Each rank holds a contiguous shard of clients: their flat weights stacked in
one [C, P] buffer and their data on the device.  A round is: vectorized local
training of the shard, one all-gather of the flat weights, the algorithm's
neighbour choice for the shard's clients, and the gossip average as one
mixing-matrix product.  Every random draw is keyed on (seed, round, client).
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed

from fedclust import checkpoint, rng
from fedclust.algorithms import registry
from fedclust.algorithms.base import Context, RoundResult, RoundView
from fedclust.data import load_federated
from fedclust.dist import gather_parts, gather_rows, make_fabric, shard_bounds
from fedclust.engine.layout import ParamLayout
from fedclust.engine.pool import pool_losses
from fedclust.engine.train import TrainSettings, evaluate, pair_losses, train_round
from fedclust.errors import CollectiveError, DivergenceError
from fedclust.figures import write_run_figures
from fedclust.metrics import adjusted_rand_index, cluster_recovery, nanmean, neighbor_precision_recall
from fedclust.models import default_arch, initial_weights
from fedclust.outputs import RunWriter, check_writable, default_out
from fedclust.schema import to_dict
from fedclust.progress import make_progress
from fedclust.tracking import Tracker, check_credentials


def prepare(cfg) -> str:
    """Checks that must pass before any data is read or process group starts
    (the run directory can be written, W&B can log, the resume decision:
    :func:`fedclust.checkpoint.choose`); creates nothing; returns the run dir."""
    out = cfg.out or default_out(cfg)
    check_writable(out)
    check_credentials(cfg)
    checkpoint.choose(cfg, out, to_dict(cfg))
    return out


def data_source(cfg, data) -> str:
    """Where the run's data came from, saying when it was not ``data.root``."""
    if data.source is None:
        return f"{cfg.data.name}, generated"
    root = Path(cfg.data.root).expanduser().resolve()
    source = Path(data.source)
    if source == root or root in source.parents:
        return f"{cfg.data.name} from {source}"
    why = "does not exist" if not root.exists() else f"holds no {cfg.data.name} files"
    return f"{cfg.data.name} from {source} (fallback: data.root {cfg.data.root!r} {why})"


@dataclass
class Setup:
    """What a run holds fixed on one rank (built once, read by every round)."""

    cfg: Any
    fabric: Any
    rank: int
    world: int
    device: torch.device
    n: int
    client_ids: torch.Tensor
    data: Any
    arch: str
    layout: ParamLayout
    ctx: Context
    algo: Any
    settings: TrainSettings
    stage1_end: int


@dataclass
class LoopState:
    """What the round loop carries from one round to the next on one rank: all a checkpoint holds."""

    round: int                               # last completed round (0: none)
    flat: torch.Tensor                       # [C, P] this rank's clients' models
    algo_state: Any
    traffic: "Traffic"
    stage1_counts: torch.Tensor              # [C, n] int32 times averaged with each peer in stage one
    saved: dict = field(default_factory=dict)        # arrays for neighbors.npz (stage one's, rank 0's)
    history: list = field(default_factory=list)      # every metrics record written so far
    final_lists: Any = None                  # [n, n] bool neighbour lists of the last evaluated round
    final_assignment: Any = None             # [n] cluster of every client in the last evaluated round
    run_id: str | None = None                # the tracking (W&B) run's id


@dataclass
class RoundOutcome:
    result: RoundResult
    all_loss: torch.Tensor       # [n] training loss of every client this round
    seconds: float
    stop: bool                   # some rank was asked to stop (SIGUSR1/SIGTERM)
    checkpoint_due: bool         # some rank's checkpoint clock ran out


def setup(cfg, fabric) -> Setup:
    rank, world, device = fabric.global_rank, fabric.world_size, fabric.device
    n = cfg.clients
    start, stop = shard_bounds(n, world, rank)
    client_ids = torch.arange(start, stop, dtype=torch.int64)
    data = load_federated(cfg.data, n, cfg.seed, client_ids.tolist(), device=device)
    arch = default_arch(cfg.data.name) if cfg.model == "auto" else cfg.model
    layout, w0 = initial_weights(arch, data.input_shape, data.num_classes, cfg.seed)
    w0 = w0.to(device)

    def pair_loss(models, owner):
        return pair_losses(models, layout, arch, data.train_x, data.train_y, owner)

    def pool_loss(models, peers):
        return pool_losses(models, layout, arch, data.train_x, data.train_y, peers)

    ctx = Context(n=n, client_ids=client_ids.to(device), clusters=data.clusters.to(device), seed=cfg.seed,
                  stage1_rounds=cfg.stage1_rounds, w0=w0, device=device, pair_loss=pair_loss,
                  pool_loss=pool_loss)
    settings = TrainSettings(lr=cfg.train.lr, momentum=cfg.train.momentum,
                             batch_size=cfg.train.batch_size, epochs=cfg.train.local_epochs)
    return Setup(cfg=cfg, fabric=fabric, rank=rank, world=world, device=device, n=n, client_ids=client_ids,
                 data=data, arch=arch, layout=layout, ctx=ctx, algo=registry.build(cfg), settings=settings,
                 stage1_end=min(cfg.stage1_rounds, cfg.rounds))


def fresh_state(s: Setup) -> LoopState:
    C = len(s.client_ids)
    return LoopState(round=0, flat=s.ctx.w0.expand(C, -1).clone(), algo_state=s.algo.init(s.ctx),
                     traffic=Traffic(C, s.device),
                     stage1_counts=torch.zeros(C, s.n, dtype=torch.int32, device=s.device),
                     saved={"clusters": s.data.clusters.cpu().numpy()})


def round_step(s: Setup, state: LoopState, t: int, stop_flag: bool = False, due_flag: bool = False) -> RoundOutcome:
    """One round, no I/O: plan -> local training -> the round's one gather
    (weights, training losses, the stop/checkpoint flags, and the models
    before training if the algorithm uses them) -> aggregate.  Updates
    ``state`` in place (its ``round`` included)."""
    cfg, algo, ctx = s.cfg, s.algo, s.ctx
    t0 = time.time()
    s.settings.lr = cfg.train.lr * cfg.train.lr_decay ** (t - 1)
    algo_state, plan = algo.plan(state.algo_state, ctx, t, state.flat)
    flat = state.flat if plan.start is state.flat else plan.start.contiguous().clone()  # trained in place
    before = flat.clone() if algo.gathers_before else None  # models before local training, if used
    orders = rng.batch_orders(cfg.seed, t, s.client_ids, cfg.train.local_epochs, s.data.train_x.shape[1]).to(s.device)
    train_loss = train_round(flat, s.layout, s.arch, s.data.train_x, s.data.train_y, orders, s.settings,
                             anchor=plan.anchor, mu=plan.mu)
    flags = torch.full((flat.shape[0], 1), 2.0 * stop_flag + 1.0 * due_flag, dtype=flat.dtype, device=flat.device)
    parts = [flat, train_loss[:, None].to(flat.dtype), flags] + ([before] if algo.gathers_before else [])
    gathered = collective(s, t, gather_parts, s.fabric, parts, s.n)  # the round's one all-gather
    all_after, all_loss, all_flags = gathered[0], gathered[1][:, 0], gathered[2][:, 0]
    bad = (~torch.isfinite(all_loss)).nonzero().flatten().tolist()
    if bad:
        raise DivergenceError(t, bad)
    view = RoundView(round=t, before=before, after=flat, all_after=all_after,
                     all_before=gathered[3] if algo.gathers_before else None)
    algo_state, result = algo.aggregate(algo_state, ctx, view)
    state.flat, state.algo_state, state.round = result.models, algo_state, t
    state.traffic.add(result)
    if result.averaged is not None and t <= s.stage1_end:
        state.stage1_counts += result.averaged.to(torch.int32)
    if t == s.stage1_end:
        state.saved.update(_stage1_arrays(s, state))
    top = int(all_flags.max()) if all_flags.numel() else 0
    return RoundOutcome(result=result, all_loss=all_loss, seconds=time.time() - t0, stop=bool(top & 2),
                        checkpoint_due=bool(top & 1))


def collective(s: Setup, t: int, fn, *args):
    """Run a collective; a failure or timeout of another rank becomes an
    error naming this rank and the round."""
    try:
        return fn(*args)
    except (RuntimeError, torch.distributed.DistError) as exc:
        if s.world == 1:
            raise
        raise CollectiveError(f"rank {s.rank}: a collective in round {t} failed or timed out (collective_timeout = "
                              f"{s.cfg.collective_timeout:g} s): another rank stopped or hangs ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''})") from exc


def evaluate_round(s: Setup, state: LoopState, out: RoundOutcome) -> dict:
    """The round's metrics record (a gather of every rank's numbers, no I/O)."""
    record, lists = _evaluate_round(s, out.result, state.traffic, state.round, out.all_loss, out.seconds, state.flat)
    state.final_lists, state.final_assignment = lists, out.result.assignment
    state.history.append(record)
    return record


# ----------------------------------------------------------------------------
# Checkpoint contents


def _gather_tensor(s: Setup, rows):
    """[C, ...] rows of every rank as [n, ...] on the CPU (bool travels as uint8)."""
    if rows is None:
        return None
    x = rows.to(torch.uint8) if rows.dtype == torch.bool else rows
    full = gather_rows(s.fabric, x.contiguous(), s.n).cpu()
    return full.bool() if rows.dtype == torch.bool else full


def _map_tensors(value, fn):
    """``value`` with ``fn`` applied to every tensor in it (nested lists, tuples, dicts); numpy arrays count as tensors."""
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value.copy())
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_map_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, fn) for k, v in value.items()}
    return value


def _cpu(value):
    return _map_tensors(value, lambda x: x.detach().cpu())


def _to(value, device):
    return _map_tensors(value, lambda x: x.to(device, copy=True))   # a copy: never a view of the mapped file


def checkpoint_payload(s: Setup, state: LoopState) -> dict | None:
    """Everything a resume needs (gathered on every rank; returned on rank 0, None elsewhere)."""
    sd = s.algo.state_dict(state.algo_state)
    rows = {k: _gather_tensor(s, v) for k, v in sd["clients"].items()}
    weights = _gather_tensor(s, state.flat)
    traffic = {"received": _gather_tensor(s, state.traffic.received),
               "max_round": _gather_tensor(s, state.traffic.max_round),
               "server_received": state.traffic.server_received, "server_sent": state.traffic.server_sent,
               "server_max": state.traffic.server_max}
    counts = _gather_tensor(s, state.stage1_counts)
    if s.rank != 0:
        return None
    return {"config": to_dict(s.cfg), "world_size": s.world, "weights": weights,
            "algorithm": {"clients": rows, "server": _cpu(sd["server"])}, "traffic": traffic,
            "stage1_counts": counts, "saved": _cpu(state.saved), "history": state.history,
            "metric_lines": len(state.history), "final_lists": _cpu(state.final_lists),
            "final_assignment": _cpu(state.final_assignment), "run_id": state.run_id}


def restore_state(s: Setup, payload: dict) -> LoopState:
    """This rank's LoopState from a checkpoint written on any number of ranks."""
    ids = s.client_ids
    lo, hi = (int(ids[0]), int(ids[-1]) + 1) if len(ids) else (0, 0)

    def mine(full):
        return None if full is None else full[lo:hi].to(s.device, copy=True)   # not a view of the mapped file

    algo_saved = {"clients": {k: mine(v) for k, v in payload["algorithm"]["clients"].items()},
                  "server": _to(payload["algorithm"]["server"], s.device)}
    traffic = Traffic(len(ids), s.device)
    tr = payload["traffic"]
    traffic.received, traffic.max_round = mine(tr["received"]), mine(tr["max_round"])
    traffic.server_received, traffic.server_sent, traffic.server_max = (
        tr["server_received"], tr["server_sent"], tr["server_max"])
    saved = {k: (v.clone().numpy() if isinstance(v, torch.Tensor) else v) for k, v in payload["saved"].items()}
    lists = payload["final_lists"]
    return LoopState(round=int(payload["round"]), flat=mine(payload["weights"]).contiguous(),
                     algo_state=s.algo.load_state_dict(s.ctx, algo_saved), traffic=traffic,
                     stage1_counts=mine(payload["stage1_counts"]), saved=saved, history=list(payload["history"]),
                     final_lists=None if lists is None else lists.clone().numpy(),
                     final_assignment=_to(payload["final_assignment"], s.device), run_id=payload.get("run_id"))


# ----------------------------------------------------------------------------
# Observers at the edge of the loop


class Checkpointer:
    """Writes checkpoints: every ``checkpoint_every`` rounds (0: whenever
    :data:`CHECKPOINT_SECONDS` or 50x the last checkpoint's cost have passed,
    whichever is longer, so checkpoints take at most ~2% of the run), at the
    end, and on a stop request."""

    def __init__(self, s: Setup, out: str):
        self.s, self.out = s, out
        self.every = s.cfg.checkpoint_every
        self.last_time = time.monotonic()
        self.last_cost = 0.0
        self.last_path: Path | None = None

    def due_by_clock(self) -> bool:
        if self.every:
            return False
        return time.monotonic() - self.last_time >= max(CHECKPOINT_SECONDS, 50.0 * self.last_cost)

    def due(self, t: int, outcome: RoundOutcome) -> bool:
        cfg = self.s.cfg
        return (t == cfg.rounds or outcome.stop or outcome.checkpoint_due
                or (self.every > 0 and t % self.every == 0))

    def write(self, state: LoopState) -> None:
        started = time.monotonic()
        payload = collective(self.s, state.round, checkpoint_payload, self.s, state)
        if payload is not None:
            self.last_path = checkpoint.write(self.out, state.round, payload)
        self.last_cost = time.monotonic() - started
        self.last_time = time.monotonic()


CHECKPOINT_SECONDS = 300.0


def _pause_round() -> int | None:
    """Test hook: FEDCLUST_TEST_PAUSE_AFTER_ROUND=r makes rank 0, after round
    r's metrics (and checkpoint, if due) are written, create ``<out>/.paused``
    and wait there, so that a test can SIGKILL the job at a known round."""
    value = os.environ.get("FEDCLUST_TEST_PAUSE_AFTER_ROUND")
    return int(value) if value else None


def run(cfg, out: str | None = None) -> dict:
    """Run one experiment (or continue it from its newest checkpoint); returns
    the summary (on every rank)."""
    out = out or prepare(cfg)
    resume_from = checkpoint.choose(cfg, out, to_dict(cfg))
    started = time.time()
    fabric = make_fabric(cfg.device, cfg.collective_timeout)
    s = setup(cfg, fabric)
    if s.rank == 0:
        print(f"fedclust: run directory {out}; data {data_source(cfg, s.data)}", file=sys.stderr)
    if resume_from is not None:
        state = restore_state(s, resume_from[1])
        if s.rank == 0:
            print(f"fedclust: resuming {out} from {resume_from[0]} (round {state.round} of {cfg.rounds})",
                  file=sys.stderr)
    else:
        state = fresh_state(s)
    writer = (RunWriter(cfg, out, history=state.history if resume_from is not None else None,
                        say=lambda line: print(line, file=sys.stderr)) if s.rank == 0 else None)
    del resume_from
    tracker = Tracker(cfg, out, state.run_id) if s.rank == 0 and cfg.wandb.enabled else None
    if tracker is not None:
        state.run_id = tracker.id   # kept in the checkpoints: a continued run continues this W&B run
    exit_code = 1
    bar = make_progress(cfg.rounds, cfg.label or cfg.algorithm.name, cfg.progress, initial=state.round) \
        if s.rank == 0 else None
    ckpt = Checkpointer(s, out)
    stop = checkpoint.StopRequest().install()
    pause_after = _pause_round()
    summary = None
    try:
        for t in range(state.round + 1, cfg.rounds + 1):
            outcome = round_step(s, state, t, stop.requested, ckpt.due_by_clock())
            if t % cfg.eval_every == 0 or t == cfg.rounds:
                record = evaluate_round(s, state, outcome)
                if writer:
                    writer.log_round(record)
                if tracker:
                    tracker.log_round(record)
                if bar is not None:
                    bar.set_postfix(acc=f"{record['accuracy']:.2f}")
            if bar is not None:
                bar.update(1)
            if ckpt.due(t, outcome):
                ckpt.write(state)
            if pause_after == t and s.rank == 0:
                (Path(out) / ".paused").touch()
                while True:
                    time.sleep(3600)
            if outcome.stop and t < cfg.rounds:
                if tracker:   # before the requeue, which ends the job at once: W&B must hear first
                    tracker.finish(checkpoint.EXIT_REQUEUE, preempting=True)
                job = checkpoint.requeue() if s.rank == 0 else checkpoint.slurm_job()   # rank 0 requeues the job
                raise checkpoint.Stopped(t, stop.signal, ckpt.last_path or
                                         checkpoint.path_for(out, t), job)
        if state.round < cfg.rounds or not state.history:
            raise RuntimeError(f"run ended at round {state.round} of {cfg.rounds}")
        summary = _summary(cfg, state.history, s, time.time() - started)
        if writer:
            saved = dict(state.saved)
            if state.final_lists is not None:
                saved["final_lists"] = state.final_lists
            if state.final_assignment is not None:
                saved["assignment"] = state.final_assignment.cpu().numpy()
            np.savez_compressed(writer.dir / "neighbors.npz", **saved)
            writer.write_summary(summary)
            figures = _figures(writer.dir, summary, cfg, state.history) if cfg.figures else []
            if tracker:
                tracker.log_results(summary, [writer.dir / "figures" / f for f in figures], state.final_lists,
                                    state.final_assignment, s.data.clusters)
        exit_code = 0
    except checkpoint.Stopped:
        finish(fabric)
        raise
    finally:
        stop.restore()
        if bar is not None:
            bar.close()
        if writer:
            writer.close()
        if tracker:
            tracker.finish(exit_code)   # no-op if already finished
    if s.rank == 0:
        print(_summary_text(summary, out))
    finish(fabric)
    return summary


def _figures(run_dir: Path, summary: dict, cfg, history: list[dict]) -> list[str]:
    """The run's figures; a figure that fails is reported in one line, never failing the finished run."""
    try:
        return write_run_figures(run_dir, summary, cfg, records=history)
    except Exception as exc:   # matplotlib, fonts, odd data: the run's results are already on disk
        print(f"fedclust: figures not written ({type(exc).__name__}: {exc}); the run's metrics and summary are "
              "complete", file=sys.stderr)
        return []


def finish(fabric) -> None:
    """With several processes: wait until rank 0 has written everything, then
    close the process group, so that no rank exits while the others still use
    it (gloo aborts a process whose background threads are still running)."""
    if fabric.world_size > 1:
        fabric.barrier()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class Traffic:
    """Communication in whole models (docs/algorithms.md): per own client received so
    far, the server's totals, and the most any node received in a round."""

    def __init__(self, clients: int, device):
        self.received = torch.zeros(clients, dtype=torch.float64, device=device)
        self.max_round = torch.zeros(clients, dtype=torch.float64, device=device)  # per own client
        self.server_received = 0
        self.server_sent = 0
        self.server_max = 0

    def add(self, result) -> None:
        if result.received is not None:
            r = result.received.to(self.received)
            self.received += r
            self.max_round = torch.maximum(self.max_round, r)
        self.server_received += result.server_received
        self.server_sent += result.server_sent
        self.server_max = max(self.server_max, result.server_received)


def _stage1_arrays(s: Setup, state: LoopState) -> dict:
    """Who averaged with whom over stage one, and client 0's last
    similarities (client 0 is on rank 0), for the figures."""
    out = {"stage1_counts": gather_rows(s.fabric, state.stage1_counts, s.n).cpu().numpy()}
    sim = getattr(state.algo_state, "last_similarity", None) if s.algo.stage_one_figures else None
    if s.rank == 0 and sim is not None:
        out["similarity_client0"] = sim[0].float().cpu().numpy()
    return out


def _evaluate_round(s: Setup, result, traffic, t, all_train_loss, seconds, flat):
    """Mean test accuracy and loss, neighbour precision/recall and traffic,
    gathered from every rank; returns the record and all neighbour lists."""
    cfg, data, ctx, fabric = s.cfg, s.data, s.ctx, s.fabric
    acc, loss = evaluate(flat, s.layout, s.arch, data.test_x, data.test_y)
    C = len(ctx.client_ids)
    lists = result.lists if result.lists is not None else torch.zeros(C, cfg.clients, dtype=torch.bool,
                                                                        device=flat.device)
    precision, recall = neighbor_precision_recall(lists, ctx.clusters, ctx.client_ids)
    local = torch.stack([acc.double(), loss.double(), precision.double(), recall.double(),
                         traffic.received.double(), traffic.max_round.double()], dim=1)
    # One gather of bytes: the six float64 numbers bit for bit, then the lists as one byte per entry
    # (as float64 they were 8 bytes each: n·n·8 a round, 0.8 GB at 10,000 clients); no lists, no bytes.
    numbers = local.contiguous().view(torch.uint8)
    width = numbers.shape[1]
    sent = torch.cat([numbers, lists.to(torch.uint8)], dim=1) if result.lists is not None else numbers
    everyone = collective(s, t, gather_rows, fabric, sent, cfg.clients)
    values = everyone[:, :width].contiguous().view(torch.float64)
    acc_all, loss_all, prec_all, rec_all, recv_all, maxr_all = (values[:, i].cpu() for i in range(6))
    all_lists = everyone[:, width:].bool().cpu().numpy() if result.lists is not None else None
    has_lists = all_lists is not None and bool(all_lists.any())   # Local's empty lists define no neighbours
    clients_received = float(recv_all.sum())
    # Every model a client receives was sent by a peer or the server; clients
    # send one model per upload the server receives.
    record = {
        "round": t,
        "stage": 1 if t <= cfg.stage1_rounds else 2,
        "accuracy": 100.0 * float(acc_all.mean()),
        "loss": float(loss_all.mean()),
        "train_loss": float(all_train_loss.double().mean()),
        "neighbor_precision": nanmean(prec_all) if has_lists else None,
        "neighbor_recall": nanmean(rec_all) if has_lists else None,
        # Theorem 1's quantity: the share of clients (with a list) whose listed neighbours are all same-cluster
        "neighbor_all_same_share": nanmean((prec_all == 1.0).double().masked_fill(prec_all.isnan(), float("nan")))
        if has_lists else None,
        "models_received_total": clients_received + traffic.server_received,
        "models_sent_total": clients_received + traffic.server_received,
        "max_models_received_per_round": max(float(maxr_all.max()), float(traffic.server_max)),
        "round_seconds": seconds,
        "client_accuracy": [round(100.0 * float(a), 2) for a in acc_all],
    }
    if has_lists:
        record.update(cluster_recovery(all_lists, ctx.clusters.cpu().numpy()))
    elif result.assignment is not None:
        labels = result.assignment.cpu().numpy()
        record.update({"num_clusters": int(len(np.unique(labels))),
                       "ari": adjusted_rand_index(ctx.clusters.cpu().numpy(), labels)})
    return record, all_lists


def _summary(cfg, history, s: Setup, wall) -> dict:
    final = history[-1]
    best = max(history, key=lambda r: r["accuracy"])
    summary = {
        "algorithm": cfg.algorithm.name,
        "label": cfg.label or cfg.algorithm.name,
        "data": cfg.data.name,
        "data_clusters": None if cfg.data.name == "synthetic" else cfg.data.clusters,   # synthetic: no such kind
        "data_source": s.data.source,
        "true_clusters": cfg.data.num_clusters,
        "model": s.arch,
        "clients": cfg.clients,
        "rounds": cfg.rounds,
        "stage1_rounds": s.stage1_end,
        "train_size": cfg.data.train_size,
        "test_size": cfg.data.test_size,
        "seed": cfg.seed,
        "final_accuracy": final["accuracy"],
        "best_accuracy": best["accuracy"],
        "best_round": best["round"],
        "final_loss": final["loss"],
        "rounds_completed": final["round"],
        "neighbor_precision": final["neighbor_precision"],
        "neighbor_recall": final["neighbor_recall"],
        "num_clusters": final.get("num_clusters"),
        "ari": final.get("ari"),
        "models_sent_total": final["models_sent_total"],
        "models_received_total": final["models_received_total"],
        "max_models_received_per_round": final["max_models_received_per_round"],
        "models_received_per_client": final["models_received_total"] / cfg.clients,
        "wall_seconds": wall,
        "mean_round_seconds": float(np.mean([r["round_seconds"] for r in history])),
    }
    return summary


def _summary_text(s: dict, out: str) -> str:
    def pct(v):
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"

    return (f"{s['algorithm']}: final accuracy {s['final_accuracy']:.2f}% (best {s['best_accuracy']:.2f}% in round "
            f"{s['best_round']}), {s['rounds_completed']} rounds in {s['wall_seconds']:.1f}s; neighbour precision "
            f"{pct(s['neighbor_precision'])}, recall {pct(s['neighbor_recall'])}; run directory {out}")
