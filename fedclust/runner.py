"""The round loop (docs/algorithms.md) on Lightning Fabric: the run's
set-up, one round, and the loop.

Each rank holds a contiguous shard of clients: their flat weights stacked in
one [C, P] buffer and their data on the device.  A round is: vectorized local
training of the shard, one all-gather of the flat weights, the algorithm's
neighbour choice for the shard's clients, and the gossip average as one
mixing-matrix product.  Every random draw is keyed on (seed, round, client).

:func:`round_step` does no I/O.  What a round carries to the next is
:class:`fedclust.state.LoopState`; when and where it is saved,
:class:`fedclust.checkpoint.Checkpointer`; rank 0's files, W&B and progress,
:class:`fedclust.rank0.RankZeroOutput`.  The bench tools use :func:`build`,
:meth:`LoopState.fresh`, :func:`round_step` and :func:`finish`.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch

from fedclust import checkpoint, rng
from fedclust.algorithms import registry
from fedclust.algorithms.base import Algorithm, Context, RoundPlan, RoundResult
from fedclust.algorithms.peer_counts import add_mask
from fedclust.attack import attackers, flip_labels, poison_
from fedclust.config import personal_columns, run_facts, validation_split
from fedclust.data import FederatedData, load_federated
from fedclust.data.validation import carve_validation
from fedclust.dist import Collectives, exchange_columns, finish, gather_parts, launch_rank, make_fabric, shard_bounds
from fedclust.engine.functional import Arch
from fedclust.engine.layout import ParamLayout
from fedclust.engine.pool import pool_losses
from fedclust.engine.precision import apply_precision
from fedclust.engine.train import TrainSettings, pair_losses, sample_losses, train_round
from fedclust.errors import DivergenceError
from fedclust.evaluation import evaluate_round, keep_best_models, summarize
from fedclust.exchange import exchange, plan_labels
from fedclust.identity import run_identity
from fedclust.network import Network
from fedclust.outputs import RunLock, check_writable, default_out
from fedclust.rank0 import RankZeroOutput
from fedclust.runmodel import run_model
from fedclust.schema import Config, to_dict
from fedclust.state import LoopState, stage1_arrays
from fedclust.stopping import (
    EXIT_REQUEUE,
    REQUEST,
    StartupSignal,
    Stopped,
    StopRequest,
    requeue,
    slurm_job,
    stopped_at_startup,
)
from fedclust.tracking import check_credentials

__all__ = ["Prepared", "prepare", "Setup", "build", "LoopState", "RoundOutcome", "round_step", "run", "finish",
           "add_round_end_hook"]


class Prepared(NamedTuple):
    """What the checks before the process group decided."""

    run_dir: str
    resume_from: tuple[Path, dict] | None   # (path, payload) of the checkpoint to continue, or None: afresh


def prepare(cfg: Config) -> Prepared:
    """Checks that must pass before any data is read or process group starts:
    the run directory can be written, W&B can log, and the resume decision
    (:func:`fedclust.checkpoint.choose`, which also refuses a folder that is
    neither empty nor fedclust's own).  Creates nothing."""
    run_dir = cfg.out or default_out(cfg)
    check_writable(run_dir)
    check_credentials(cfg)
    return Prepared(run_dir, checkpoint.choose(cfg, run_dir, to_dict(cfg)))


@dataclass
class Setup:
    """What one rank holds fixed for the whole run, built once and read by
    every round (:class:`fedclust.rank.RankSetup`)."""

    cfg: Config
    fabric: Any                  # lightning_fabric.Fabric, or fedclust.dist.OneProcess
    rank: int
    world: int
    device: torch.device
    n: int
    client_ids: torch.Tensor     # [C] global ids of this rank's clients
    data: FederatedData
    arch: Arch                   # what the engine trains: a built-in's name or a module's functional forward
    spec: str                    # the model as the config names it (mlp, FILE.py:NAME, ...)
    inputs: dict                 # the files it read besides the config, hashed once (checkpoint.input_files)
    layout: ParamLayout
    ctx: Context
    algo: Algorithm
    settings: TrainSettings      # the lr of round 1; round t's is derived from it
    stage1_end: int
    comm: Collectives            # every collective of the run goes through it
    network: Network             # each round's graph, who is online, who straggles (config network)
    attackers: torch.Tensor | None = None   # [n] bool, the run's attackers (config attack); None: none
    columns: int = 0             # the exchange's column block (config exchange_mb); 0: whole models at once

    def collective(self, t: int, fn, *args):
        """``fn(*args)``, a collective of round ``t`` (:meth:`fedclust.dist.Collectives.run`)."""
        return self.comm.run(t, fn, *args)


def build(cfg: Config, fabric) -> Setup:
    """This rank's :class:`Setup`: its clients and their data, the model, the algorithm and its context."""
    rank, world, device = fabric.global_rank, fabric.world_size, fabric.device
    # every run sets its own GPU arithmetic (an earlier run in this process may have set another)
    if not apply_precision(cfg.precision, device.type) and cfg.precision != "default" and rank == 0:
        print(f"fedclust: warning: precision={cfg.precision} changes nothing on a {device.type}: it computes IEEE "
              "float32 under every setting", file=sys.stderr, flush=True)
    n = cfg.clients
    start, stop = shard_bounds(n, world, rank)
    client_ids = torch.arange(start, stop, dtype=torch.int64)
    model = run_model(cfg)                                       # its layout, w0 and module, built once
    algo = registry.build(cfg, run_facts(cfg, model))
    data = load_federated(cfg.data, n, cfg.seed, client_ids.tolist(), device=device)
    # a validation split: data.validation's, or the algorithm's own (CFL's best-of-lineage choice); 0: data unchanged
    share, key = validation_split(cfg, algo)
    data = carve_validation(data, share, cfg.seed, key)
    bad = attackers(cfg.seed, n, cfg.attack.fraction)   # the same on every rank
    if bad is not None and cfg.attack.kind == "label_flip":   # they train on flipped labels, every round
        data = dataclasses.replace(data, train_y=flip_labels(data.train_y, bad[client_ids], data.num_classes))
    spec, layout, w0 = model.spec, model.layout, model.w0.clone()
    # train_counts is None only where every client, on every rank, holds the full width: the same choice everywhere
    arch, why = model.net(cfg.engine, device.type, unequal=data.train_counts is not None)
    if why and rank == 0:
        print(f"fedclust: {why}", flush=True)

    def pair_loss(models, owner):
        return pair_losses(models, layout, arch, data.train_x, data.train_y, owner, counts=data.train_counts)

    def pool_loss(models, peers):
        return pool_losses(models, layout, arch, data.train_x, data.train_y, peers, counts=data.train_counts)

    def sample_loss(models):
        return sample_losses(models, layout, arch, data.train_x, data.train_y, counts=data.train_counts)

    comm = Collectives(rank, world, cfg.collective_timeout)
    network = Network(cfg.network, n, cfg.seed)   # each round's graph and who is online, the same on every rank
    clusters = None if data.clusters is None else data.clusters.to(device)   # None: the data gives no truth
    ctx = Context(n=n, client_ids=client_ids.to(device), clusters=clusters, seed=cfg.seed,
                  stage1_rounds=cfg.stage1_rounds, w0=w0.to(device), device=device, pair_loss=pair_loss,
                  pool_loss=pool_loss, sample_loss=sample_loss, all_reduce=comm.all_reduce,
                  train_examples=(data.train_counts if data.train_counts is not None else
                                  torch.full((len(client_ids),), data.train_x.shape[1])).to(torch.int64).cpu(),
                  train_width=int(data.train_x.shape[1]),
                  reach=lambda t: network.reach(t, client_ids, device), graph=network.graph, online=network.online,
                  delivery=lambda t: network.delivery(t, client_ids),
                  personal=personal_columns(cfg, algo, layout))
    settings = TrainSettings(lr=cfg.train.lr, momentum=cfg.train.momentum,
                             batch_size=cfg.train.batch_size, epochs=cfg.train.local_epochs)
    columns = 0
    if cfg.exchange_mb > 0:   # one process too: the same blocks, so 1 and W processes compute alike
        columns = exchange_columns(cfg.exchange_mb, n, world, 2 if algo.gathers_before else 1)
    return Setup(cfg=cfg, fabric=fabric, rank=rank, world=world, device=device, n=n, client_ids=client_ids,
                 data=data, arch=arch, spec=spec, inputs=checkpoint.input_files(cfg), layout=layout, ctx=ctx,
                 algo=algo, settings=settings, stage1_end=min(cfg.stage1_rounds, cfg.rounds), comm=comm,
                 network=network, attackers=bad, columns=columns)


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
    skipped: bool = False        # no client was online: nothing trained or exchanged (network.p_offline)


def round_step(setup: Setup, state: LoopState, t: int, stop_flag: bool = False,
               due_flag: bool = False) -> RoundOutcome:
    """Round t: plan -> local training -> the round's one gather (weights,
    training losses, the flags, and the models before training if the
    algorithm uses them) -> aggregate.  Updates ``state`` in place."""
    cfg, algo, ctx, data = setup.cfg, setup.algo, setup.ctx, setup.data
    t0 = time.time()
    setup.comm.round = t
    online = ctx.online(t)   # None: everyone online
    if online is not None and not bool(online.any()):
        return _empty_round(setup, state, t, t0, stop_flag, due_flag)
    settings = dataclasses.replace(setup.settings, lr=cfg.train.round_lr(t))
    algo_state, plan = algo.plan(state.algo_state, ctx, t, state.flat)
    # trained in place: the held models, or one contiguous copy of the plan's start (a server's model for each
    # client); neither is read again this round: the held models go before the copy, the start after it (the
    # attributes are deleted, not set to None: the round's result sets state.flat again)
    flat = state.flat
    if plan.start is not flat:
        del state.flat, flat   # no name holds the held models while the start is copied
        flat = plan.start.clone(memory_format=torch.contiguous_format)
        del plan.start
    before = flat.clone() if algo.gathers_before else None
    counts = data.train_counts   # None: every client holds the full width
    subset = None
    if plan.samples is not None:   # each client's examples of the round first; it trains on those alone
        subset = training_subset(plan.samples, counts)
        counts = subset[2].clamp_min(1)   # a client with none must not train (checked below)
    if plan.phases is not None:   # training in phases (DePRL's head, then body): their epochs in all
        settings = dataclasses.replace(settings, epochs=sum(e for e, _ in plan.phases))
    # drawn where they are used (the hash and a stable sort give the same orders on any device)
    orders = rng.batch_orders(cfg.seed, t, ctx.client_ids, settings.epochs, data.train_x.shape[1], counts)
    trains = plan.trains   # None: everyone; else only the round's participants train (the others' loss is NaN)
    if online is not None:   # an offline client does not train
        trains = online if trains is None else trains & online
    if subset is not None:
        mine = torch.ones(len(ctx.client_ids), dtype=torch.bool) if trains is None else trains.cpu()[ctx.own_rows]
        if bool((mine & (subset[2].cpu() == 0)).any()):
            raise ValueError(f"{algo.name}: round {t}'s plan gives a client that trains no training example "
                             "(RoundPlan.samples); give it at least one, or leave it out of RoundPlan.trains")
    sending = _attacking(setup, trains)   # this rank's attackers training this round: [rows], or None
    start = flat[sending].clone() if sending is not None else None
    train_loss = _train(setup, flat, orders, settings, plan, trains, setup.network.stragglers(t), subset)
    kept = None   # what this rank's model-poisoning attackers trained: they keep it, and send poison instead
    if sending is not None and start is not None:
        kept = flat[sending].clone()
        poison_(flat, start, sending, ctx.client_ids[sending.to(ctx.client_ids.device)], cfg.attack, cfg.seed, t)
    flags = torch.full((flat.shape[0], 1), STOP_BIT * stop_flag | DUE_BIT * due_flag, dtype=flat.dtype,
                       device=flat.device)
    labels = plan_labels(algo, plan) if algo.gathers_labels else None
    view, all_loss, all_flags = exchange(setup, t, flat, before, train_loss, flags, labels)
    del before   # the view holds what the algorithm needs; it drops the models from before when done with them
    trained = None if trains is None else trains.to(all_loss.device)
    diverged = ~torch.isfinite(all_loss) if trained is None else ~torch.isfinite(all_loss) & trained
    bad = diverged.nonzero().flatten().tolist()
    if bad:
        raise DivergenceError(t, bad)
    algo_state, result = algo.aggregate(algo_state, ctx, view)
    if kept is not None:   # an attacker takes in nothing: what it holds stays an honest local model (a copy, as
        # the result's models may be the algorithm's state)
        result = dataclasses.replace(result, models=result.models.index_put((sending,), kept))
    state.flat, state.algo_state, state.round = result.models, algo_state, t
    state.traffic.add(result)
    if result.averaged is not None and t <= setup.stage1_end:
        state.stage1_peers, state.stage1_counts = add_mask(state.stage1_peers, state.stage1_counts, result.averaged)
    if t == setup.stage1_end:
        state.saved.update(stage1_arrays(setup, state))
    raised = int(all_flags.max()) if all_flags.numel() else 0
    return RoundOutcome(result=result, all_loss=all_loss, trained=trained, seconds=time.time() - t0,
                        stop=bool(raised & STOP_BIT), checkpoint_due=bool(raised & DUE_BIT))


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
        return _loop(cfg, prepared, stop)
    except StartupSignal as sig:
        raise stopped_at_startup(sig.signal, launch_rank(), *resume) from None
    finally:
        stop.restore()


def _attacking(setup: Setup, trains: torch.Tensor | None) -> torch.Tensor | None:
    """Local rows of this rank's attackers that train this round (they send poison), or None: none."""
    if setup.attackers is None or setup.cfg.attack.kind == "label_flip":   # label_flip's poison is in its labels
        return None
    ids = setup.client_ids
    mine = setup.attackers[ids] & (True if trains is None else trains.cpu()[ids])
    rows = mine.nonzero().flatten()
    return rows.to(setup.device) if len(rows) else None


def training_subset(samples: torch.Tensor, counts: torch.Tensor | None):
    """``(order [C, N], rows [C, 1], counts [C])`` of a round's ``samples`` (bool ``[C, N]``, each client's examples
    to train on, kept to its ``counts`` where given): each client's chosen examples first, in index order, then the
    rest; ``x[rows, order]`` is its data as a client of ``counts[c]`` examples."""
    C, N = samples.shape
    keep = samples.to(torch.bool)
    if counts is not None:
        keep = keep & (torch.arange(N, device=keep.device)[None, :] < counts.to(keep.device)[:, None])
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)
    return order, torch.arange(C, device=order.device)[:, None], keep.sum(1)


