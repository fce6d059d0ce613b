"""The round loop (SPEC §3, §4, §6) on Lightning Fabric.

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
from fedclust.dist import gather_rows, make_fabric, shard_bounds
from fedclust.engine.layout import ParamLayout
from fedclust.engine.train import TrainSettings, evaluate, pair_losses, train_round
from fedclust.errors import DivergenceError
from fedclust.metrics import cluster_recovery, nanmean, neighbor_precision_recall
from fedclust.mixing import gossip
from fedclust.models import build_model, default_arch
from fedclust.outputs import RunWriter, check_out, default_out


def initial_weights(arch: str, input_shape, num_classes: int, seed: int):
    """The common w0 of all clients: the model's default init under ``seed``
    (CPU generator, identical on every rank)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build_model(arch, input_shape, num_classes)
    layout = ParamLayout.from_module(module)
    return layout, layout.flatten(module).detach().clone()


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

    ctx = Context(n=n, client_ids=client_ids.to(device), clusters=data.clusters.to(device), seed=cfg.seed,
                  stage1_rounds=cfg.stage1_rounds, w0=w0, device=device, pair_loss=pair_loss)
    algo = registry.build(cfg)
    state = algo.init(ctx)
    settings = TrainSettings(lr=cfg.train.lr, momentum=cfg.train.momentum,
                             batch_size=cfg.train.batch_size, epochs=cfg.train.local_epochs)
    writer = RunWriter(cfg, out) if rank == 0 else None
    bar = _progress(cfg) if rank == 0 else None
    history: list[dict] = []
    last_lists = None
    stage1_end = min(cfg.stage1_rounds, cfg.rounds)
    stage1_counts = torch.zeros(len(client_ids), n, dtype=torch.int32, device=device)
    saved: dict[str, np.ndarray] = {"clusters": data.clusters.cpu().numpy()}
    try:
        for t in range(1, cfg.rounds + 1):
            t0 = time.time()
            settings.lr = cfg.train.lr * cfg.train.lr_decay ** (t - 1)
            before = flat.clone() if algo.gathers_before else None
            orders = rng.batch_orders(cfg.seed, t, client_ids, cfg.train.local_epochs, data.train_x.shape[1]).to(device)
            train_loss = train_round(flat, layout, arch, data.train_x, data.train_y, orders, settings)

            rows = [flat, train_loss[:, None].to(flat.dtype)]
            if before is not None:
                rows.append(before)
            gathered = gather_rows(fabric, torch.cat(rows, dim=1), n)  # the round's one all-gather
            P = flat.shape[1]
            all_after, all_loss = gathered[:, :P], gathered[:, P]
            bad = (~torch.isfinite(all_loss)).nonzero().flatten().tolist()
            if bad:
                raise DivergenceError(t, bad)
            view = RoundView(round=t, before=before if before is not None else flat, after=flat,
                             all_after=all_after, all_before=gathered[:, P + 1:] if before is not None else None)
            state, averaged = algo.select(state, ctx, view)
            flat = gossip(averaged, ctx.self_mask, all_after)
            seconds = time.time() - t0
            if t <= stage1_end:
                stage1_counts += averaged.to(torch.int32)
            if t == stage1_end:
                saved.update(_stage1_arrays(fabric, n, state, stage1_counts))

            if t % cfg.eval_every == 0 or t == cfg.rounds:
                lists = algo.neighbor_list(state, averaged)
                record = _evaluate_round(fabric, cfg, data, ctx, layout, arch, flat, lists, t, all_loss, seconds)
                last_lists = record.pop("_lists")
                history.append(record)
                if writer:
                    writer.log_round(record)
                if bar is not None:
                    bar.set_postfix(acc=f"{record['accuracy']:.2f}")
            if bar is not None:
                bar.update(1)
        summary = _summary(cfg, history, last_lists, data.clusters, time.time() - started)
        if writer:
            if last_lists is not None:
                saved["final_lists"] = last_lists
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
    return summary


def _stage1_arrays(fabric, n, state, counts) -> dict:
    """Who averaged with whom over stage one, and client 0's last
    similarities (client 0 is on rank 0), for the figures."""
    out = {"stage1_counts": gather_rows(fabric, counts, n).cpu().numpy()}
    sim = getattr(state, "last_similarity", None)
    if fabric.global_rank == 0 and sim is not None:
        out["similarity_client0"] = sim[0].float().cpu().numpy()
    return out


def _progress(cfg):
    from tqdm.auto import tqdm

    return tqdm(total=cfg.rounds, desc=cfg.algorithm.name, unit="round", disable=not cfg.progress)


def _evaluate_round(fabric, cfg, data, ctx, layout, arch, flat, lists, t, all_train_loss, seconds) -> dict:
    acc, loss = evaluate(flat, layout, arch, data.test_x, data.test_y)
    precision, recall = neighbor_precision_recall(lists, ctx.clusters, ctx.client_ids)
    local = torch.stack([acc.double(), loss.double(), precision.double(), recall.double()], dim=1)
    everyone = gather_rows(fabric, torch.cat([local.to(flat.dtype), lists.to(flat.dtype)], dim=1), cfg.clients)
    acc_all, loss_all, prec_all, rec_all = (everyone[:, i].double().cpu() for i in range(4))
    all_lists = everyone[:, 4:].bool().cpu().numpy()
    return {
        "round": t,
        "stage": 1 if t <= cfg.stage1_rounds else 2,
        "accuracy": 100.0 * float(acc_all.mean()),
        "loss": float(loss_all.mean()),
        "train_loss": float(all_train_loss.double().mean()),
        "neighbor_precision": nanmean(prec_all),
        "neighbor_recall": nanmean(rec_all),
        "round_seconds": seconds,
        "client_accuracy": [round(100.0 * float(a), 2) for a in acc_all],
        "_lists": all_lists,
    }


def _summary(cfg, history, lists, clusters, wall) -> dict:
    final = history[-1]
    best = max(history, key=lambda r: r["accuracy"])
    summary = {
        "algorithm": cfg.algorithm.name,
        "data": cfg.data.name,
        "clients": cfg.clients,
        "seed": cfg.seed,
        "final_accuracy": final["accuracy"],
        "best_accuracy": best["accuracy"],
        "best_round": best["round"],
        "final_loss": final["loss"],
        "rounds_completed": final["round"],
        "neighbor_precision": final["neighbor_precision"],
        "neighbor_recall": final["neighbor_recall"],
        "wall_seconds": wall,
        "mean_round_seconds": float(np.mean([r["round_seconds"] for r in history])),
    }
    if lists is not None and lists.any():
        summary.update(cluster_recovery(lists, clusters.cpu().numpy()))
    return summary


def _summary_text(s: dict, out: str) -> str:
    def pct(v):
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.1f}%"

    return (f"{s['algorithm']}: final accuracy {s['final_accuracy']:.2f}% (best {s['best_accuracy']:.2f}% in round "
            f"{s['best_round']}), {s['rounds_completed']} rounds in {s['wall_seconds']:.1f}s; neighbour precision "
            f"{pct(s['neighbor_precision'])}, recall {pct(s['neighbor_recall'])}; run directory {out}")
