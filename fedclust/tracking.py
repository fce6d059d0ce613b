"""Weights & Biases mirror of a run (rank 0 only; at the edge of the round loop).

One W&B run per fedclust run, resumed, never duplicated: its id is kept in
the run directory (``wandb.json``) and in every checkpoint, and a run that
continues (after a kill, a requeue, or a sweep agent handing a preempted run
to another) continues the same W&B run with ``resume="allow"``.  The last
round logged is kept beside the id, and a continued run logs only later
rounds, so no step is logged twice (rounds between the checkpoint and the
kill are not re-sent: their values are identical, every draw being a function
of (seed, round, client)).

Settings: a config value that is set wins; one left empty is not passed, so
the usual ``WANDB_*`` variables decide (``WANDB_MODE=offline`` on a cluster
without internet, ``WANDB_PROJECT``, ``WANDB_ENTITY``, ...).
"""

from __future__ import annotations

import json
import netrc
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import numpy as np

from fedclust import schema
from fedclust.errors import ConfigError
from fedclust.lists import index_lists
from fedclust.outputs import json_safe

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

STATE_FILE = "wandb.json"
DEFAULT_PROJECT = "fedclust"


def init_kwargs(cfg, run_dir: Path, run_id: str | None, env=os.environ) -> dict:
    """The arguments of ``wandb.init``: set config values, the run id to
    continue, and defaults only where neither the config nor the environment
    has a value."""
    w = cfg.wandb
    kwargs: dict = {"dir": str(run_dir), "resume": "allow"}
    for key in ("project", "entity", "group", "mode", "name"):
        value = getattr(w, key)
        if value:
            kwargs[key] = value
    if w.tags:
        kwargs["tags"] = list(w.tags)
    if "project" not in kwargs and not env.get("WANDB_PROJECT"):
        kwargs["project"] = DEFAULT_PROJECT
    if "name" not in kwargs and not env.get("WANDB_NAME"):
        kwargs["name"] = Path(run_dir).name
    if run_id:
        kwargs["id"] = run_id
    return kwargs


def read_state(run_dir: Path) -> dict:
    """``{"id": ..., "step": last round logged}`` of the run directory ({} if none)."""
    path = Path(run_dir) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def write_state(run_dir: Path, run_id: str, step: int) -> None:
    path = Path(run_dir) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"id": run_id, "step": step}) + "\n")
    os.replace(tmp, path)


def round_payload(record: dict, wandb) -> dict:
    """A metrics record as W&B values: the per-client accuracy as a
    histogram (and its spread), each drift event's moved clients' accuracy
    as ``drift_moved_accuracy_<event, from 1>``, other lists left out, NaN as None."""
    record = json_safe(record)
    payload = {k: v for k, v in record.items() if not isinstance(v, (list, dict)) and k != "round"}
    for e, v in enumerate(record.get("drift_moved_accuracy") or []):
        payload[f"drift_moved_accuracy_{e + 1}"] = v
    clients = record.get("client_accuracy")
    if clients:
        payload["client_accuracy"] = wandb.Histogram(clients)
        payload["client_accuracy_min"] = min(clients)
        payload["client_accuracy_max"] = max(clients)
    return payload


def _numpy(x):
    if x is None:
        return None
    return np.asarray(x.detach().cpu() if hasattr(x, "detach") else x)


def neighbour_rows(final_lists, assignment, clusters) -> list[list]:
    """One row per client: client, true cluster, assigned cluster
    (centralized methods, else None) and final neighbours (peer methods:
    the members of each ``[n, m]`` index list, as text)."""
    lists, assigned, truth = _numpy(final_lists), _numpy(assignment), _numpy(clusters)
    lists = None if lists is None else index_lists(lists)
    rows = []
    for i in range(len(truth)):
        peers = " ".join(str(j) for j in lists[i][lists[i] >= 0]) if lists is not None else ""
        rows.append([i, int(truth[i]), int(assigned[i]) if assigned is not None else None, peers])
    return rows


