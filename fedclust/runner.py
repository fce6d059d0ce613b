"""The round loop (docs/algorithms.md) on Lightning Fabric.

Each rank holds a contiguous shard of clients: their flat weights stacked in
one [C, P] buffer and their data on the device.  A round is: vectorized local
training of the shard, one all-gather of the flat weights, the algorithm's
neighbour choice for the shard's clients, and the gossip average as one
mixing-matrix product.  Every random draw is keyed on (seed, round, client).

:func:`round_step` does no I/O; files, W&B, progress and checkpoints hang off
:func:`run` at the edge.  The bench tools use :func:`setup`,
:meth:`LoopState.fresh`, :func:`round_step` and :func:`finish`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
import torch.distributed

from fedclust import checkpoint, rng
from fedclust.algorithms import registry
from fedclust.algorithms.base import Algorithm, Context, RoundResult, RoundView
from fedclust.algorithms.peer_counts import add_mask, empty_counts, from_matrix
from fedclust.data import FederatedData, load_federated
from fedclust.data.validation import carve_validation
from fedclust.sizes import CHECKPOINT_BLOCK_BYTES
from fedclust.dist import (ColumnBlocks, exchange_columns, gather_parts, gather_rows,
                           launch_rank, make_fabric, shard_bounds)
from fedclust.engine.layout import ParamLayout
from fedclust.engine.module_net import ModuleNet
from fedclust.engine.pool import pool_losses
from fedclust.engine.precision import apply_precision
from fedclust.engine.train import TrainSettings, pair_losses, train_round
from fedclust.errors import CollectiveError, DivergenceError
from fedclust.evaluation import Traffic, evaluate_round, summarize, summary_text
from fedclust.figures import write_run_figures
from fedclust.lists import index_lists
from fedclust.models import initial_weights, make_net, model_name
from fedclust.outputs import RunLock, RunWriter, check_writable, default_out, write_atomic
from fedclust.progress import make_progress
from fedclust.config import run_facts
from fedclust.schema import Config, to_dict
from fedclust.stopping import (EXIT_REQUEUE, REQUEST, StartupSignal, Stopped, StopRequest, requeue, slurm_job,
                               stopped_at_startup)
from fedclust.tracking import Tracker, check_credentials


class Prepared(NamedTuple):
    """What the checks before the process group decided."""

    run_dir: str
    resume_from: tuple[Path, dict] | None   # (path, payload) of the checkpoint to continue, or None: afresh


def prepare(cfg: Config) -> Prepared:
    """Checks that must pass before any data is read or process group starts:
    the run directory can be written, W&B can log, and the resume decision
    (:func:`fedclust.checkpoint.choose`).  Creates nothing."""
    run_dir = cfg.out or default_out(cfg)
    check_writable(run_dir)
    check_credentials(cfg)
    return Prepared(run_dir, checkpoint.choose(cfg, run_dir, to_dict(cfg)))


@dataclass
class Setup:
    """What one rank holds fixed for the whole run (built once, read by every round)."""

    cfg: Config
    fabric: Any                  # lightning_fabric.Fabric (imported when a run starts)
    rank: int
    world: int
    device: torch.device
    n: int
    client_ids: torch.Tensor     # [C] global ids of this rank's clients
    data: FederatedData
    arch: str | ModuleNet        # what the engine trains: a built-in's name or a module's functional forward
    spec: str                    # the model as the config names it (mlp, FILE.py:NAME, ...)
    inputs: dict                 # the files it read besides the config, hashed once (checkpoint.input_files)
    layout: ParamLayout
    ctx: Context
    algo: Algorithm
    settings: TrainSettings      # the lr of round 1; round t's is derived from it
    stage1_end: int
    columns: int = 0             # the exchange's column block (config exchange_mb); 0: whole models at once
    round: int = 0               # the round under way (named by a collective's error)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` summed into it, in place (the context's ``all_reduce``); one process: ``x``."""
        if self.world > 1:
            self.collective(self.round, torch.distributed.all_reduce, x)
        return x

    def collective(self, t: int, fn, *args):
        """Run a collective; with several ranks, a failure or timeout becomes
        an error naming this rank and the round."""
        try:
            return fn(*args)
        except (RuntimeError, torch.distributed.DistError) as exc:
            if self.world == 1:
                raise
            first = str(exc).splitlines()[0] if str(exc) else ""
            raise CollectiveError(f"rank {self.rank}: a collective in round {t} failed or timed out "
                                  f"(collective_timeout = {self.cfg.collective_timeout:g} s): another rank stopped "
                                  f"or hangs ({type(exc).__name__}: {first})") from exc


