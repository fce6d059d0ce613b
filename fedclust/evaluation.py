"""What a run measures (docs/algorithms.md): the communication counters
carried from round to round, the record of an evaluated round (gathered
from every rank, no I/O), the run's summary and its one-line text."""

from __future__ import annotations

import math

import numpy as np
import torch

from fedclust.data import dataset
from fedclust.data.skew import partition_record
from fedclust.engine.train import evaluate
from fedclust.metrics import (
    adjusted_rand_index,
    cluster_recovery,
    drift_recovery,
    nanmean,
    neighbor_precision_recall,
)
from fedclust.models import model_record
from fedclust.peers import PeerIndex, as_indices, peer_counts
from fedclust.rank import Setup
from fedclust.schema import to_dict
from fedclust.setting import run_setting

METRICS_PER_CLIENT = 6   # accuracy, loss, precision, recall, models received, most received in a round


class Traffic:
    """Communication in whole models: per own client received so far, the
    server's totals, and the most any node received in a round."""

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


def evaluate_round(setup: Setup, state, outcome) -> tuple[dict, np.ndarray | None]:
    """The round's metrics record and every client's neighbour lists
    (``[n, m]`` int32 index lists, :func:`fedclust.lists.index_lists`;
    None for methods without lists): one gather of every rank's numbers, then
    one of the lists' members, n·m of them, never an ``[n, n]`` table."""
    cfg, ctx, result, t = setup.cfg, setup.ctx, outcome.result, state.round
    data = setup.data
    models = reported_models(setup, state)   # the held models unless the algorithm reports others
    acc, loss = evaluate(models, setup.layout, setup.arch, data.test_x, data.test_y, counts=data.test_counts)
    C = len(ctx.client_ids)
    lists = result.lists if result.lists is not None else PeerIndex.empty(C, setup.n, state.flat.device)
    precision, recall = neighbor_precision_recall(lists, ctx.clusters, ctx.client_ids)
    traffic = state.traffic
    extra = extra_accuracies(setup, state, acc)
    if cfg.data.validation > 0 and data.val_x is not None and data.val_y is not None:   # for model selection
        extra["validation"] = evaluate(models, setup.layout, setup.arch, data.val_x, data.val_y,
                                       counts=data.val_counts)[0].double()
    tests = (torch.full_like(acc, data.test_x.shape[1]) if data.test_counts is None else data.test_counts.to(acc))
    sizes = peer_counts(lists).double()
    local = torch.stack([acc.double(), loss.double(), precision.double(), recall.double(),
                         traffic.received.double(), traffic.max_round.double(), *extra.values(), tests.double(),
                         sizes], dim=1)
    # The float64 numbers bit for bit, each client's list length last: every rank learns the longest list.
    everyone = setup.shard.gather(t, local.contiguous().view(torch.uint8))
    values = everyone.contiguous().view(torch.float64)
    acc_all, loss_all, prec_all, rec_all, recv_all, maxr_all = (values[:, i].cpu() for i in range(METRICS_PER_CLIENT))
    extra_all = {k: values[:, METRICS_PER_CLIENT + i].cpu() for i, k in enumerate(extra)}
    tests_all = values[:, -2].cpu()   # each client's test examples
    all_lists = None if result.lists is None else _gather_lists(setup, t, lists, int(values[:, -1].max()))
    has_lists = all_lists is not None and all_lists.shape[1] > 0   # Local's empty lists define no neighbours
    clients_received = float(recv_all.sum())
    # Every model a client receives was sent by a peer or the server; clients send one model per upload the
    # server receives.
    record = {
        "round": t,
        "stage": 1 if t <= cfg.stage1_rounds else 2,
        "accuracy": 100.0 * float(acc_all.mean()),
        # by test examples: the share of all test examples classified right (the mean when clients are equal)
        "weighted_accuracy": 100.0 * float((acc_all * tests_all).sum() / tests_all.sum()),
        "loss": float(loss_all.mean()),
        "train_loss": float((outcome.all_loss if outcome.trained is None
                             else outcome.all_loss[outcome.trained]).double().mean()),
        "neighbor_precision": nanmean(prec_all) if has_lists else None,
        "neighbor_recall": nanmean(rec_all) if has_lists else None,
        # Theorem 1's quantity: the share of clients (with a list) whose listed neighbours are all same-cluster
        "neighbor_all_same_share": nanmean((prec_all == 1.0).double().masked_fill(prec_all.isnan(), float("nan")))
        if has_lists else None,
        "models_received_total": clients_received + traffic.server_received,
        "models_sent_total": clients_received + traffic.server_received,
        "max_models_received_per_round": max(float(maxr_all.max()), float(traffic.server_max)),
        "round_seconds": outcome.seconds,
        "client_accuracy": [round(100.0 * float(a), 2) for a in acc_all],
    }
    record.update(honest_and_worst(acc_all, setup.attackers, ctx.clusters))
    record.update(_extra_records(setup, extra_all))
    record.update(_clusters_found(ctx.clusters, all_lists if has_lists else None, result.assignment))
    record.update(drift_record(setup, acc_all))
    record.update(join_record(setup, acc_all, prec_all if has_lists else None))
    return record, all_lists