class Tracker:
    """The W&B run of one fedclust run (create on rank 0 only)."""

    def __init__(self, cfg, run_dir: str | Path, run_id: str | None = None):
        """``run_id``: the checkpoint's (a continued run); else the one kept in
        the run directory; else W&B's (``WANDB_RUN_ID`` from a sweep agent,
        or a new one)."""
        import wandb

        self._lib = wandb
        self.dir = Path(run_dir)
        saved = read_state(self.dir)
        run_id = run_id or saved.get("id")
        self.last_step = int(saved.get("step", 0)) if saved.get("id") == run_id else 0
        run = wandb.init(**init_kwargs(cfg, self.dir, run_id))
        run.config.update(schema.to_dict(cfg), allow_val_change=True)   # a continued run may extend `rounds`
        self.run: Run | None = run   # None once finished
        self.id = run.id
        self.rounds = int(cfg.rounds)
        write_state(self.dir, self.id, self.last_step)

    def log_round(self, record: dict) -> None:
        step = int(record["round"])
        if step <= self.last_step:   # logged before the run was stopped
            return
        # Committed at once (in W&B's file or on its server before the next round), except the last
        # round's, which log_results completes with the figures and the neighbour table.
        self._active().log(round_payload(record, self._lib), step=step, commit=step < self.rounds)
        self.last_step = step
        write_state(self.dir, self.id, step)

    def log_results(self, summary: dict, figures: list[Path], final_lists, assignment, clusters) -> None:
        """The summary, the figures as images and the final neighbour lists /
        assignment as a table, at the last round's step."""
        run = self._active()
        run.summary.update({k: v for k, v in json_safe(summary).items() if not isinstance(v, (list, dict))})
        payload: dict[str, Any] = {f"figures/{Path(p).stem}": self._lib.Image(str(p)) for p in figures}
        payload["neighbours"] = self._lib.Table(columns=["client", "true_cluster", "assigned_cluster", "neighbours"],
                                                data=neighbour_rows(final_lists, assignment, clusters))
        run.log(payload, step=max(self.last_step, int(summary.get("rounds_completed", 0))), commit=True)

    def _active(self) -> Run:
        """The W&B run, until :meth:`finish`."""
        if self.run is None:
            raise RuntimeError("the W&B run of this Tracker is finished: nothing more can be logged to it")
        return self.run

    def finish(self, exit_code: int = 0, preempting: bool = False) -> None:
        """``preempting``: the run stopped on a signal to be continued (a
        requeued job, a preempted sweep run): W&B marks it preempted, and a
        sweep hands it to another agent, which resumes it.  Called again: nothing."""
        if self.run is None:
            return
        if preempting:
            self.run.mark_preempting()
        self.run.finish(exit_code=exit_code)
        self.run = None


def check_credentials(cfg, env=os.environ) -> None:
    """Refuse W&B online tracking without credentials before anything is
    read or written (wandb.init would fail only after data setup, in a raw
    UsageError): an API key in the environment, or a .netrc entry for the
    W&B host, as ``wandb login`` writes it."""
    if not cfg.wandb.enabled:
        return
    mode = cfg.wandb.mode or env.get("WANDB_MODE") or "online"
    if mode != "online" or env.get("WANDB_DISABLED", "").lower() in ("true", "1"):
        return
    if env.get("WANDB_API_KEY") or env.get("WANDB_IDENTITY_TOKEN_FILE"):
        return
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(env["NETRC"]) if env.get("NETRC") else Path(env.get("HOME") or Path.home()) / ".netrc"
    try:
        if netrc.netrc(path).authenticators(host):
            return
    except (OSError, netrc.NetrcParseError):
        pass
    raise ConfigError("wandb.mode", mode, f"W&B online tracking needs credentials and none were found (no "
                      f"WANDB_API_KEY, no entry for {host} in {path}); run `wandb login` once, or track offline "
                      "with wandb.mode=offline (or WANDB_MODE=offline) and `wandb sync` the run later")
