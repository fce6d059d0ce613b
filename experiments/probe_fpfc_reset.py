"""Does the official LABELSWAP code's fresh zero θ every round (docs/algorithms.md, FPFC, difference (e)) make the
heads fuse where Algorithm 1's kept θ does not?  A plain per-client run of the code's round, both ways, from the
same start: one nn.Module a client, plain SGD (no momentum) with ρ(ω − ζ_i) on the head only, the pairs stepped
over the heads for every participant and every j (a pair of two participants twice), the participants' bodies
replaced by their plain mean (each its own copy: the code's shared tensor, difference (g), is not reproduced),
λ, ξ, a, ρ absolute as in the code.  Prints, per round and for each way, the groups the code's `threshold()` reads
(‖θ_ij‖ < ν), their ARI against the true clusters and the clients' own test accuracy.

Defaults are configs/fpfc_official_fmnist.yaml's setting (20 devices, 4 label-swap clusters, 50% taking part,
batch 100, lr 0.009 × 0.9 every 5 rounds) at a smaller size, to run in minutes on a CPU: the MLP, 300 training
images a device (--train), 2 local epochs (--epochs), 30 rounds (--rounds). `--set KEY=VALUE` adds config
overrides, e.g. the code's own data and CNN (about 60 s a round each way on one CPU thread):

    python experiments/probe_fpfc_reset.py [--rounds 30] [--train 300] [--epochs 2] [--seed 0] [--json OUT.json]
    python experiments/probe_fpfc_reset.py --epochs 10 --set data.name=npz data.path=FILE \
        model=experiments/fpfc_official_convnet.py:ConvNet        # FILE from experiments/fpfc_official_fmnist_data.py
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from fedclust import rng
from fedclust.algorithms import fpfc
from fedclust.algorithms.aggregation import participants
from fedclust.config import load_config
from fedclust.data import load_federated
from fedclust.metrics import adjusted_rand_index
from fedclust.models import build_model, initial_weights
from fedclust.runmodel import model_name


def step_pairs(heads, theta, V, selected, lam, a, xi, rho, reset):
    """The code's server() over the heads: θ fresh zeros first when ``reset``; each participant i, in turn, and
    every j: δ = ω_i − ω_j + V_ij/ρ, θ_ij = θ-step(δ), θ_ji = −θ_ij, V_ij += ρ(ω_i − ω_j − θ_ij), V_ji = −V_ij."""
    if reset:
        theta.zero_()
    for i in selected:
        delta = heads[i] - heads + V[i] / rho                       # [n, P_head], every j at once
        t = fpfc.theta_update(delta, lam, a, xi, rho)
        for j in range(heads.shape[0]):                             # in order: a later j sees V of an earlier i
            theta[i, j], theta[j, i] = t[j], -t[j]
            V[i, j] = V[i, j] + rho * (heads[i] - heads[j] - t[j])
            V[j, i] = -V[i, j]


def run(reset: bool, args, cfg, data, names, w0, layout) -> list[dict]:
    n, f = cfg.clients, cfg.fpfc
    models = [build_model(model_name(cfg), data.input_shape, data.num_classes) for _ in range(n)]
    for m in models:
        layout.load_into(m, w0)
    P_head = sum(p.numel() for name, p in models[0].named_parameters() if name in names)
    theta, V = torch.zeros(n, n, P_head), torch.zeros(n, n, P_head)
    x, xt = data.train_x, data.test_x   # read by index (uint8 images are normalized as read)
    N = x.shape[1]
    have = data.train_counts if data.train_counts is not None else torch.full((n,), N)   # a file's clients differ
    tests = data.test_counts if data.test_counts is not None else torch.full((n,), xt.shape[1])

    def head(m):
        return torch.cat([p.detach().reshape(-1) for name, p in m.named_parameters() if name in names])

    out = []
    for t in range(1, args.rounds + 1):
        lr = cfg.train.lr * cfg.train.lr_decay ** ((t - 1) // cfg.train.lr_decay_every)
        active = participants(cfg.seed, t, n, cfg.participation)
        selected = torch.nonzero(active).flatten().tolist()
        old = torch.stack([head(m) for m in models])
        orders = rng.batch_orders(cfg.seed, t, torch.arange(n), args.epochs, N, counts=data.train_counts)
        for i in selected:                                          # the code's client(), in turn
            zeta = (old + theta[i] - V[i] / f.rho).mean(dim=0)
            centre, off = {}, 0
            for name, p in models[i].named_parameters():
                if name in names:
                    centre[name], off = zeta[off:off + p.numel()].view_as(p), off + p.numel()
            for e in range(args.epochs):
                for s in range(0, int(have[i]), cfg.train.batch_size):
                    idx = orders[e, i, s:min(s + cfg.train.batch_size, int(have[i]))]
                    loss = F.cross_entropy(models[i](x[i, idx]), data.train_y[i, idx])
                    grads = torch.autograd.grad(loss, list(models[i].parameters()))
                    with torch.no_grad():
                        for (name, p), g in zip(models[i].named_parameters(), grads):
                            p -= lr * (g + f.rho * (p - centre[name])) if name in names else lr * g
        heads = torch.stack([head(m) for m in models])
        step_pairs(heads, theta, V, selected, f.lam, f.a, f.xi, f.rho, reset)
        with torch.no_grad():                                       # bodies: the participants' plain mean
            for k, (name, _) in enumerate(models[0].named_parameters()):
                if name not in names:
                    mean = torch.stack([list(models[i].parameters())[k] for i in selected]).mean(dim=0)
                    for i in selected:
                        list(models[i].parameters())[k].copy_(mean)
        norms = theta.norm(dim=-1)
        labels = fpfc.threshold_labels(norms, f.nu)
        with torch.no_grad():
            acc = torch.stack([(models[i](xt[i, :tests[i]]).argmax(1) == data.test_y[i, :tests[i]]).float().mean()
                               for i in range(n)])
        off_diag = norms[~torch.eye(n, dtype=torch.bool)]
        row = {"round": t, "reset": reset, "groups": int(labels.max()) + 1,
               "ari": adjusted_rand_index(data.clusters.tolist(), labels.tolist()),
               "accuracy": 100 * float(acc.mean()), "min_theta_norm": float(off_diag.min()),
               "zero_pairs": int((off_diag == 0).sum()) // 2}
        out.append(row)
        print(f"{'reset' if reset else 'keep '} round {t:3d}: groups {row['groups']:2d}, ARI {row['ari']:.3f}, "
              f"own accuracy {row['accuracy']:.2f}, smallest ||theta_ij|| {row['min_theta_norm']:.4f}, "
              f"pairs at theta = 0: {row['zero_pairs']}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--train", type=int, default=300, help="training images a device")
    p.add_argument("--epochs", type=int, default=2, help="local epochs (the code: 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="", help="write every round's numbers here")
    p.add_argument("--set", nargs="*", default=[], help="more config overrides (KEY=VALUE)")
    args = p.parse_args()
    root = Path(__file__).resolve().parents[1]
    cfg = load_config(str(root / "configs" / "fpfc_official_fmnist.yaml"),
                      [f"data.train_size={args.train}", f"seed={args.seed}", f"rounds={args.rounds}", *args.set])
    torch.manual_seed(0)
    data = load_federated(cfg.data, cfg.clients, cfg.seed, list(range(cfg.clients)), device="cpu")
    layout, w0 = initial_weights(model_name(cfg), data.input_shape, data.num_classes, cfg.seed)
    names = fpfc.head_layers(layout)[0]
    rows = run(False, args, cfg, data, names, w0, layout) + run(True, args, cfg, data, names, w0, layout)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