def join_record(setup: Setup, acc_all: torch.Tensor, prec_all: torch.Tensor | None) -> dict:
    """With late joiners (``network.join_round``): the mean accuracy (percent) and neighbour precision (null
    without lists) of the joiners and of the clients present from the start; nothing without."""
    late = setup.network.joiners
    if late is None:
        return {}
    out: dict[str, float | None] = {}
    for name, rows in (("joiner", late), ("incumbent", ~late)):
        out[f"{name}_accuracy"] = 100.0 * float(acc_all[rows.to(acc_all.device)].mean())
        out[f"{name}_neighbor_precision"] = None if prec_all is None else nanmean(prec_all[rows.to(prec_all.device)])
    return out


def drift_record(setup: Setup, acc_all: torch.Tensor) -> dict:
    """With drift (``data.drift_round``): the round's epoch (events so far; its true clusters are neighbors.npz's
    ``drift_clusters[epoch]``) and each event's moved clients' mean accuracy (percent); nothing without."""
    drift = setup.drift
    if drift is None:
        return {}
    moved = [drift.moved(e).to(acc_all.device) for e in range(len(drift.events))]
    return {"drift_epoch": drift.epoch,
            "drift_moved_accuracy": [100.0 * float(acc_all[m].mean()) for m in moved]}


def drift_summary(setup: Setup, history: list[dict]) -> dict:
    """summary.json's ``drift``: per event its round, the clients moved and
    :func:`fedclust.metrics.drift_recovery`; nothing without drift."""
    drift = setup.drift
    if drift is None:
        return {}
    rows = [r for r in history if r.get("drift_moved_accuracy") is not None]
    rounds = [int(r["round"]) for r in rows]
    events = []
    for e, t in enumerate(drift.events):
        series = [float(r["drift_moved_accuracy"][e]) for r in rows]
        events.append({"round": t, "moved": int(drift.moved(e).sum()), **drift_recovery(rounds, series, t)})
    return {"drift": events}


def join_summary(setup: Setup, history: list[dict]) -> dict:
    """summary.json's ``join`` (late joiners, ``network.join_round``): the round, the joiners, how they started,
    and over the evaluated rounds from the join on the mean of each record's joiner and incumbent accuracy and
    neighbour precision (null where no such round, or no list), and ``catch_up_rounds``; nothing without
    joiners."""
    late, net = setup.network.joiners, setup.cfg.network
    if late is None:
        return {}
    after = [r for r in history if r["round"] >= net.join_round]
    out: dict = {"round": net.join_round, "joiners": int(late.sum()), "init": net.join_init}
    for group in ("joiner", "incumbent"):
        for what in ("accuracy", "neighbor_precision"):
            values = [r[f"{group}_{what}"] for r in after if r.get(f"{group}_{what}") is not None]
            out[f"{group}_{what}_after"] = float(np.mean(values)) if values else None
    # SPEC-dynamics §4: rounds until the joiners' mean accuracy is within 1 point of the incumbents' (null: never)
    caught = [r["round"] for r in after if r["joiner_accuracy"] >= r["incumbent_accuracy"] - 1.0]
    out["catch_up_rounds"] = caught[0] - net.join_round if caught else None
    return {"join": out}


def _extra_records(setup: Setup, extra_all: dict) -> dict:
    """The record's validation accuracies (data.validation) and the algorithm's own (CFL: best of lineage;
    null where it gives none)."""
    out: dict = {}
    if "validation" in extra_all:
        out["validation_accuracy"] = 100.0 * float(extra_all["validation"].mean())
        out["client_validation_accuracy"] = [round(100.0 * float(a), 2) for a in extra_all["validation"]]
    for k in setup.algo.extra_accuracies:
        out[k] = 100.0 * float(extra_all[k].mean()) if k in extra_all else None
    return out


