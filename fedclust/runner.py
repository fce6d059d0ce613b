"""The round loop (docs/algorithms.md) on Lightning Fabric.

Each rank holds a contiguous shard of clients: their flat weights stacked in
one [C, P] buffer and their data on the device.  A round is: vectorized local
training of the shard, one all-gather of the flat weights, the algorithm's
neighbour choice for the shard's clients, and the gossip average as one
mixing-matrix product.  Every random draw is keyed on (seed, round, client).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from fedclust import rng
from fedclust.algorithms import registry
from fedclust.algorithms.base import Context, RoundView
from fedclust.data import load_federated
from fedclust.dist import gather_parts, gather_rows, make_fabric, shard_bounds
from fedclust.engine.layout import ParamLayout
from fedclust.engine.pool import pool_losses
from fedclust.engine.train import TrainSettings, evaluate, pair_losses, train_round
from fedclust.errors import DivergenceError
from fedclust.metrics import adjusted_rand_index, cluster_recovery, nanmean, neighbor_precision_recall
from fedclust.models import default_arch, initial_weights
from fedclust.outputs import RunWriter, check_out, default_out
from fedclust.progress import make_progress


def prepare(cfg) -> str:
    """Checks that must pass before any process group starts; returns the run dir."""
    out = cfg.out or default_out(cfg)
    check_out(out)
    return out


def run(cfg, out: str | None = None) -> dict:
    """Run one experiment; returns the summary (on every rank)."""
    out = out or prepare(cfg)
    started = time.time()
    fabric = make_fabric(cfg.device)
    rank, world, device = fabric.global_rank, fabric.world_size, fabric.device
    n = cfg.clients
    start, stop = shard_bounds(n, world, rank)
    client_ids = torch.arange(start, stop, dtype=torch.int64)

    data = load_federated(cfg.data, n, cfg.seed, client_ids.tolist(), device=device)
    arch = default_arch(cfg.data.name) if cfg.model == "auto" else cfg.model
    layout, w0 = initial_weights(arch, data.input_shape, data.num_classes, cfg.seed)
    w0 = w0.to(device)
    flat = w0.expand(len(client_ids), -1).clone()

    def pair_loss(models, owner):
        return pair_losses(models, layout, arch, data.train_x, data.train_y, owner)

    def pool_loss(models, peers):
        return pool_losses(models, layout, arch, data.train_x, data.train_y, peers)

    ctx = Context(n=n, client_ids=client_ids.to(device), clusters=data.clusters.to(device), seed=cfg.seed,
                  stage1_rounds=cfg.stage1_rounds, w0=w0, device=device, pair_loss=pair_loss,
                  pool_loss=pool_loss)
    algo = registry.build(cfg)
    state = algo.init(ctx)
    settings = TrainSettings(lr=cfg.train.lr, momentum=cfg.train.momentum,
                             batch_size=cfg.train.batch_size, epochs=cfg.train.local_epochs)
    writer = RunWriter(cfg, out) if rank == 0 else None
    bar = _progress(cfg) if rank == 0 else None
    history: list[dict] = []
    final_lists = final_assignment = None
    stage1_end = min(cfg.stage1_rounds, cfg.rounds)
    stage1_counts = torch.zeros(len(client_ids), n, dtype=torch.int32, device=device)
    traffic = Traffic(len(client_ids), device)
    saved: dict[str, np.ndarray] = {"clusters": data.clusters.cpu().numpy()}
    try:
        for t in range(1, cfg.rounds + 1):
            t0 = time.time()
            settings.lr = cfg.train.lr * cfg.train.lr_decay ** (t - 1)
            state, plan = algo.plan(state, ctx, t, flat)
            flat = flat if plan.start is flat else plan.start.contiguous().clone()  # trained in place
            before = flat.clone() if algo.gathers_before else None  # models before local training, if used
            orders = rng.batch_orders(cfg.seed, t, client_ids, cfg.train.local_epochs, data.train_x.shape[1]).to(device)
            train_loss = train_round(flat, layout, arch, data.train_x, data.train_y, orders, settings,
                                     anchor=plan.anchor, mu=plan.mu)

            parts = [flat, train_loss[:, None].to(flat.dtype)] + ([before] if algo.gathers_before else [])
            gathered = gather_parts(fabric, parts, n)  # the round's one all-gather
            all_after, all_loss = gathered[0], gathered[1][:, 0]
            bad = (~torch.isfinite(all_loss)).nonzero().flatten().tolist()
            if bad:
                raise DivergenceError(t, bad)
            view = RoundView(round=t, before=before, after=flat, all_after=all_after,
                             all_before=gathered[2] if algo.gathers_before else None)
            state, result = algo.aggregate(state, ctx, view)
            flat = result.models
            traffic.add(result)
            seconds = time.time() - t0
            if result.averaged is not None and t <= stage1_end:
                stage1_counts += result.averaged.to(torch.int32)
            if t == stage1_end:
                saved.update(_stage1_arrays(fabric, n, state, stage1_counts))

            if t % cfg.eval_every == 0 or t == cfg.rounds:
                record, final_lists = _evaluate_round(fabric, cfg, data, ctx, layout, arch, flat, result, traffic,
                                                      t, all_loss, seconds)
                final_assignment = result.assignment
                history.append(record)
                if writer:
                    writer.log_round(record)
                if bar is not None:
                    bar.set_postfix(acc=f"{record['accuracy']:.2f}")
            if bar is not None:
                bar.update(1)
        summary = _summary(cfg, history, final_lists, final_assignment, data.clusters, time.time() - started)
        if writer:
            if final_lists is not None:
                saved["final_lists"] = final_lists
            if final_assignment is not None:
                saved["assignment"] = final_assignment.cpu().numpy()
            np.savez_compressed(writer.dir / "neighbors.npz", **saved)
            writer.write_summary(summary)
            if cfg.figures:
                from fedclust.figures import write_run_figures

                write_run_figures(writer.dir, summary, cfg)
    finally:
        if bar is not None:
            bar.close()
        if writer:
            writer.close()
    if rank == 0:
        print(_summary_text(summary, out))
    _finish(fabric)
    return summary


def _finish(fabric) -> None:
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


def _stage1_arrays(fabric, n, state, counts) -> dict:
    """Who averaged with whom over stage one, and client 0's last
    similarities (client 0 is on rank 0), for the figures."""
    out = {"stage1_counts": gather_rows(fabric, counts, n).cpu().numpy()}
    sim = getattr(state, "last_similarity", None)
    if fabric.global_rank == 0 and sim is not None:
        out["similarity_client0"] = sim[0].float().cpu().numpy()
    return out


def _progress(cfg):
    return make_progress(cfg.rounds, cfg.algorithm.name, cfg.progress)


def _evaluate_round(fabric, cfg, data, ctx, layout, arch, flat, result, traffic, t, all_train_loss, seconds):
    """Mean test accuracy and loss, neighbour precision/recall and traffic,
    gathered from every rank; returns the record and all neighbour lists."""
    acc, loss = evaluate(flat, layout, arch, data.test_x, data.test_y)
    C = len(ctx.client_ids)
    lists = result.lists if result.lists is not None else torch.zeros(C, cfg.clients, dtype=torch.bool,
                                                                        device=flat.device)
    precision, recall = neighbor_precision_recall(lists, ctx.clusters, ctx.client_ids)
    local = torch.stack([acc.double(), loss.double(), precision.double(), recall.double(),
                         traffic.received.double(), traffic.max_round.double()], dim=1)
    everyone = gather_rows(fabric, torch.cat([local, lists.double()], dim=1), cfg.clients)
    acc_all, loss_all, prec_all, rec_all, recv_all, maxr_all = (everyone[:, i].cpu() for i in range(6))
    all_lists = everyone[:, 6:].bool().cpu().numpy() if result.lists is not None else None
    clients_received = float(recv_all.sum())
    # Every model a client receives was sent by a peer or the server; clients
    # send one model per upload the server receives.
    record = {
        "round": t,
        "stage": 1 if t <= cfg.stage1_rounds else 2,
        "accuracy": 100.0 * float(acc_all.mean()),
        "loss": float(loss_all.mean()),
        "train_loss": float(all_train_loss.double().mean()),
        "neighbor_precision": nanmean(prec_all) if all_lists is not None else None,
        "neighbor_recall": nanmean(rec_all) if all_lists is not None else None,
        "models_received_total": clients_received + traffic.server_received,
        "models_sent_total": clients_received + traffic.server_received,
        "max_models_received_per_round": max(float(maxr_all.max()), float(traffic.server_max)),
        "round_seconds": seconds,
        "client_accuracy": [round(100.0 * float(a), 2) for a in acc_all],
    }
    if all_lists is not None and all_lists.any():
        record.update(cluster_recovery(all_lists, ctx.clusters.cpu().numpy()))
    elif result.assignment is not None:
        labels = result.assignment.cpu().numpy()
        record.update({"num_clusters": int(len(np.unique(labels))),
                       "ari": adjusted_rand_index(ctx.clusters.cpu().numpy(), labels)})
    return record, all_lists


def _summary(cfg, history, lists, assignment, clusters, wall) -> dict:
    final = history[-1]
    best = max(history, key=lambda r: r["accuracy"])
    summary = {
        "algorithm": cfg.algorithm.name,
        "label": cfg.label or cfg.algorithm.name,
        "data": cfg.data.name,
        "data_clusters": cfg.data.clusters,
        "true_clusters": cfg.data.num_clusters,
        "clients": cfg.clients,
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