def setup(cfg: Config, fabric) -> Setup:
    rank, world, device = fabric.global_rank, fabric.world_size, fabric.device
    # every run sets its own GPU arithmetic (an earlier run in this process may have set another)
    if not apply_precision(cfg.precision, device.type) and cfg.precision != "default" and rank == 0:
        print(f"fedclust: warning: precision={cfg.precision} changes nothing on a {device.type}: it computes IEEE "
              "float32 under every setting", file=sys.stderr, flush=True)
    n = cfg.clients
    start, stop = shard_bounds(n, world, rank)
    client_ids = torch.arange(start, stop, dtype=torch.int64)
    facts = run_facts(cfg)
    algo = registry.build(cfg, facts)
    data = load_federated(cfg.data, n, cfg.seed, client_ids.tolist(), device=device)
    # a validation split for an algorithm that asks for one (CFL's best-of-lineage choice); 0: data unchanged
    data = carve_validation(data, algo.validation_share, cfg.seed, algo.validation_key)
    spec = model_name(cfg)
    layout, w0 = initial_weights(spec, data.input_shape, data.num_classes, cfg.seed)
    w0 = w0.to(device)
    arch, why = make_net(spec, data.input_shape, data.num_classes, cfg.engine, device.type, cfg.seed)
    if why and rank == 0:
        print(f"fedclust: {why}", flush=True)

    def pair_loss(models, owner):
        return pair_losses(models, layout, arch, data.train_x, data.train_y, owner, counts=data.train_counts)

    def pool_loss(models, peers):
        return pool_losses(models, layout, arch, data.train_x, data.train_y, peers, counts=data.train_counts)

    clusters = None if data.clusters is None else data.clusters.to(device)   # None: the data gives no truth
    ctx = Context(n=n, client_ids=client_ids.to(device), clusters=clusters, seed=cfg.seed,
                  stage1_rounds=cfg.stage1_rounds, w0=w0, device=device, pair_loss=pair_loss,
                  pool_loss=pool_loss)
    settings = TrainSettings(lr=cfg.train.lr, momentum=cfg.train.momentum,
                             batch_size=cfg.train.batch_size, epochs=cfg.train.local_epochs)
    columns = 0
    if cfg.exchange_mb > 0:   # one process too: the same blocks, so 1 and W processes compute alike
        columns = exchange_columns(cfg.exchange_mb, n, world, 2 if algo.gathers_before else 1)
    made = Setup(cfg=cfg, fabric=fabric, rank=rank, world=world, device=device, n=n, client_ids=client_ids,
                 data=data, arch=arch, spec=spec, inputs=checkpoint.input_files(cfg), layout=layout, ctx=ctx,
                 algo=algo, settings=settings, stage1_end=min(cfg.stage1_rounds, cfg.rounds), columns=columns)
    ctx.all_reduce = made.all_reduce   # the algorithms' collectives go through the run's wrapper
    return made


# ----------------------------------------------------------------------------
# The loop's state: what a round carries to the next, and what a checkpoint holds


