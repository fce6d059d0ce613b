"""One round of a run on one rank, no I/O (docs/algorithms.md): the algorithm's plan, local training of this
rank's clients under the round's conditions (who is online, who straggles, who attacks:
:func:`fedclust.network.round_conditions`), the round's one gather (:func:`fedclust.exchange.exchange`), the
algorithm's aggregate.  Every random draw is keyed on (seed, round, client).

Cost: the training is the round's work (vectorized over the rank's clients, :mod:`fedclust.engine.train`); the
gather moves every client's flat model once (or in column blocks, config ``exchange_mb``); the rest is a few
``[C, P]`` copies at most (the models before training for an algorithm that reads them, an attacker's trained
model).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from fedclust import rng
from fedclust.algorithms.base import RoundPlan, RoundResult
from fedclust.algorithms.peer_counts import add_mask
from fedclust.attack import poison_
from fedclust.engine.train import TrainSettings, train_round
from fedclust.errors import DivergenceError
from fedclust.exchange import exchange, plan_labels
from fedclust.network import Conditions, round_conditions
from fedclust.rank import Setup
from fedclust.state import LoopState, stage1_arrays

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
    """Round t: plan -> local training -> the round's one gather (weights, training losses, the flags, and the
    models before training if the algorithm uses them) -> aggregate.  Updates ``state`` in place."""
    algo, ctx, t0 = setup.algo, setup.ctx, time.time()
    setup.shard.comm.round = t
    if setup.drift is not None:   # round t's data and true clusters (rows swapped at a drift round only)
        setup.drift.enter(t)
    if setup.join is not None and t == setup.join.round:   # the late joiners' models at their join
        setup.join.start(state.flat, setup.client_ids, setup.shard.comm.all_reduce)
    cond = round_conditions(setup.network, setup.attackers, setup.cfg.attack, t)
    if cond.nobody_online:
        return _empty_round(setup, state, t, t0, stop_flag, due_flag)
    algo_state, plan = algo.plan(state.algo_state, ctx, t, state.flat)
    flat = _start(state, plan)                       # trained in place
    before = flat.clone() if algo.gathers_before else None
    trains = cond.trains(plan.trains)                # None: everyone; else the participants online
    train_loss, kept, sending = _local_training(setup, flat, plan, t, trains, cond)
    flags = torch.full((flat.shape[0], 1), STOP_BIT * stop_flag | DUE_BIT * due_flag, dtype=flat.dtype,
                       device=flat.device)
    labels = plan_labels(algo, plan) if algo.gathers_labels else None
    view, all_loss, all_flags = exchange(setup.shard, setup.columns, t, flat, before, train_loss, flags, labels)
    del before, flat   # the view holds what the algorithm needs; it drops the models from before when done
    trained = None if trains is None else trains.to(all_loss.device)
    _refuse_divergence(t, all_loss, trained)
    algo_state, result = algo.aggregate(algo_state, ctx, view)
    if kept is not None:   # an attacker takes in nothing: it holds its honest local model (a copy: the result's
        result = dataclasses.replace(result, models=result.models.index_put((sending,), kept))   # may be state
    _carry(setup, state, t, result, algo_state)
    raised = int(all_flags.max()) if all_flags.numel() else 0
    return RoundOutcome(result=result, all_loss=all_loss, trained=trained, seconds=time.time() - t0,
                        stop=bool(raised & STOP_BIT), checkpoint_due=bool(raised & DUE_BIT))


def _start(state: LoopState, plan: RoundPlan) -> torch.Tensor:
    """The models local training starts from, trained in place: the held models, or one contiguous copy of the
    plan's start (a server's model for each client).  Neither is read again this round: the held models go
    before the copy, the start after it (deleted, not set to None: the round's result sets state.flat again)."""
    flat = state.flat
    if plan.start is not flat:
        del state.flat, flat   # no name holds the held models while the start is copied
        flat = plan.start.clone(memory_format=torch.contiguous_format)
        del plan.start
    return flat


def _local_training(setup: Setup, flat: torch.Tensor, plan: RoundPlan, t: int, trains: torch.Tensor | None,
                    cond: Conditions) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The round's local training of this rank's clients, in place on ``flat``: ``(each client's mean training
    loss (NaN: it did not train), what the model-poisoning attackers trained (they keep it and send poison
    instead), their local rows)``."""
    data, ids = setup.data, setup.client_ids
    settings = dataclasses.replace(setup.settings, lr=setup.cfg.train.round_lr(t))
    counts, subset = data.train_counts, None   # counts None: every client holds the full width
    if plan.samples is not None:   # each client's examples of the round first; it trains on those alone
        subset = training_subset(plan.samples, counts)
        counts = subset[2].clamp_min(1)   # a client with none must not train (checked below)
        _refuse_empty_clients(setup, t, trains, subset[2])
    if plan.phases is not None:   # training in phases (DePRL's head, then body): their epochs in all
        settings = dataclasses.replace(settings, epochs=sum(e for e, _ in plan.phases))
    # drawn where they are used (the hash and a stable sort give the same orders on any device)
    orders = rng.batch_orders(setup.cfg.seed, t, ids, settings.epochs, data.train_x.shape[1], counts)
    sending = cond.poisoning(trains, ids, setup.device)   # this rank's attackers training this round
    start = flat[sending].clone() if sending is not None else None
    loss = _train(setup, flat, orders, settings, plan, trains, cond, subset)
    if sending is None or start is None:
        return loss, None, None
    kept = flat[sending].clone()
    poison_(flat, start, sending, ids[sending.to(ids.device)], cond.attack, setup.cfg.seed, t)
    return loss, kept, sending


def _refuse_empty_clients(setup: Setup, t: int, trains: torch.Tensor | None, examples: torch.Tensor) -> None:
    mine = torch.ones(len(setup.client_ids), dtype=torch.bool) if trains is None else trains.cpu()[setup.client_ids]
    if bool((mine & (examples.cpu() == 0)).any()):
        raise ValueError(f"{setup.algo.name}: round {t}'s plan gives a client that trains no training example "
                         "(RoundPlan.samples); give it at least one, or leave it out of RoundPlan.trains")


def _refuse_divergence(t: int, all_loss: torch.Tensor, trained: torch.Tensor | None) -> None:
    diverged = ~torch.isfinite(all_loss) if trained is None else ~torch.isfinite(all_loss) & trained
    bad = diverged.nonzero().flatten().tolist()
    if bad:
        raise DivergenceError(t, bad)


def _carry(setup: Setup, state: LoopState, t: int, result: RoundResult, algo_state) -> None:
    """What the round leaves for the next: the models, the algorithm's state, the traffic, stage one's counts."""
    state.flat, state.algo_state, state.round = result.models, algo_state, t
    state.traffic.add(result)
    if result.averaged is not None and t <= setup.stage1_end:
        state.stage1_peers, state.stage1_counts = add_mask(state.stage1_peers, state.stage1_counts, result.averaged)
    if t == setup.stage1_end:
        state.saved.update(stage1_arrays(setup.shard, setup.algo, state))


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
           trains: torch.Tensor | None, cond: Conditions, subset=None) -> torch.Tensor:
    """The round's local training of this rank's clients, in place on ``flat``: ``trains`` (bool [n], None:
    all) train, the stragglers among them (``cond.stragglers``) for ``cond.straggler_work`` of their steps.
    Returns each client's mean training loss (NaN: it did not train)."""
    data, ids = setup.data, setup.ctx.client_ids.cpu()
    x, y, counts = data.train_x, data.train_y, data.train_counts
    if subset is not None:   # the round's examples of each client first (a copy of the data, [C, N, ...])
        order, rows, counts = subset
        x, y = x[rows.to(x.device), order.to(x.device)], y.to(order.device)[rows, order]
        counts = counts.clamp_min(1)   # a client with none does not train; its count only pads

    def train_rows(step_settings: TrainSettings, mask: torch.Tensor | None) -> torch.Tensor:
        return train_round(flat, setup.layout, setup.arch, x, y, orders, step_settings,
                           anchor=plan.anchor, mu=plan.mu, counts=counts, prox_layers=plan.prox_layers,
                           train=None if mask is None else mask.cpu()[ids], phases=plan.phases)

    slow = cond.stragglers
    if slow is None:
        return train_rows(settings, trains)
    train_all = torch.ones_like(slow) if trains is None else trains.cpu()
    steps = settings.epochs * math.ceil(data.train_x.shape[1] / settings.batch_size)
    few = dataclasses.replace(settings, max_steps=max(1, math.ceil(cond.straggler_work * steps)))
    full, short = train_rows(settings, train_all & ~slow), train_rows(few, train_all & slow)   # each its own bits
    return torch.where(slow.to(full.device)[ids.to(full.device)], short, full)


def _empty_round(setup: Setup, state: LoopState, t: int, t0: float, stop_flag: bool, due_flag: bool) -> RoundOutcome:
    """Round t with no client online: nothing trains or is exchanged, every model and the algorithm's state stay
    as they were; only the flags travel (every rank knows the round is empty: who is online is replicated)."""
    C = len(setup.client_ids)
    device = setup.ctx.device
    loss = torch.full((C, 1), float("nan"), device=device)
    flags = torch.full((C, 1), float(STOP_BIT * stop_flag | DUE_BIT * due_flag), device=device)
    all_loss, all_flags = (g[:, 0] for g in setup.shard.gather_parts(t, [loss, flags]))
    state.round = t
    if t == setup.stage1_end:
        state.saved.update(stage1_arrays(setup.shard, setup.algo, state))
    raised = int(all_flags.max()) if all_flags.numel() else 0
    return RoundOutcome(result=RoundResult(models=state.flat), all_loss=all_loss,
                        trained=torch.zeros(setup.n, dtype=torch.bool, device=all_loss.device),
                        seconds=time.time() - t0, stop=bool(raised & STOP_BIT), checkpoint_due=bool(raised & DUE_BIT),
                        skipped=True)
