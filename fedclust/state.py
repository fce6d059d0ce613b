"""The round loop's state: what one rank carries from a round to the next,
and what a checkpoint holds of it.

:class:`LoopState` saves itself (:meth:`LoopState.state_dict`, gathered
from every rank, in global client order) and loads itself from a checkpoint
written on any number of ranks (:meth:`LoopState.from_state_dict`, after
:func:`fedclust.upgrade.checkpoint` has brought an older one to today's
form); :class:`fedclust.checkpoint.Checkpointer` decides when and where.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedclust import upgrade
from fedclust.algorithms.base import Algorithm, Context
from fedclust.algorithms.peer_counts import empty_counts
from fedclust.dist import gather_rows
from fedclust.evaluation import Traffic
from fedclust.peers import pack_bits, unpack_bits
from fedclust.rank import Shard
from fedclust.sizes import CHECKPOINT_BLOCK_BYTES


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
    # data.validation: each own client's model at its best-validation round so far and that accuracy (the
    # records' 2 decimals, so the round is the summary's best_validation_rounds); None without a split
    best_models: torch.Tensor | None = None  # [C, P]
    best_validation: torch.Tensor | None = None   # [C] float64, percent
    # the run's compute time: seconds of the processes before this one (each up to its last checkpoint), how
    # many processes have worked on it (this one included), and when this one started (time.time())
    seconds_before: float = 0.0
    starts: int = 1
    started: float = field(default_factory=time.time)

    def run_seconds(self) -> float:
        """Seconds of compute the run has had, over every process that worked on it, up to now."""
        return self.seconds_before + (time.time() - self.started)

    @classmethod
    def fresh(cls, shard: Shard, ctx: Context, algo: Algorithm, clusters: torch.Tensor | None,
              rows: torch.Tensor | None = None) -> "LoopState":
        """Round 0: every client at ``ctx.w0`` (or at its row of ``rows``, ``[C, P]``: config
        ``train.init=per_client``), the algorithm's initial state; ``clusters`` [n] the true ones (None: unknown),
        kept for neighbors.npz."""
        C = len(shard.client_ids)
        peers, counts = empty_counts(C, 0, shard.device)
        flat = ctx.w0.expand(C, -1).clone() if rows is None else rows.to(ctx.w0.device, ctx.w0.dtype).clone()
        return cls(round=0, flat=flat, algo_state=algo.init(ctx),
                   traffic=Traffic(C, shard.device), stage1_peers=peers, stage1_counts=counts,
                   saved={} if clusters is None else {"clusters": clusters.cpu().numpy()})

    def state_dict(self, shard: Shard, algo: Algorithm, run: dict) -> dict | None:
        """Everything a resume needs, rows in global client order (gathered on
        every rank; returned on rank 0, None elsewhere); ``run``: what the
        checkpoint records of the run itself (its config, input files)."""
        sd = algo.state_dict(self.algo_state)
        rows = {k: _gather(shard, v) for k, v in sd["clients"].items()}
        weights = _gather(shard, self.flat)
        traffic = {"received": _gather(shard, self.traffic.received),
                   "max_round": _gather(shard, self.traffic.max_round),
                   "server_received": self.traffic.server_received, "server_sent": self.traffic.server_sent,
                   "server_max": self.traffic.server_max}
        peers, counts = _gather_lists(shard, self.round, self.stage1_peers, self.stage1_counts)
        best_models = None if self.best_models is None else _gather(shard, self.best_models)
        best_validation = None if self.best_validation is None else _gather(shard, self.best_validation)
        if shard.rank != 0:
            return None
        return {**run, "world_size": shard.world,
                "weights": weights,
                "algorithm": {"clients": rows, "server": _cpu(sd["server"])}, "traffic": traffic,
                "stage1_peers": peers, "stage1_counts": counts, "saved": _cpu(self.saved), "history": self.history,
                "metric_lines": len(self.history), "final_lists": _cpu(self.final_lists),
                "final_assignment": _cpu(self.final_assignment), "run_id": self.run_id,
                "best_models": best_models, "best_validation": best_validation,
                "run_seconds": self.run_seconds(), "starts": self.starts}

    @classmethod
    def from_state_dict(cls, shard: Shard, ctx: Context, algo: Algorithm, payload: dict) -> "LoopState":
        """This rank's state from a checkpoint written on any number of ranks, by any fedclust version
        (:func:`fedclust.upgrade.checkpoint`)."""
        payload = upgrade.checkpoint(payload, algo)
        device = shard.device
        ids = shard.client_ids
        lo, hi = (int(ids[0]), int(ids[-1]) + 1) if len(ids) else (0, 0)

        def mine(full):
            if isinstance(full, dict):   # a bool [n, w] mask, packed eight columns a byte
                return unpack_bits(full["bits"][lo:hi], int(full["width"])).to(device)
            return None if full is None else full[lo:hi].to(device, copy=True)   # not a view of the mapped file

        algo_saved = {"clients": {k: mine(v) for k, v in payload["algorithm"]["clients"].items()},
                      "server": _to(payload["algorithm"]["server"], device)}
        traffic = Traffic(len(ids), device)
        tr = payload["traffic"]
        traffic.received, traffic.max_round = mine(tr["received"]), mine(tr["max_round"])
        traffic.server_received, traffic.server_sent, traffic.server_max = (
            tr["server_received"], tr["server_sent"], tr["server_max"])
        saved = {k: (v.clone().numpy() if isinstance(v, torch.Tensor) else v) for k, v in payload["saved"].items()}
        lists = payload["final_lists"]
        peers, counts = mine(payload["stage1_peers"]), mine(payload["stage1_counts"])
        return cls(round=int(payload["round"]), flat=mine(payload["weights"]).contiguous(),
                   algo_state=algo.load_state_dict(ctx, algo_saved), traffic=traffic,
                   stage1_peers=peers, stage1_counts=counts, saved=saved, history=list(payload["history"]),
                   final_lists=None if lists is None else lists.clone().numpy(),
                   final_assignment=_to(payload["final_assignment"], device), run_id=payload.get("run_id"),
                   best_models=mine(payload.get("best_models")), best_validation=mine(payload.get("best_validation")),
                   seconds_before=float(payload["run_seconds"]), starts=int(payload["starts"]) + 1)


def _gather(shard: Shard, rows):
    """[C, ...] rows of every rank as [n, ...] on rank 0's CPU (None elsewhere; bool travels as uint8).  Wide
    rows go in column blocks of at most :data:`CHECKPOINT_BLOCK_BYTES` gathered, each moved to rank 0's host
    as it arrives: no rank holds all n rows on its device, and only rank 0 keeps them."""
    if rows is None:
        return None
    if rows.dtype == torch.bool and rows.dim() == 2:   # masks travel and are saved eight columns a byte
        packed = _gather(shard, pack_bits(rows))
        return None if packed is None else {"bits": packed, "width": rows.shape[1]}
    x = (rows.to(torch.uint8) if rows.dtype == torch.bool else rows).contiguous()
    if shard.world == 1:   # nothing to gather (and on a CPU no copy)
        full = x.cpu()
        return full.bool() if rows.dtype == torch.bool else full
    flat = x.reshape(x.shape[0], -1)
    per_column = max(1, shard.n * flat.element_size())
    step = max(1, CHECKPOINT_BLOCK_BYTES // per_column)
    out = torch.empty((shard.n, flat.shape[1]), dtype=flat.dtype) if shard.rank == 0 else None
    for lo in range(0, flat.shape[1], step):   # column blocks, not clients
        got = gather_rows(shard.fabric, flat[:, lo:lo + step].contiguous(), shard.n)
        if out is not None:
            out[:, lo:lo + step] = got.cpu()
    if out is None:
        return None
    out = out.reshape((shard.n,) + tuple(x.shape[1:]))
    return out.bool() if rows.dtype == torch.bool else out


def _gather_lists(shard: Shard, t: int, peers: torch.Tensor, counts: torch.Tensor):
    """Every rank's count lists (``[C, w]``, w differing between ranks) as
    ``[n, W]`` on rank 0's CPU, padded to the widest (None elsewhere)."""
    width = peers.shape[1]
    if shard.world > 1:   # every rank learns the widest list, then pads to it
        widths = shard.gather(t, torch.full((len(shard.client_ids), 1), width, dtype=torch.int64,
                                            device=shard.device))
        width = int(widths.max())
    pad = width - peers.shape[1]
    peers = torch.cat([peers, peers.new_full((peers.shape[0], pad), -1)], dim=1)
    counts = torch.cat([counts, counts.new_zeros((counts.shape[0], pad))], dim=1)
    return _gather(shard, peers), _gather(shard, counts)


def _map_tensors(value, fn):
    """``value`` with ``fn`` applied to every tensor in it (nested lists, tuples, dicts); numpy arrays count as
    tensors."""
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




def stage1_arrays(shard: Shard, algo: Algorithm, state: LoopState) -> dict:
    """Who averaged with whom over stage one, and client 0's last
    similarities (client 0 is on rank 0), for the figures (rank 0; {} elsewhere)."""
    peers, counts = _gather_lists(shard, state.round, state.stage1_peers, state.stage1_counts)
    if shard.rank != 0:
        return {}
    arrays = {"stage1_peers": peers.numpy().astype(np.int32), "stage1_counts": counts.numpy()}
    sim = getattr(state.algo_state, "similarity_client0", None) if algo.stage_one_figures else None
    if sim is not None:
        arrays["similarity_client0"] = sim.float().cpu().numpy()
    return arrays