@dataclass
class LoopState:
    """What the round loop carries from one round to the next on one rank."""

    round: int                               # last completed round (0: none)
    flat: torch.Tensor                       # [C, P] this rank's clients' models
    algo_state: Any                          # the algorithm's own state dataclass
    traffic: Traffic
    # who each client averaged with in stage one, as lists (fedclust.algorithms.peer_counts):
    stage1_peers: torch.Tensor               # [C, w] int64 peers, ascending, -1 padding
    stage1_counts: torch.Tensor              # [C, w] int32 times averaged with each
    saved: dict = field(default_factory=dict)        # arrays for neighbors.npz (stage one's, rank 0's)
    history: list = field(default_factory=list)      # every metrics record written so far
    final_lists: np.ndarray | None = None    # [n, m] int32 neighbour lists of the last evaluated round (-1: none)
    final_assignment: torch.Tensor | None = None   # [n] cluster of every client in the last evaluated round
    run_id: str | None = None                # the tracking (W&B) run's id
    # the run's compute time: seconds of the processes before this one (each up to its last checkpoint), how
    # many processes have worked on it (this one included), and when this one started (time.time())
    seconds_before: float = 0.0
    starts: int = 1
    started: float = field(default_factory=time.time)

    def run_seconds(self) -> float:
        """Seconds of compute the run has had, over every process that worked on it, up to now."""
        return self.seconds_before + (time.time() - self.started)

    @classmethod
    def fresh(cls, s: Setup) -> "LoopState":
        C = len(s.client_ids)
        peers, counts = empty_counts(C, 0, s.device)
        return cls(round=0, flat=s.ctx.w0.expand(C, -1).clone(), algo_state=s.algo.init(s.ctx),
                   traffic=Traffic(C, s.device), stage1_peers=peers, stage1_counts=counts,
                   saved={} if s.data.clusters is None else {"clusters": s.data.clusters.cpu().numpy()})

    def state_dict(self, s: Setup) -> dict | None:
        """Everything a resume needs, rows in global client order (gathered on
        every rank; returned on rank 0, None elsewhere)."""
        sd = s.algo.state_dict(self.algo_state)
        rows = {k: _gather(s, v) for k, v in sd["clients"].items()}
        weights = _gather(s, self.flat)
        traffic = {"received": _gather(s, self.traffic.received), "max_round": _gather(s, self.traffic.max_round),
                   "server_received": self.traffic.server_received, "server_sent": self.traffic.server_sent,
                   "server_max": self.traffic.server_max}
        peers, counts = _gather_lists(s, self.round, self.stage1_peers, self.stage1_counts)
        if s.rank != 0:
            return None
        return {"config": to_dict(s.cfg), "inputs": s.inputs, "world_size": s.world,
                "weights": weights,
                "algorithm": {"clients": rows, "server": _cpu(sd["server"])}, "traffic": traffic,
                "stage1_peers": peers, "stage1_counts": counts, "saved": _cpu(self.saved), "history": self.history,
                "metric_lines": len(self.history), "final_lists": _cpu(self.final_lists),
                "final_assignment": _cpu(self.final_assignment), "run_id": self.run_id,
                "run_seconds": self.run_seconds(), "starts": self.starts}

    @classmethod
    def from_state_dict(cls, s: Setup, payload: dict) -> "LoopState":
        """This rank's state from a checkpoint written on any number of ranks."""
        ids = s.client_ids
        lo, hi = (int(ids[0]), int(ids[-1]) + 1) if len(ids) else (0, 0)

        def mine(full):
            if isinstance(full, dict):   # a bool [n, w] mask, packed eight columns a byte
                return checkpoint.unpack_bits(full["bits"][lo:hi], int(full["width"])).to(s.device)
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
        if "stage1_peers" in payload:
            peers, counts = mine(payload["stage1_peers"]), mine(payload["stage1_counts"])
        else:   # a checkpoint of an earlier version: a [n, n] table
            peers, counts = from_matrix(mine(payload["stage1_counts"]))
        return cls(round=int(payload["round"]), flat=mine(payload["weights"]).contiguous(),
                   algo_state=s.algo.load_state_dict(s.ctx, algo_saved), traffic=traffic,
                   stage1_peers=peers, stage1_counts=counts, saved=saved, history=list(payload["history"]),
                   final_lists=None if lists is None else index_lists(lists.clone().numpy()),   # older: [n, n]
                   final_assignment=_to(payload["final_assignment"], s.device), run_id=payload.get("run_id"),
                   # a checkpoint before run_seconds: its rounds' own times, start-up left out
                   seconds_before=float(payload.get("run_seconds", sum(r.get("round_seconds") or 0.0
                                                                       for r in payload["history"]))),
                   starts=int(payload.get("starts", 1)) + 1)