def _train(setup: Setup, flat: torch.Tensor, orders: torch.Tensor, settings: TrainSettings, plan: RoundPlan,
           trains: torch.Tensor | None, slow: torch.Tensor | None, subset=None) -> torch.Tensor:
    """The round's local training of this rank's clients, in place on ``flat``: ``trains`` (bool [n], None:
    all) train, the stragglers among them (``slow``, bool [n]) for ``network.straggler_work`` of their steps.
    Returns each client's mean training loss (NaN: it did not train)."""
    data, ids = setup.data, setup.ctx.client_ids.cpu()
    x, y, counts = data.train_x, data.train_y, data.train_counts
    if subset is not None:   # the round's examples of each client first (a copy of the data, [C, N, ...])
        order, rows, counts = subset
        x, y = x[rows.to(x.device), order.to(x.device)], y.to(order.device)[rows, order]
        counts = counts.clamp_min(1)   # a client with none does not train; its count only pads

    def run(step_settings: TrainSettings, mask: torch.Tensor | None) -> torch.Tensor:
        return train_round(flat, setup.layout, setup.arch, x, y, orders, step_settings,
                           anchor=plan.anchor, mu=plan.mu, counts=counts, prox_layers=plan.prox_layers,
                           train=None if mask is None else mask.cpu()[ids], phases=plan.phases)

    if slow is None:
        return run(settings, trains)
    train_all = torch.ones_like(slow) if trains is None else trains.cpu()
    steps = settings.epochs * math.ceil(data.train_x.shape[1] / settings.batch_size)
    few = dataclasses.replace(settings, max_steps=max(1, math.ceil(setup.cfg.network.straggler_work * steps)))
    full, short = run(settings, train_all & ~slow), run(few, train_all & slow)   # a client's bits: its own alone
    return torch.where(slow.to(full.device)[ids.to(full.device)], short, full)