def _clusters_found(clusters, all_lists, assignment) -> dict:
    """The clusters found by the lists (peer methods) and by a method's own assignment (IFCA, CFL; DFCA besides
    its lists), scored against the truth (ARI null where it is not known)."""
    out: dict = {}
    truth = None if clusters is None else clusters.cpu().numpy()
    if all_lists is not None:
        out.update(cluster_recovery(all_lists, truth))
    if assignment is not None:
        labels = assignment.cpu().numpy()
        out.update({"num_clusters": int(len(np.unique(labels))),
                    "ari": None if truth is None else adjusted_rand_index(truth, labels)})
    return out


def _gather_lists(setup: Setup, t: int, lists, longest: int) -> np.ndarray:
    """Every client's neighbour list (``[n, longest]`` int32, -1 padding), from this rank's ``lists``; no
    gather when every list is empty (Local)."""
    idx, valid = as_indices(lists)
    mine = torch.full((len(setup.client_ids), longest), -1, dtype=torch.int32, device=lists.device)
    mine[:, :idx.shape[1]] = torch.where(valid, idx, -1).to(torch.int32)
    return setup.shard.gather(t, mine).cpu().numpy() if longest else np.full((setup.n, 0), -1, dtype=np.int32)


def keep_best_models(setup: Setup, state, record: dict) -> None:
    """With ``data.validation``: each own client's model where this round's validation accuracy (the record's,
    2 decimals) beats its best so far (the first of ties, as :func:`best_validation` picks the round)."""
    val = record.get("client_validation_accuracy")
    if val is None:
        return
    mine = torch.tensor(val, dtype=torch.float64)[setup.client_ids.cpu()].to(state.flat.device)
    if state.best_models is None:
        state.best_models, state.best_validation = state.flat.clone(), mine
        return
    better = mine > state.best_validation
    state.best_models[better] = state.flat[better]
    state.best_validation = torch.where(better, mine, state.best_validation)


def best_validation(history: list[dict]) -> dict:
    """Per-client model selection (``data.validation``): each client's test accuracy at the evaluated round of
    its highest validation accuracy (the earliest of ties), their mean ``best_validation_accuracy`` and those
    rounds ``best_validation_rounds``; nothing without a validation split."""
    rows = [r for r in history if r.get("client_validation_accuracy") is not None]
    if not rows:
        return {}
    val = np.array([r["client_validation_accuracy"] for r in rows])      # [evaluated rounds, n]
    test = np.array([r["client_accuracy"] for r in rows])
    at = val.argmax(axis=0)                                              # argmax: the first of ties
    rounds = np.array([r["round"] for r in rows])[at]
    return {"best_validation_accuracy": float(test[at, np.arange(val.shape[1])].mean()),
            "best_validation_rounds": [int(x) for x in rounds]}


def honest_and_worst(acc: torch.Tensor, attackers: torch.Tensor | None, clusters: torch.Tensor | None) -> dict:
    """``honest_accuracy``: the mean test accuracy (percent) of the clients that do not attack (every client's
    mean when none does); ``worst_cluster_accuracy``: the lowest mean of those clients' accuracies over the true
    clusters (null when the data gives no clusters)."""
    honest = None if attackers is None else ~attackers.to(acc.device)
    mean = 100.0 * float(acc.mean()) if honest is None else 100.0 * float(acc[honest].mean())
    worst = None
    if clusters is not None:
        truth = clusters.to(acc.device)
        keep = torch.ones_like(truth, dtype=torch.bool) if honest is None else honest
        means = [float(acc[(truth == k) & keep].mean()) for k in torch.unique(truth[keep]).tolist()]
        worst = 100.0 * min(means) if means else None
    return {"honest_accuracy": mean, "worst_cluster_accuracy": worst}


def _score(setup: Setup):
    """``score(models, x, y, counts)`` -> (accuracy, mean loss) ``[M]``, as the algorithms' evaluation hooks take it."""
    def score(models, x, y, counts=None):
        return evaluate(models, setup.layout, setup.arch, x, y, counts=counts)
    return score


def reported_models(setup: Setup, state) -> torch.Tensor:
    """``[C, P]`` the models an evaluated round scores (:meth:`fedclust.algorithms.base.Algorithm.report_models`):
    the held ones, ``state.flat``, unless the algorithm reports others."""
    return setup.algo.report_models(state.algo_state, setup.ctx, setup.data, state.flat, _score(setup))


