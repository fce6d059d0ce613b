"""Checkpoints of earlier fedclust versions, brought to today's form before
a run resumes from them.  Every conversion of an older checkpoint starts
here: the steps of the whole checkpoint (the loop's own arrays) live here,
and an algorithm's state is converted by the algorithm itself
(:meth:`fedclust.algorithms.base.Algorithm.upgrade_state`), so that the
core names no algorithm.  The loop state and the algorithms read only
today's form.

Each step says what changed, works on the whole payload as saved (rows of
all n clients, in global client order; bool masks packed by
:func:`fedclust.peers.pack_bits`), and leaves a current checkpoint as
it is.  A config of an earlier version (a checkpoint's, a run directory's
config.yaml) is read by :func:`config`.  (Neighbour lists of older run
directories, bool ``[n, n]`` tables, are read by
:func:`fedclust.lists.index_lists`.)
"""

from __future__ import annotations

import torch

from fedclust.algorithms.base import Algorithm
from fedclust.algorithms.peer_counts import from_matrix
from fedclust.lists import index_lists
from fedclust.schema import RENAMED_KEYS, absent_key_values, flatten


def config(saved: dict) -> dict:
    """A config dict (as :func:`fedclust.schema.to_dict` writes it, of any
    version) flattened to today's dotted keys: moved keys under their new
    name (:data:`fedclust.schema.RENAMED_KEYS`), and every key it lacks read
    as :func:`fedclust.schema.absent_key_values` says (its default, or how
    runs behaved before it existed), so that a run of an earlier fedclust
    resumes unless a key now asks for something else."""
    flat = flatten(saved)
    for old, new in RENAMED_KEYS.items():
        if old in flat:
            flat.setdefault(new, flat.pop(old))
    return {**absent_key_values(), **flat}


def checkpoint(payload: dict, algo: Algorithm) -> dict:
    """``payload`` (a checkpoint as read) in today's form, for a run of ``algo``; a new dict, the tensors shared."""
    payload = dict(payload)
    _stage_one_lists(payload)
    _final_lists(payload)
    _run_time(payload)
    payload["algorithm"] = algorithm_state(payload["algorithm"], algo, int(payload["weights"].shape[0]))
    return payload


def algorithm_state(saved: dict, algo: Algorithm, n: int) -> dict:
    """An algorithm's saved state (``{"clients": {field: [n, ...] rows}, "server": {...}}``, every client's
    rows) in today's form for ``algo``, a run of ``n`` clients (its :meth:`Algorithm.upgrade_state`); a new
    dict, the tensors shared."""
    clients, server = dict(saved["clients"]), dict(saved["server"])
    algo.upgrade_state(clients, server, n)
    return {"clients": clients, "server": server}


def _stage_one_lists(payload: dict) -> None:
    """Before stage-one counts were lists: an ``[n, n]`` table of how often i averaged with j."""
    if "stage1_peers" not in payload:
        payload["stage1_peers"], payload["stage1_counts"] = from_matrix(payload["stage1_counts"])


def _final_lists(payload: dict) -> None:
    """Before neighbour lists were index lists: a bool ``[n, n]`` table of the last round's lists."""
    lists = payload.get("final_lists")
    if lists is not None and lists.dtype == torch.bool:
        payload["final_lists"] = torch.from_numpy(index_lists(lists.numpy()))


def _run_time(payload: dict) -> None:
    """Before the run's compute time was kept: its rounds' own times (start-up left out), one process."""
    payload.setdefault("run_seconds", sum(r.get("round_seconds") or 0.0 for r in payload["history"]))
    payload.setdefault("starts", 1)
