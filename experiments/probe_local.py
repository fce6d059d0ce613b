"""Local training alone, as a plain per-client PyTorch loop, under choices the PANM paper does not state.

Local (every client trains on its own 200 images, no peer) ends 1.4-2.1 points below the paper's Table 2 in
fedclust, and so does every method; this probe asks whether one unstated choice of the base setting moves
Local by that much.  Each variant changes one thing against the baseline, which is fedclust's setting
(docs/algorithms.md, "Common ground"): fedclust's own class-balanced split of Fashion-MNIST (the same images
as `fedclust run configs/fmnist_rotation2.yaml algorithm.name=local`), 180-degree rotation for cluster 1, the
MLP 784-200-200-10, SGD lr 0.08 x 0.99^(t-1), momentum 0.9 reset every round, batch 128, 3 epochs.  One
`torch.optim.SGD` per client and round, nothing batched: the reference of what each choice means.

    python experiments/probe_local.py --rounds 100 --seeds 0 --variants all > probe.json

Variants: baseline; momentum_kept (one optimiser per client for the whole run); no_momentum; nesterov;
weight_decay (5e-4); random_split (200 training images drawn uniformly, not class-balanced); test_from_train
(each client's 100 test images drawn from the training split's unused images); flip (cluster 1 mirrored
left-right instead of rotated).  Prints one JSON line per (variant, seed): mean test accuracy over clients
after the last round, and at rounds 50 and 100.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from torch import nn

from fedclust.data import dataset
from fedclust.data.partition import federated_indices
from fedclust.schema import DataConfig

VARIANTS = ("baseline", "momentum_kept", "no_momentum", "nesterov", "weight_decay", "random_split",
            "test_from_train", "flip")


def client_data(variant: str, clients: int, seed: int, root: str):
    """([n, 200, 784] train inputs, [n, 200] labels, [n, 100, 784] test inputs, [n, 100] labels), normalised as
    fedclust normalises Fashion-MNIST; clients n/2.. are cluster 1."""
    cfg = DataConfig(name="fmnist", root=root)
    ds = dataset(cfg)
    raw = ds.raw(cfg)
    gen = torch.Generator().manual_seed(seed)
    if variant == "random_split":
        order = torch.randperm(len(raw.train_y), generator=gen)
        train = order[:clients * 200].reshape(clients, 200)
        test = torch.randperm(len(raw.test_y), generator=gen)[:clients * 100].reshape(clients, 100)
        tx, ty, sx, sy = raw.train_x[train], raw.train_y[train], raw.test_x[test], raw.test_y[test]
    elif variant == "test_from_train":
        train, _ = federated_indices(raw.train_y, raw.test_y, clients, 200, 100, seed, num_classes=10)
        unused = torch.ones(len(raw.train_y), dtype=torch.bool)
        unused[train.flatten()] = False
        pool = unused.nonzero().squeeze(1)
        test = pool[torch.randperm(len(pool), generator=gen)[:clients * 100]].reshape(clients, 100)
        tx, ty, sx, sy = raw.train_x[train], raw.train_y[train], raw.train_x[test], raw.train_y[test]
    else:
        train, test = federated_indices(raw.train_y, raw.test_y, clients, 200, 100, seed, num_classes=10)
        tx, ty, sx, sy = raw.train_x[train], raw.train_y[train], raw.test_x[test], raw.test_y[test]
    tx, sx = tx.reshape(clients, 200, 1, 28, 28), sx.reshape(clients, 100, 1, 28, 28)
    second = slice(clients // 2, clients)
    if variant == "flip":
        tx[second], sx[second] = tx[second].flip(-1), sx[second].flip(-1)
    else:
        tx[second], sx[second] = torch.rot90(tx[second], 2, (-2, -1)), torch.rot90(sx[second], 2, (-2, -1))
    norm = lambda x: ds.normalize(cfg, x).reshape(x.shape[0], x.shape[1], -1)   # noqa: E731
    return norm(tx), ty, norm(sx), sy


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU(), nn.Linear(200, 10))


def run(variant: str, seed: int, rounds: int, clients: int, root: str) -> dict:
    tx, ty, sx, sy = client_data(variant, clients, seed, root)
    torch.manual_seed(seed)
    w0 = mlp().state_dict()                                # one common start, as every fedclust client has
    momentum = 0.0 if variant == "no_momentum" else 0.9
    decay = 5e-4 if variant == "weight_decay" else 0.0
    at = {}
    models = []
    for i in range(clients):
        m = mlp()
        m.load_state_dict(w0)
        models.append(m)
    kept = [torch.optim.SGD(m.parameters(), lr=0.08, momentum=momentum) for m in models] \
        if variant == "momentum_kept" else None
    gen = torch.Generator().manual_seed(seed + 1)
    for t in range(1, rounds + 1):
        lr = 0.08 * 0.99 ** (t - 1)
        for i, m in enumerate(models):
            if kept is not None:
                opt = kept[i]
                for g in opt.param_groups:
                    g["lr"] = lr
            else:
                opt = torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum, weight_decay=decay,
                                      nesterov=variant == "nesterov")
            for _ in range(3):
                order = torch.randperm(200, generator=gen)
                for b in range(0, 200, 128):
                    idx = order[b:b + 128]
                    opt.zero_grad(set_to_none=True)
                    nn.functional.cross_entropy(m(tx[i, idx]), ty[i, idx]).backward()
                    opt.step()
        if t in (50, 100) or t == rounds:
            with torch.no_grad():
                acc = torch.stack([(m(sx[i]).argmax(1) == sy[i]).double().mean() for i, m in enumerate(models)])
            at[t] = round(100 * float(acc.mean()), 2)
    return {"variant": variant, "seed": seed, "rounds": rounds, "final_accuracy": at[rounds],
            "accuracy_at": at}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--clients", type=int, default=100)
    p.add_argument("--seeds", default="0")
    p.add_argument("--variants", default="all", help=f"comma-separated of {', '.join(VARIANTS)}, or all")
    p.add_argument("--root", default="data", help="folder of the Fashion-MNIST IDX files (else Debian's)")
    a = p.parse_args(argv)
    variants = VARIANTS if a.variants == "all" else a.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v}; use {', '.join(VARIANTS)}")
        for seed in map(int, a.seeds.split(",")):
            started = time.perf_counter()
            rec = run(v, seed, a.rounds, a.clients, a.root)
            rec["seconds"] = round(time.perf_counter() - started, 1)
            print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
