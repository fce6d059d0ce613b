"""Drift (docs/algorithms.md, "Drift: clients that change cluster"): at each
drift round (``data.drift_round``, or the list ``data.drift_rounds``) a share
``data.drift_fraction`` of every current cluster's clients moves to another
cluster; from that round on its training and test data (and its validation
split) are its same examples under the new cluster's transform.

Every draw is keyed on (seed, drift round, client) (:mod:`fedclust.rng`,
streams ``drift_select`` and ``drift_target``) and made for all ``n``
clients on every process, so the moves do not depend on the number of
processes, and a resumed run knows them without saved state.  Within each
current cluster of ``s`` clients the ``ceil(share · s)`` of lowest
``drift_select`` key move (ties: the lower id); a moving client in cluster
``k`` of ``K`` draws ``j = floor(u · (K − 1))`` from ``drift_target`` and
goes to ``j`` if ``j < k``, else ``j + 1``: uniform over the other clusters.

The moved clients' rows of every epoch (the rounds between two events) are
built once at set-up (:class:`Drift`), so the round only swaps rows
(:meth:`Drift.enter`, a few index copies at an event, nothing otherwise)
and replaces the true clusters in place (the tensor Oracle and the metrics
read).
"""

from __future__ import annotations

import bisect
import math
from typing import Callable

import numpy as np
import torch

from fedclust import rng
from fedclust.data.base import DataSet, FederatedData, PoolDataSet, StoredInputs
from fedclust.data.partition import cluster_of_clients
from fedclust.errors import ConfigError
from fedclust.schema import DataConfig

SELECT = "drift_select"   # rng stream: who moves at an event
TARGET = "drift_target"   # rng stream: where a moving client goes
ROWS = ("train_x", "train_y", "test_x", "test_y", "val_x", "val_y")   # the data a move changes


def drift_rounds(cfg: DataConfig) -> list[int]:
    """The rounds at which clients move (``[]``: none)."""
    return [cfg.drift_round] if cfg.drift_round else list(cfg.drift_rounds)


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_drift(cfg: DataConfig, rounds: int, ds: DataSet) -> None:
    """``data.drift_round``, ``data.drift_rounds`` and ``data.drift_fraction`` in range, and drift only on data
    with a cluster transform (a pool) and at least two clusters; ConfigError naming the key, the value and the
    fix."""
    t = cfg.drift_round
    if not _whole(t) or t < 0:
        raise ConfigError("data.drift_round", t, "use 0 (no drift) or the round at which clients move, a whole "
                          f"number in [2, rounds = {rounds}]")
    if t and not 2 <= t <= rounds:
        raise ConfigError("data.drift_round", t, f"clients move at a round of the run after its first: use a "
                          f"round in [2, rounds = {rounds}], or 0 for no drift")
    ts = cfg.drift_rounds
    if not isinstance(ts, (list, tuple)) or not all(_whole(r) for r in ts):
        raise ConfigError("data.drift_rounds", ts, "give the drift rounds as a list of whole numbers, e.g. "
                          "data.drift_rounds=[100,200] ([]: none)")
    if ts and t:
        raise ConfigError("data.drift_rounds", ts, f"data.drift_round={t} gives one event already: give every "
                          "event in data.drift_rounds and set data.drift_round=0, or drop data.drift_rounds")
    if ts and (any(not 2 <= r <= rounds for r in ts) or any(b <= a for a, b in zip(ts, ts[1:]))):
        raise ConfigError("data.drift_rounds", ts, f"use increasing rounds, each in [2, rounds = {rounds}]")
    share = cfg.drift_fraction
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share <= 1:
        raise ConfigError("data.drift_fraction", share, "the share of each cluster's clients that moves at a drift "
                          "event must lie in (0, 1] (e.g. 0.25)")
    events = drift_rounds(cfg)
    if not events:
        if share != DataConfig().drift_fraction:
            raise ConfigError("data.drift_fraction", share, "has no effect on this run: no client drifts "
                              "(data.drift_round = 0); set data.drift_round, or drop the key")
        return
    key, value = ("data.drift_round", t) if t else ("data.drift_rounds", ts)
    if not isinstance(ds, PoolDataSet) or ds.kind_of(cfg) != "pool":
        raise ConfigError(key, value, f"a drifting client takes another cluster's transform of its examples, and "
                          f"data set {ds.full_name!r} has none (its clients' data and clusters are its own: "
                          "Synthetic, a file of clients, LEAF, a Hugging Face data set): use a pool (fmnist, "
                          "mnist, cifar10, torchvision:NAME, an npz pool), or drop the key")
    if cfg.num_clusters < 2:
        raise ConfigError(key, value, f"a drifting client moves to another cluster, and data.num_clusters="
                          f"{cfg.num_clusters}: set data.num_clusters >= 2, or drop the key")