def _empty_round(setup: Setup, state: LoopState, t: int, t0: float, stop_flag: bool, due_flag: bool) -> RoundOutcome:
    """Round t with no client online: nothing trains or is exchanged, every model and the algorithm's state stay
    as they were; only the flags travel (every rank knows the round is empty: who is online is replicated)."""
    C = len(setup.client_ids)
    device = setup.ctx.device
    loss = torch.full((C, 1), float("nan"), device=device)
    flags = torch.full((C, 1), float(STOP_BIT * stop_flag | DUE_BIT * due_flag), device=device)
    all_loss, all_flags = (g[:, 0] for g in setup.collective(t, gather_parts, setup.fabric, [loss, flags], setup.n))
    state.round = t
    if t == setup.stage1_end:
        state.saved.update(stage1_arrays(setup, state))
    raised = int(all_flags.max()) if all_flags.numel() else 0
    return RoundOutcome(result=RoundResult(models=state.flat), all_loss=all_loss,
                        trained=torch.zeros(setup.n, dtype=torch.bool, device=all_loss.device),
                        seconds=time.time() - t0, stop=bool(raised & STOP_BIT), checkpoint_due=bool(raised & DUE_BIT),
                        skipped=True)


def _loop(cfg: Config, prepared: Prepared, stop: StopRequest) -> dict:
    run_dir = prepared.run_dir
    # rank 0 marks the directory as a run's (its first write there), then locks it: one run writes it at a time
    with RunLock.for_rank(run_dir, launch_rank()):
        fabric = make_fabric(cfg.device, cfg.collective_timeout, cfg.startup_timeout,   # one process per device
                             identity=run_identity(cfg, run_dir))                # only this run's ranks join
        setup = build(cfg, fabric)                                 # this rank's clients, their data, the algorithm
        resumed = prepared.resume_from[0] if prepared.resume_from is not None else None
        state = (LoopState.from_state_dict(setup, prepared.resume_from[1]) if prepared.resume_from is not None
                 else LoopState.fresh(setup))
        state.started = stop.started
        del prepared                                               # the checkpoint's pages: not held for the run
        stop.running()                                             # from here a signal stops at a round boundary
        out = RankZeroOutput(setup, state, run_dir, resumed) if setup.rank == 0 else None   # files, W&B, progress
        ckpt = checkpoint.Checkpointer(setup, run_dir)
        try:
            for t in range(state.round + 1, cfg.rounds + 1):
                outcome = round_step(setup, state, t, stop.requested, ckpt.clock_due())
                if outcome.skipped and out:
                    out.note(f"fedclust: round {t}: no client online (network.{_offline_key(cfg)}); skipped: "
                             "nothing trained or exchanged")
                if t % cfg.eval_every == 0 or t == cfg.rounds:     # every rank gathers the round's metrics
                    record, state.final_lists = evaluate_round(setup, state, outcome)
                    keep_best_models(setup, state, record)
                    state.final_assignment = outcome.result.assignment
                    state.history.append(record)
                    if out:
                        out.log_round(record)
                if out:
                    out.round_done()
                ckpt.after_round(state, outcome)                    # saves when due, asked, or at the end
                for hook in _ROUND_END_HOOKS:
                    hook(setup, state, run_dir)
                if outcome.stop and t < cfg.rounds:                # checkpoint written: requeue and leave
                    raise _stopped(setup, out, t, stop, ckpt.last_path or checkpoint.path_for(run_dir, t))
                del outcome   # its models are the state's: a server algorithm's next round lets them go
            summary = summarize(setup, state.history, state.run_seconds(), time.time() - state.started,
                                state.starts)
            if out:
                out.finish_run(summary)
            stop.finished()                                        # complete: a signal from here changes nothing
        except Stopped:
            finish(fabric)
            raise
        finally:
            if out:
                out.close()
        finish(fabric)
        return summary


def _offline_key(cfg: Config) -> str:
    return "availability" if cfg.network.availability else "p_offline"


def _stopped(setup: Setup, out: RankZeroOutput | None, t: int, stop: StopRequest, path: Path) -> Stopped:
    if out and out.tracker:   # before the requeue, which ends the job at once: W&B must hear first
        out.tracker.finish(EXIT_REQUEUE, preempting=True)
    job, requeued = requeue() if setup.rank == 0 else (slurm_job(), None)   # rank 0 requeues the job
    return Stopped(t, stop.signal, path, job, requeued if job else None)
