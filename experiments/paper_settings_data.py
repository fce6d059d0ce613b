"""Write the two Fashion-MNIST client files of docs/results_paper_settings.md whose split fedclust's pool
splits do not make (data.name=npz reads them):

- ``el_dirichlet.npz``: Epidemic Learning's setting (de Vos et al. 2023): 96 clients, each with --el-train
  training images in Dirichlet(alpha = 0.1) label proportions (fedclust's own dirichlet split,
  ``data.partition=dirichlet``), but a test set drawn uniformly from the whole test split, as EL evaluates
  every node on the global test set (its models are not personalized); one cluster.
- ``fedspd_even_odd.npz``: FedSPD's setting (Lin et al. 2025): 25 clients whose data mixes two sources,
  even labels (source 0) and odd labels (source 1); client i's training set is 0.3 + 0.1·(i mod 5) odd, its
  test set 0.1 + 0.2·(i mod 5) odd, as the reference's sampling does (``src/sampling.py``); the images of each
  source drawn uniformly from its classes, no image on two clients.  No ``cluster`` array: a client is a mixture,
  so neighbour precision, recall and ARI are null and oracle refuses the file.

    python experiments/paper_settings_data.py --out data        # reads Fashion-MNIST from data/ or the Debian package
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from fedclust.data.skew import skewed_indices
from fedclust.data.sources import load_fmnist


def arrays(x_tr, y_tr, x_te, y_te, train_rows: list[np.ndarray], test_rows: list[np.ndarray]) -> dict:
    """The npz arrays of clients holding the given rows of each split, client 0's first."""
    tr, te = np.concatenate(train_rows), np.concatenate(test_rows)
    return {
        "x_train": x_tr[tr], "y_train": y_tr[tr], "x_test": x_te[te], "y_test": y_te[te],
        "client_train": np.repeat(np.arange(len(train_rows)), [len(r) for r in train_rows]),
        "client_test": np.repeat(np.arange(len(test_rows)), [len(r) for r in test_rows]),
        "num_classes": np.int64(10),
    }


def el_dirichlet(raw, clients: int, train: int, test: int, alpha: float, seed: int) -> dict:
    # the training split is fedclust's own dirichlet split (data.partition=dirichlet), its test split unused
    split, _ = skewed_indices(raw.train_y, raw.test_y, clients, seed, num_classes=10, partition="dirichlet",
                              train_size=train, test_size=test, alpha=alpha)
    rows = list(torch.split(split.examples, split.sizes.tolist()))
    order = np.random.default_rng(seed).permutation(len(raw.test_y))[: clients * test]
    tests = np.split(order, clients)                                       # uniform, distinct across clients
    out = arrays(raw.train_x.numpy(), raw.train_y.numpy(), raw.test_x.numpy(), raw.test_y.numpy(),
                 [r.numpy() for r in rows], tests)
    out["cluster"] = np.zeros(clients, dtype=np.int64)
    return out


def fedspd_even_odd(raw, clients: int, train: int, test: int, seed: int) -> dict:
    g = np.random.default_rng(seed)
    pools = []
    for y in (raw.train_y.numpy(), raw.test_y.numpy()):
        pools.append([list(g.permutation(np.flatnonzero(y % 2 == s))) for s in (0, 1)])
    rows: tuple[list, list] = ([], [])
    for i in range(clients):
        for split, (size, odd) in enumerate(((train, 0.3 + 0.1 * (i % 5)), (test, 0.1 + 0.2 * (i % 5)))):
            n_odd = int(round(size * odd))
            take = []
            for source, m in ((0, size - n_odd), (1, n_odd)):
                pool = pools[split][source]
                if m > len(pool):
                    raise SystemExit(f"source {source} of split {split} runs out at client {i}: lower the sizes")
                take += [pool.pop() for _ in range(m)]
            rows[split].append(np.asarray(g.permutation(take), dtype=np.int64))
    return arrays(raw.train_x.numpy(), raw.train_y.numpy(), raw.test_x.numpy(), raw.test_y.numpy(), *rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="data", help="folder the two files go to")
    p.add_argument("--root", default="data", help="Fashion-MNIST's folder (else the Debian package's)")
    p.add_argument("--el-train", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    raw = load_fmnist(a.root, download=False)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in (("el_dirichlet.npz", el_dirichlet(raw, 96, a.el_train, 100, 0.1, a.seed)),
                       ("fedspd_even_odd.npz", fedspd_even_odd(raw, 25, 2000, 400, a.seed))):
        np.savez_compressed(out / name, **data)
        sizes = np.bincount(data["client_train"])
        print(f"{out / name}: {len(sizes)} clients, {sizes.min()}-{sizes.max()} training and "
              f"{np.bincount(data['client_test']).min()} test examples each")


if __name__ == "__main__":
    main()