def _gather(s: Setup, rows):
    """[C, ...] rows of every rank as [n, ...] on rank 0's CPU (None elsewhere; bool travels as uint8).  Wide
    rows go in column blocks of at most :data:`CHECKPOINT_BLOCK_BYTES` gathered, each moved to rank 0's host
    as it arrives: no rank holds all n rows on its device, and only rank 0 keeps them."""
    if rows is None:
        return None
    if rows.dtype == torch.bool and rows.dim() == 2:   # masks travel and are saved eight columns a byte
        packed = _gather(s, checkpoint.pack_bits(rows))
        return None if packed is None else {"bits": packed, "width": rows.shape[1]}
    x = (rows.to(torch.uint8) if rows.dtype == torch.bool else rows).contiguous()
    if s.world == 1:   # nothing to gather (and on a CPU no copy)
        full = x.cpu()
        return full.bool() if rows.dtype == torch.bool else full
    flat = x.reshape(x.shape[0], -1)
    per_column = max(1, s.n * flat.element_size())
    step = max(1, CHECKPOINT_BLOCK_BYTES // per_column)
    out = torch.empty((s.n, flat.shape[1]), dtype=flat.dtype) if s.rank == 0 else None
    for lo in range(0, flat.shape[1], step):   # column blocks, not clients
        got = gather_rows(s.fabric, flat[:, lo:lo + step].contiguous(), s.n)
        if out is not None:
            out[:, lo:lo + step] = got.cpu()
    if out is None:
        return None
    out = out.reshape((s.n,) + tuple(x.shape[1:]))
    return out.bool() if rows.dtype == torch.bool else out


def _gather_lists(s: Setup, t: int, peers: torch.Tensor, counts: torch.Tensor):
    """Every rank's count lists (``[C, w]``, w differing between ranks) as
    ``[n, W]`` on rank 0's CPU, padded to the widest (None elsewhere)."""
    width = peers.shape[1]
    if s.world > 1:   # every rank learns the widest list, then pads to it
        widths = s.collective(t, gather_rows, s.fabric, torch.full((len(s.client_ids), 1), width,
                                                                    dtype=torch.int64, device=s.device), s.n)
        width = int(widths.max())
    pad = width - peers.shape[1]
    peers = torch.cat([peers, peers.new_full((peers.shape[0], pad), -1)], dim=1)
    counts = torch.cat([counts, counts.new_zeros((counts.shape[0], pad))], dim=1)
    return _gather(s, peers), _gather(s, counts)


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


# ----------------------------------------------------------------------------
# One round, no I/O

# Bits of the flags column every client sends in the round's gather.
STOP_BIT = 2   # this rank was asked to stop (SIGUSR1/SIGTERM)
DUE_BIT = 1    # this rank's checkpoint clock ran out


@dataclass
class RoundOutcome:
    result: RoundResult
    all_loss: torch.Tensor       # [n] training loss of every client this round (NaN: it did not train)
    trained: torch.Tensor | None  # [n] bool, the clients that trained this round; None: all
    seconds: float
    stop: bool                   # some rank was asked to stop
    checkpoint_due: bool         # some rank's checkpoint clock ran out


LABEL_LIMIT = 2**24   # RoundPlan.labels travel as float32 in the round's gather: exact below this


def round_step(s: Setup, state: LoopState, t: int, stop_flag: bool = False, due_flag: bool = False) -> RoundOutcome:
    """Round t: plan -> local training -> the round's one gather (weights,
    training losses, the flags, and the models before training if the
    algorithm uses them) -> aggregate.  Updates ``state`` in place."""
    cfg, algo, ctx = s.cfg, s.algo, s.ctx
    t0 = time.time()
    s.round = t
    settings = dataclasses.replace(s.settings, lr=cfg.train.round_lr(t))
    algo_state, plan = algo.plan(state.algo_state, ctx, t, state.flat)
    # trained in place: the held models, or one contiguous copy of the plan's start (a server's model for each
    # client); neither is read again this round: the held models go before the copy, the start after it
    flat = state.flat
    if plan.start is not flat:
        state.flat = None
        flat, plan.start = plan.start.clone(memory_format=torch.contiguous_format), None
    before = flat.clone() if algo.gathers_before else None
    counts = s.data.train_counts   # None: every client holds the full width
    # drawn where they are used (the hash and a stable sort give the same orders on any device)
    orders = rng.batch_orders(cfg.seed, t, s.ctx.client_ids, cfg.train.local_epochs, s.data.train_x.shape[1],
                              counts)
    trains = plan.trains   # None: everyone; else only the round's participants train (the others' loss is NaN)
    train_loss = train_round(flat, s.layout, s.arch, s.data.train_x, s.data.train_y, orders, settings,
                             anchor=plan.anchor, mu=plan.mu, counts=counts, prox_layers=plan.prox_layers,
                             train=None if trains is None else trains.cpu()[s.ctx.client_ids.cpu()])
    flags = torch.full((flat.shape[0], 1), STOP_BIT * stop_flag | DUE_BIT * due_flag, dtype=flat.dtype,
                       device=flat.device)
    labels = _labels(algo, plan) if algo.gathers_labels else None
    view, all_loss, all_flags = _exchange(s, t, flat, before, train_loss, flags, labels)
    del before   # the view holds what the algorithm needs; it drops the models from before when done with them
    trained = None if trains is None else trains.to(all_loss.device)
    diverged = ~torch.isfinite(all_loss) if trained is None else ~torch.isfinite(all_loss) & trained
    bad = diverged.nonzero().flatten().tolist()
    if bad:
        raise DivergenceError(t, bad)
    algo_state, result = algo.aggregate(algo_state, ctx, view)
    state.flat, state.algo_state, state.round = result.models, algo_state, t
    state.traffic.add(result)
    if result.averaged is not None and t <= s.stage1_end:
        state.stage1_peers, state.stage1_counts = add_mask(state.stage1_peers, state.stage1_counts, result.averaged)
    if t == s.stage1_end:
        state.saved.update(_stage1_arrays(s, state))
    raised = int(all_flags.max()) if all_flags.numel() else 0
    return RoundOutcome(result=result, all_loss=all_loss, trained=trained, seconds=time.time() - t0,
                        stop=bool(raised & STOP_BIT),
                        checkpoint_due=bool(raised & DUE_BIT))


def _labels(algo, plan) -> torch.Tensor:
    """The plan's labels as the gather carries them: integers in [0, 2^24), exact in float32."""
    labels = plan.labels
    if labels is None or (labels.numel() and not 0 <= int(labels.min()) <= int(labels.max()) < LABEL_LIMIT):
        raise ValueError(f"{algo.name} declares gathers_labels: its plan must give labels, integers in [0, 2^24) "
                         "(float32 carries them exactly)")
    return labels


def _exchange(s: Setup, t: int, flat, before, train_loss, flags, labels=None):
    """The round's gather: (view, every client's training loss, every client's flags); ``labels`` [C] go as
    one more column, to ``view.all_labels``.  Whole models in one collective, or (``s.columns``) the losses,
    flags and labels in one and the models in column blocks as the algorithm reads them
    (:class:`fedclust.dist.ColumnBlocks`)."""
    small = [train_loss[:, None].to(flat.dtype), flags]
    if labels is not None:
        small.append(labels.to(device=flat.device, dtype=flat.dtype)[:, None])
    if s.columns:
        got = s.collective(t, gather_parts, s.fabric, small, s.n)
        parts = {"after": flat} if before is None else {"after": flat, "before": before}
        blocks = ColumnBlocks(s.fabric, parts, s.n, s.columns, collective=lambda fn, *a: s.collective(t, fn, *a))
        view = RoundView(round=t, before=before, after=flat, all_after=None, columns=blocks)
    else:
        got = s.collective(t, gather_parts, s.fabric, [flat, *small] + ([] if before is None else [before]), s.n)
        view = RoundView(round=t, before=before, after=flat, all_after=got[0],
                         all_before=got[-1] if before is not None else None)
        got = got[1:1 + len(small)]
    if labels is not None:
        view.all_labels = got[2][:, 0].to(torch.int64)
    return view, got[0][:, 0], got[1][:, 0]


def _stage1_arrays(s: Setup, state: LoopState) -> dict:
    """Who averaged with whom over stage one, and client 0's last
    similarities (client 0 is on rank 0), for the figures."""
    peers, counts = _gather_lists(s, state.round, state.stage1_peers, state.stage1_counts)
    if s.rank != 0:
        return {}
    arrays = {"stage1_peers": peers.numpy().astype(np.int32), "stage1_counts": counts.numpy()}
    sim = getattr(state.algo_state, "similarity_client0", None) if s.algo.stage_one_figures else None
    if sim is not None:
        arrays["similarity_client0"] = sim.float().cpu().numpy()
    return arrays


# ----------------------------------------------------------------------------
# The run

# Called on every rank after each round's metrics and checkpoint: (setup, state, run directory). Plug-ins add
# theirs with add_round_end_hook (e.g. a test that stops the job at a known round).
_ROUND_END_HOOKS: list[Callable[[Setup, LoopState, str], None]] = []


def add_round_end_hook(hook: Callable[[Setup, LoopState, str], None]) -> None:
    """Call ``hook(setup, state, run_dir)`` on every rank at the end of every round of every later run."""
    _ROUND_END_HOOKS.append(hook)


def run(cfg: Config, prepared: Prepared | None = None) -> dict:
    """Run one experiment, or continue it from the checkpoint :func:`prepare`
    chose; returns the summary (on every rank).  SIGUSR1/SIGTERM stop
    start-up at once, the loop at the next round boundary after a checkpoint
    (:class:`fedclust.stopping.Stopped`), and change nothing once the run is
    complete."""
    stop = REQUEST.install()
    stop.begin()
    resume: tuple[int, Path | None] = (0, None)   # where a stop during start-up leaves the run
    try:
        prepared = prepared or prepare(cfg)                       # every check before the process group starts
        if prepared.resume_from is not None:
            resume = (int(prepared.resume_from[1]["round"]), prepared.resume_from[0])
        return _run(cfg, prepared, stop)
    except StartupSignal as sig:
        raise stopped_at_startup(sig.signal, launch_rank(), *resume) from None
    finally:
        stop.restore()


def _run(cfg: Config, prepared: Prepared, stop: StopRequest) -> dict:
    run_dir = prepared.run_dir
    with RunLock.for_rank(run_dir, launch_rank()):            # one run writes a directory at a time
        fabric = make_fabric(cfg.device, cfg.collective_timeout, cfg.startup_timeout)   # one process per device
        s = setup(cfg, fabric)                                     # this rank's clients, their data, the algorithm
        resumed = prepared.resume_from[0] if prepared.resume_from is not None else None
        state = LoopState.from_state_dict(s, prepared.resume_from[1]) if resumed is not None else LoopState.fresh(s)
        state.started = stop.started
        del prepared                                               # the checkpoint's pages: not held for the run
        stop.running()                                             # from here a signal stops at a round boundary
        edge = Edge(s, state, run_dir, resumed) if s.rank == 0 else None   # files, W&B, progress: rank 0 only
        ckpt = checkpoint.Checkpointer(s, run_dir)
        try:
            for t in range(state.round + 1, cfg.rounds + 1):
                outcome = round_step(s, state, t, stop.requested, ckpt.clock_due())
                if t % cfg.eval_every == 0 or t == cfg.rounds:     # every rank gathers the round's metrics
                    record, state.final_lists = evaluate_round(s, state, outcome)
                    state.final_assignment = outcome.result.assignment
                    state.history.append(record)
                    if edge:
                        edge.log_round(record)
                if edge:
                    edge.round_done()
                ckpt.after_round(state, outcome)                    # saves when due, asked, or at the end
                for hook in _ROUND_END_HOOKS:
                    hook(s, state, run_dir)
                if outcome.stop and t < cfg.rounds:                # checkpoint written: requeue and leave
                    raise _stopped(s, edge, t, stop, ckpt.last_path or checkpoint.path_for(run_dir, t))
                del outcome   # its models are the state's: a server algorithm's next round lets them go
            summary = summarize(s, state.history, state.run_seconds(), time.time() - state.started, state.starts)
            if edge:
                edge.finish_run(summary)
            stop.finished()                                        # complete: a signal from here changes nothing
        except Stopped:
            finish(fabric)
            raise
        finally:
            if edge:
                edge.close()
        finish(fabric)
        return summary


def _stopped(s: Setup, edge, t: int, stop: StopRequest, path: Path) -> Stopped:
    if edge and edge.tracker:   # before the requeue, which ends the job at once: W&B must hear first
        edge.tracker.finish(EXIT_REQUEUE, preempting=True)
    job, requeued = requeue() if s.rank == 0 else (slurm_job(), None)   # rank 0 requeues the job
    return Stopped(t, stop.signal, path, job, requeued if job else None)


def finish(fabric) -> None:
    """With several processes: wait until rank 0 has written everything, then
    close the process group, so that no rank exits while the others still use
    it (gloo aborts a process whose background threads are still running)."""
    if fabric.world_size > 1:
        fabric.barrier()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


class Edge:
    """Rank 0's outputs around the loop: the run directory, W&B, progress."""

    def __init__(self, s: Setup, state: LoopState, run_dir: str, resumed: Path | None):
        """``resumed``: the checkpoint the run continues from (None: a fresh start)."""
        cfg = s.cfg
        self.s, self.state, self.run_dir = s, state, run_dir
        say = _say
        say(f"fedclust: run directory {run_dir}; data {data_source(cfg, s.data)}")
        if resumed:
            say(f"fedclust: resuming {run_dir} from {resumed} (round {state.round} of {cfg.rounds})")
        self.writer = RunWriter(cfg, run_dir, history=state.history if resumed is not None else None, say=say)
        self.tracker = Tracker(cfg, run_dir, state.run_id) if cfg.wandb.enabled else None
        if self.tracker is not None:
            state.run_id = self.tracker.id   # kept in the checkpoints: a continued run continues this W&B run
        self.bar = make_progress(cfg.rounds, cfg.label or cfg.algorithm.name, cfg.progress, initial=state.round)
        self.exit_code = 1

    def log_round(self, record: dict) -> None:
        self.writer.log_round(record)
        if self.tracker:
            self.tracker.log_round(record)
        if self.bar is not None:
            self.bar.set_postfix(acc=f"{record['accuracy']:.2f}")

    def round_done(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def finish_run(self, summary: dict) -> None:
        """neighbors.npz, summary.json, the figures and W&B's results; the last line of output."""
        state, cfg = self.state, self.s.cfg
        arrays = dict(state.saved)
        if state.final_lists is not None:
            arrays["final_lists"] = state.final_lists
        if state.final_assignment is not None:
            arrays["assignment"] = state.final_assignment.cpu().numpy()
        write_atomic(self.writer.dir / "neighbors.npz", lambda tmp: _savez(tmp, arrays))
        self.writer.write_summary(summary)
        figures = _figures(self.writer.dir, summary, cfg, state.history) if cfg.figures else []
        if self.tracker:
            self.tracker.log_results(summary, [self.writer.dir / "figures" / f for f in figures], state.final_lists,
                                     state.final_assignment, self.s.data.clusters)
        self.exit_code = 0
        self.close()
        print(summary_text(summary, self.run_dir))

    def close(self) -> None:
        """Close the progress bar, metrics file and W&B run (again: nothing)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.writer.close()
        if self.tracker:
            self.tracker.finish(self.exit_code)   # no-op if already finished


def _savez(path: Path, arrays: dict) -> None:
    with open(path, "wb") as f:   # a file object: numpy adds no .npz to the temporary name
        np.savez_compressed(f, **arrays)


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def data_source(cfg: Config, data: FederatedData) -> str:
    """Where the run's data came from, saying when it was not ``data.root``."""
    if data.source is None:
        return f"{cfg.data.name}, generated"
    source = Path(data.source)
    if source.is_file():   # a data file (data.path), not a folder under data.root
        return f"{cfg.data.name} from {source}"
    root = Path(cfg.data.root).expanduser().resolve()
    if source == root or root in source.parents:
        return f"{cfg.data.name} from {source}"
    why = "does not exist" if not root.exists() else f"holds no {cfg.data.name} files"
    return f"{cfg.data.name} from {source} (fallback: data.root {cfg.data.root!r} {why})"


def _figures(run_dir: Path, summary: dict, cfg: Config, history: list[dict]) -> list[str]:
    """The run's figures; a figure that fails is reported in one line, never failing the finished run."""
    try:
        return write_run_figures(run_dir, summary, cfg, records=history)
    except Exception as exc:   # matplotlib, fonts, odd data: the run's results are already on disk
        _say(f"fedclust: figures not written ({type(exc).__name__}: {exc}); the run's metrics and summary are "
             "complete")
        return []