def moves(seed: int, t: int, truth: torch.Tensor, num_clusters: int, share: float) -> tuple[torch.Tensor,
                                                                                                torch.Tensor]:
    """``(moved bool [n], clusters after [n] int64)`` of the event at round ``t`` from the clusters ``truth``
    before it (module docstring)."""
    truth = truth.cpu().to(torch.int64)
    ids = torch.arange(len(truth), dtype=torch.int64)
    key = rng.uniform(seed, t, SELECT, ids, 0)
    moved = torch.zeros(len(truth), dtype=torch.bool)
    for k in range(num_clusters):   # clusters, not clients
        members = (truth == k).nonzero().flatten()
        take = math.ceil(share * len(members) - 1e-9)
        moved[members[torch.argsort(key[members], stable=True)[:take]]] = True
    j = (rng.uniform(seed, t, TARGET, ids, 0) * (num_clusters - 1)).floor().to(torch.int64)
    j = j.clamp_max(num_clusters - 2)
    target = j + (j >= truth).to(torch.int64)
    return moved, torch.where(moved, target, truth)


def truths(seed: int, first: torch.Tensor, num_clusters: int, share: float, events: list[int]) -> torch.Tensor:
    """``[len(events) + 1, n]`` int64: the true clusters of each epoch (epoch e: from ``events[e - 1]`` on)."""
    out = [first.cpu().to(torch.int64)]
    for t in events:
        out.append(moves(seed, t, out[-1], num_clusters, share)[1])
    return torch.stack(out)


def clusters_at(cfg: DataConfig, num_clients: int, seed: int, t: int) -> torch.Tensor | None:
    """``[n]`` int64: the true clusters of round ``t`` of a run of this data config (None: no drift, every
    client in its own cluster throughout); what ``fedclust evaluate`` tests a checkpoint's models on."""
    events = drift_rounds(cfg)
    if not events:
        return None
    first = cluster_of_clients(num_clients, cfg.num_clusters, cfg.cluster_sizes)
    return truths(seed, first, cfg.num_clusters, cfg.drift_fraction, events)[bisect.bisect_right(events, t)]


def _rows(x):
    """The tensor whose rows a move replaces (a StoredInputs' stored images)."""
    return x.stored if isinstance(x, StoredInputs) else x


def _widen(rows: torch.Tensor, width: int) -> torch.Tensor:
    """``rows`` ``[m, w, ...]`` padded with zeros (a padding position's stored value) to the rank's width: clients
    of unequal sizes (``data.quantity_skew``, a validation split of them) are as wide as the widest held."""
    if rows.shape[1] > width:
        raise ValueError(f"drift: moved rows of width {rows.shape[1]}, wider than the rank's {width}")
    pad = rows.new_zeros((rows.shape[0], width - rows.shape[1], *rows.shape[2:]))
    return torch.cat([rows, pad], dim=1) if pad.shape[1] else rows


class Drift:
    """This rank's drift: the true clusters of every epoch, and its moved clients' rows of each epoch, built
    once; :meth:`enter` puts round t's epoch in place in ``data`` (its rows and ``data.clusters``)."""

    def __init__(self, events: list[int], truth: torch.Tensor, data: FederatedData,
                 load_rows: Callable[[torch.Tensor, torch.Tensor], FederatedData]):
        self.events, self.truths, self.data, self.epoch = list(events), truth, data, 0
        own = truth[:, data.client_ids.cpu()]                     # [E + 1, C]
        differs = own != own[:1]
        self.touched = differs.any(0).nonzero().flatten()         # local rows that ever take another transform
        self.base = {name: _rows(getattr(data, name))[self.touched.to(data.train_y.device)].clone()
                     for name in ROWS if getattr(data, name) is not None}
        self.epochs: list[tuple[torch.Tensor, dict]] = [(self.touched[:0], {})]
        for e in range(1, len(truth)):
            local = differs[e].nonzero().flatten()
            moved = load_rows(data.client_ids.cpu()[local], own[e, local])
            self.epochs.append((local, {name: _widen(_rows(getattr(moved, name)), _rows(getattr(data, name)).shape[1])
                                        for name in self.base}))

    def epoch_of(self, t: int) -> int:
        """The epoch of round ``t``: the events at rounds ``<= t``."""
        return bisect.bisect_right(self.events, t)

    def enter(self, t: int) -> None:
        """Round ``t``'s data and true clusters, in place (nothing when its epoch is the one held)."""
        e = self.epoch_of(t)
        if e == self.epoch:
            return
        device = self.data.train_y.device
        back, (local, rows) = self.touched.to(device), self.epochs[e]
        local = local.to(device)
        for name, base in self.base.items():
            target = _rows(getattr(self.data, name))
            target[back] = base
            if name in rows:   # epoch 0: every row its own
                target[local] = rows[name].to(target.device)
        if self.data.clusters is not None:
            self.data.clusters.copy_(self.truths[e].to(self.data.clusters.device))
        self.epoch = e

    def moved(self, event: int) -> torch.Tensor:
        """bool ``[n]``: the clients that moved at event ``event`` (0-based)."""
        return self.truths[event + 1] != self.truths[event]

    def arrays(self) -> dict:
        """For neighbors.npz: the drift rounds and the true clusters of each epoch."""
        return {"drift_rounds": np.asarray(self.events, dtype=np.int64),
                "drift_clusters": self.truths.numpy().astype(np.int64)}