def extra_accuracies(setup: Setup, state, accuracy: torch.Tensor) -> dict[str, torch.Tensor]:
    """The algorithm's own test accuracies of this rank's clients
    (:meth:`fedclust.algorithms.base.Algorithm.extra_accuracy`), float64
    ``[C]`` each, in the order of its ``extra_accuracies``."""
    if not setup.algo.extra_accuracies:
        return {}

    got = setup.algo.extra_accuracy(state.algo_state, setup.ctx, setup.data, state.flat, accuracy, _score(setup))
    unknown = sorted(set(got) - set(setup.algo.extra_accuracies))
    if unknown:
        raise ValueError(f"{type(setup.algo).__name__}.extra_accuracy gave {unknown}, not declared in extra_accuracies")
    return {k: got[k].double() for k in setup.algo.extra_accuracies if k in got}


def summarize(setup: Setup, history: list[dict], wall: float, process: float | None = None,
              starts: int = 1) -> dict:
    """summary.json: what was run, the last and best rounds, the traffic, the time: ``wall`` seconds of
    compute over every process that worked on the run (``starts`` of them), ``process`` of them this one'setup."""
    cfg = setup.cfg
    final = history[-1]
    best = max(history, key=lambda r: r["accuracy"])
    pool = dataset(cfg.data).kind_of(cfg.data) == "pool"
    d = cfg.data
    return {
        "algorithm": cfg.algorithm.name,
        "label": cfg.label or cfg.algorithm.name,
        "data": cfg.data.name,
        # data.clusters applies to a pool only (Synthetic's clusters, a file's clients, are their own)
        "data_clusters": cfg.data.clusters if pool else None,
        # and so does data.partition: written for a pool only (a run on other data, the golden runs' Synthetic,
        # records what it did before the key)
        **(partition_record(d.partition, d.alpha, d.shards_per_client, d.quantity_skew) if pool else {}),
        "data_source": setup.data.source,
        "true_clusters": cfg.data.num_clusters if setup.data.clusters is not None else None,   # None: not known
        "model": setup.spec,
        **model_record(setup.spec, setup.layout.numel, setup.arch),
        **_read(setup),
        "clients": cfg.clients,
        "rounds": cfg.rounds,
        "stage1_rounds": setup.stage1_end,
        # examples per client; None where clients hold different numbers (a file of clients)
        # (before a validation split is carved from them: the data setting)
        "train_size": None if setup.data.train_counts is not None else int(setup.data.train_x.shape[1])
        + (0 if setup.data.val_x is None else int(setup.data.val_x.shape[1])),
        "test_size": None if setup.data.test_counts is not None else int(setup.data.test_x.shape[1]),
        "seed": cfg.seed,
        "final_accuracy": final["accuracy"],
        "final_weighted_accuracy": final["weighted_accuracy"],
        **best_validation(history),
        **{f"final_{k}": final.get(k) for k in setup.algo.extra_accuracies},
        "honest_accuracy": final["honest_accuracy"],
        "worst_cluster_accuracy": final["worst_cluster_accuracy"],
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
        "process_seconds": wall if process is None else process,
        "starts": starts,
        "mean_round_seconds": float(np.mean([r["round_seconds"] for r in history])),
        **drift_summary(setup, history),
        **join_summary(setup, history),
    }


def _read(setup: Setup) -> dict:
    """What summary.json records of what the run read: a user model's fingerprint (its definition and shapes)
    and data.path's SHA-256 where there is one (hashed once at start-up, checkpoint.input_files); the run's
    setting (every key that can change its numbers, fedclust.setting: fedclust report never pools runs whose
    settings differ); each file it read, by its key, with its absolute path and SHA-256."""
    inputs = setup.inputs
    return {**({"model_fingerprint": inputs["model"]["fingerprint"]} if "fingerprint" in inputs.get("model", {})
               else {}),
            **({"data_sha256": inputs["data.path"]["sha256"]} if "data.path" in inputs else {}),
            "setting": run_setting(to_dict(setup.cfg), inputs),
            "inputs": {k: {"path": v["path"], "sha256": v["sha256"]} for k, v in inputs.items()}}


def summary_text(summary: dict, run_dir: str) -> str:
    """The run's last line of output."""
    def pct(v):
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"

    s = summary
    return (f"{s['algorithm']}: final accuracy {s['final_accuracy']:.2f}% (best {s['best_accuracy']:.2f}% in round "
            f"{s['best_round']}), {s['rounds_completed']} rounds in {s['wall_seconds']:.1f}s{_starts(s)}; "
            "neighbour precision "
            f"{pct(s['neighbor_precision'])}, recall {pct(s['neighbor_recall'])}; run directory {run_dir}")


def _starts(summary: dict) -> str:
    """How a run that took several processes spent its time (nothing for one process)."""
    starts = summary.get("starts") or 1
    if starts <= 1:
        return ""
    return f" over {starts} processes ({summary['process_seconds']:.1f}s in this one)"
