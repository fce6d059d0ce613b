"""The run (docs/algorithms.md) on Lightning Fabric: the checks before
anything starts, this rank's set-up, and the round loop.

Each rank holds a contiguous shard of clients: their flat weights stacked in
one [C, P] buffer and their data on the device.  A round is: vectorized local
training of the shard, one all-gather of the flat weights, the algorithm's
neighbour choice for the shard's clients, and the gossip average as one
mixing-matrix product.  Every random draw is keyed on (seed, round, client).

One round is :func:`fedclust.round.round_step` (no I/O).  What a round
carries to the next is :class:`fedclust.state.LoopState`; when and where it
is saved, :class:`fedclust.checkpoint.Checkpointer`; rank 0's files, W&B and
progress, :class:`fedclust.rank0.RankZeroOutput`.  The bench tools use
:func:`build`, :func:`fresh_state`, :func:`round_step` and :func:`finish`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from fedclust import checkpoint
from fedclust.algorithms import registry
from fedclust.algorithms.base import Context, LossNotGiven
from fedclust.attack import attackers, flip_labels
from fedclust.config import personal_columns, run_facts, validation_split
from fedclust.data import load_federated
from fedclust.data.drift import Drift, drift_rounds, truths
from fedclust.data.validation import carve_validation
from fedclust.dist import Collectives, exchange_columns, finish, launch_rank, make_fabric, shard_bounds
from fedclust.engine.pool import pool_losses
from fedclust.engine.precision import apply_precision
from fedclust.engine.train import TrainSettings, batch_grads, pair_losses, sample_losses
from fedclust.evaluation import evaluate_round, keep_best_models, summarize
from fedclust.identity import run_identity
from fedclust.network import Join, Network, join_peers
from fedclust.outputs import RunLock, check_writable, default_out
from fedclust.rank import Setup, Shard
from fedclust.rank0 import RankZeroOutput
from fedclust.round import RoundOutcome, round_step, training_subset  # noqa: F401  (the bench tools', the tests')
from fedclust.runmodel import run_model
from fedclust.schema import Config, to_dict
from fedclust.state import LoopState
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

__all__ = ["Prepared", "prepare", "Setup", "build", "LoopState", "fresh_state", "RoundOutcome", "round_step", "run",
           "finish", "add_round_end_hook"]


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


def engine_losses(layout, arch, data) -> dict:
    """The Context's loss and gradient functions on this rank's clients' data (``pair_loss``, ``pool_loss``,
    ``sample_loss``, ``batch_grad``; ``val_loss`` where a validation split is carved)."""

    def pair_loss(models, owner):
        return pair_losses(models, layout, arch, data.train_x, data.train_y, owner, counts=data.train_counts)

    def pool_loss(models, peers):
        return pool_losses(models, layout, arch, data.train_x, data.train_y, peers, counts=data.train_counts)

    def sample_loss(models):
        return sample_losses(models, layout, arch, data.train_x, data.train_y, counts=data.train_counts)

    def batch_grad(models, owner, examples, weights):   # CoBo's gradients at midpoints
        return batch_grads(models, layout, arch, data.train_x, data.train_y, owner, examples, weights)

    def val_loss(models, owner):   # on the validation split, where one is carved (DPFL's rewards)
        return pair_losses(models, layout, arch, data.val_x, data.val_y, owner, counts=data.val_counts)

    return {"pair_loss": pair_loss, "pool_loss": pool_loss, "sample_loss": sample_loss, "batch_grad": batch_grad,
            "val_loss": LossNotGiven("val_loss") if data.val_x is None else val_loss}


def client_data(cfg: Config, algo, ids: torch.Tensor, device, bad: torch.Tensor | None,
                held: torch.Tensor | None = None):
    """The data of clients ``ids`` as the run trains and tests them: loaded (under the clusters ``held`` where
    given: drift's rows), its validation split carved, an attacker's labels flipped."""
    data = load_federated(cfg.data, cfg.clients, cfg.seed, ids.tolist(), device=device, held=held)
    # a validation split: data.validation's, or the algorithm's own (CFL's best-of-lineage choice); 0: data unchanged
    share, key = validation_split(cfg, algo)
    data = carve_validation(data, share, cfg.seed, key)
    if bad is not None and cfg.attack.kind == "label_flip":   # they train on flipped labels, every round
        data = dataclasses.replace(data, train_y=flip_labels(data.train_y, bad[ids], data.num_classes))
    return data


def rank_data(cfg: Config, algo, client_ids: torch.Tensor, device, bad: torch.Tensor | None):
    """``(data, drift)``: this rank's clients' data, and with drift (``data.drift_round``) every epoch's moved
    rows, built here so that a round only swaps them in (:class:`fedclust.data.drift.Drift`); None without."""
    data = client_data(cfg, algo, client_ids, device, bad)
    events = drift_rounds(cfg.data)
    if not events or data.clusters is None:
        return data, None
    truth = truths(cfg.seed, data.clusters, cfg.data.num_clusters, cfg.data.drift_fraction, events)
    return data, Drift(events, truth, data, lambda ids, held: client_data(cfg, algo, ids, device, bad, held))


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
    bad = attackers(cfg.seed, n, cfg.attack.fraction)   # the same on every rank
    data, drift = rank_data(cfg, algo, client_ids, device, bad)
    spec, layout, w0 = model.spec, model.layout, model.w0.clone()
    # train_counts is None only where every client, on every rank, holds the full width: the same choice everywhere
    arch, why = model.net(cfg.engine, device.type, unequal=data.train_counts is not None)
    if why and rank == 0:
        print(f"fedclust: {why}", flush=True)

    comm = Collectives(rank, world, cfg.collective_timeout)
    network = Network(cfg.network, n, cfg.seed)   # each round's graph and who is online, the same on every rank
    # None: the data gives no truth; with drift the very tensor the drift replaces in place
    clusters = None if data.clusters is None else data.clusters if drift else data.clusters.to(device)
    ctx = Context(n=n, client_ids=client_ids.to(device), clusters=clusters, seed=cfg.seed,
                  stage1_rounds=cfg.stage1_rounds, w0=w0.to(device), device=device, all_reduce=comm.all_reduce,
                  **engine_losses(layout, arch, data),
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
    shard = Shard(fabric=fabric, rank=rank, world=world, device=device, n=n, client_ids=client_ids, comm=comm)
    return Setup(cfg=cfg, shard=shard, data=data, arch=arch, spec=spec, inputs=checkpoint.input_files(cfg),
                 layout=layout, ctx=ctx, algo=algo, settings=settings, stage1_end=min(cfg.stage1_rounds, cfg.rounds),
                 network=network, attackers=bad, columns=columns, drift=drift,
                 join=late_joiners(cfg, network, model, client_ids, device))


def late_joiners(cfg: Config, network: Network, model, client_ids: torch.Tensor, device) -> Join | None:
    """This rank's late joiners (``network.join_round``) and what each starts from at its join; None: none."""
    late = network.joiners
    if late is None:
        return None
    rows = late[client_ids].nonzero().flatten()
    initial = (model.client_rows(client_ids[rows]) if cfg.train.init == "per_client"
               else model.w0.expand(len(rows), -1)).to(device).clone()
    peers = join_peers(cfg.seed, cfg.network.join_round, late) if cfg.network.join_init == "peer" else None
    return Join(round=cfg.network.join_round, late=late, rows=rows, initial=initial, peers=peers)


# ----------------------------------------------------------------------------
# The run

# Called on every rank after each round's metrics and checkpoint: (setup, state, run directory). Plug-ins add
# theirs with add_round_end_hook (e.g. a test that stops the job at a known round).
_ROUND_END_HOOKS: list[Callable[[Setup, LoopState, str], None]] = []


def fresh_state(setup: Setup) -> LoopState:
    """The state before round 1 of a run on this rank (the bench tools start from it too)."""
    rows = None
    if setup.cfg.train.init == "per_client":   # each client its own default init: C model builds, once
        rows = run_model(setup.cfg).client_rows(setup.shard.client_ids)
    state = LoopState.fresh(setup.shard, setup.ctx, setup.algo, setup.data.clusters, rows)
    if setup.drift is not None and setup.rank == 0:   # the true clusters of every epoch, for neighbors.npz
        state.saved.update(setup.drift.arrays())
    return state


def add_round_end_hook(hook: Callable[[Setup, LoopState, str], None]) -> Callable[[], None]:
    """Call ``hook(setup, state, run_dir)`` on every rank at the end of every round of every later run, until the
    function returned is called."""
    _ROUND_END_HOOKS.append(hook)
    return lambda: _ROUND_END_HOOKS.remove(hook)


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


def _loop(cfg: Config, prepared: Prepared, stop: StopRequest) -> dict:
    run_dir = prepared.run_dir
    # rank 0 marks the directory as a run's (its first write there), then locks it: one run writes it at a time
    with RunLock.for_rank(run_dir, launch_rank()):
        fabric = make_fabric(cfg.device, cfg.collective_timeout, cfg.startup_timeout,   # one process per device
                             identity=run_identity(cfg, run_dir))                # only this run's ranks join
        setup = build(cfg, fabric)                                 # this rank's clients, their data, the algorithm
        resumed = prepared.resume_from[0] if prepared.resume_from is not None else None
        state = (LoopState.from_state_dict(setup.shard, setup.ctx, setup.algo, prepared.resume_from[1])
                 if prepared.resume_from is not None else fresh_state(setup))
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
        try:
            out.tracker.finish(EXIT_REQUEUE, preempting=True)
        except Exception as exc:   # W&B's own service may have had the signal too: the requeue must still happen
            first = str(exc).splitlines()[0] if str(exc) else ""
            print(f"fedclust: W&B did not close cleanly on the stop ({type(exc).__name__}: {first}); the checkpoint "
                  "is written and the job is requeued all the same", file=sys.stderr, flush=True)
    job, requeued = requeue() if setup.rank == 0 else (slurm_job(), None)   # rank 0 requeues the job
    return Stopped(t, stop.signal, path, job, requeued if job else None)
