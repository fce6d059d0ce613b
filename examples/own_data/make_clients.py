"""Write a small naturally federated data set: 20 clients (think writers or
hospitals) from 4 clusters, each cluster labelling its inputs by its own
linear rule, as an .npz that fedclust reads with data.name=npz:

    python examples/own_data/make_clients.py --out own_clients.npz
    fedclust run examples/own_data/own_clients.yaml

Arrays written: x_train, y_train, x_test, y_test (examples), client_train,
client_test (each example's client, 0..19) and cluster (each client's true
cluster, 0..3: leave it out with --no-clusters; then the neighbour
precision, recall and ARI are null and oracle refuses the file).
--unequal gives clients different numbers of examples (between half and all
of --train/--test).
"""

from __future__ import annotations

import argparse

import numpy as np


def make(clients: int, clusters: int, train: int, test: int, dim: int, classes: int, unequal: bool,
         seed: int, fresh_test: int = 0) -> dict:
    """The arrays; with ``fresh_test`` > 0 also ``fresh`` (x_test, y_test, client_test of that many new test
    examples a client, from the same rules and client means, drawn from another generator)."""
    rng = np.random.default_rng(seed)
    rules = rng.normal(size=(clusters, dim, classes))                 # each cluster's labelling
    cluster = np.arange(clients) * clusters // clients                # contiguous blocks
    parts = {"train": ([], [], []), "test": ([], [], [])}
    shifts = []
    for c in range(clients):
        shift = rng.normal(scale=0.5, size=dim)                       # each client's own input mean
        shifts.append(shift)
        for split, full in (("train", train), ("test", test)):
            m = int(rng.integers((full + 1) // 2, full + 1)) if unequal else full
            x = rng.normal(size=(m, dim)) + shift
            y = np.argmax(x @ rules[cluster[c]], axis=1)
            xs, ys, owner = parts[split]
            xs.append(x.astype(np.float32))
            ys.append(y.astype(np.int64))
            owner.append(np.full(m, c, dtype=np.int64))
    out = {"cluster": cluster.astype(np.int64), "num_classes": np.int64(classes)}
    for split, (xs, ys, owner) in parts.items():
        out[f"x_{split}"] = np.concatenate(xs)
        out[f"y_{split}"] = np.concatenate(ys)
        out[f"client_{split}"] = np.concatenate(owner)
    if fresh_test:
        new = np.random.default_rng([seed, 1])
        x = np.concatenate([new.normal(size=(fresh_test, dim)) + shifts[c] for c in range(clients)])
        owner = np.repeat(np.arange(clients), fresh_test)
        y = np.argmax(np.einsum("nd,ndk->nk", x, rules[cluster[owner]]), axis=1)
        out["fresh"] = {"x_test": x.astype(np.float32), "y_test": y.astype(np.int64), "client_test": owner}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="own_clients.npz")
    p.add_argument("--clients", type=int, default=20)
    p.add_argument("--clusters", type=int, default=4)
    p.add_argument("--train", type=int, default=100, help="training examples per client")
    p.add_argument("--test", type=int, default=50, help="test examples per client")
    p.add_argument("--dim", type=int, default=20)
    p.add_argument("--classes", type=int, default=5)
    p.add_argument("--unequal", action="store_true", help="clients hold different numbers of examples")
    p.add_argument("--no-clusters", action="store_true", help="leave out the true clusters")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fresh-test", metavar="FILE", help="also write new test examples of the same clients (as "
                   "many a client as --test) to FILE, for fedclust evaluate RUN_DIR --data FILE")
    a = p.parse_args()
    arrays = make(a.clients, a.clusters, a.train, a.test, a.dim, a.classes, a.unequal, a.seed,
                  fresh_test=a.test if a.fresh_test else 0)
    if a.fresh_test:
        np.savez(a.fresh_test, **arrays.pop("fresh"))
        print(f"wrote {a.fresh_test}: {a.test} new test examples for each of the {a.clients} clients")
    if a.no_clusters:
        del arrays["cluster"]
    np.savez(a.out, **arrays)
    print(f"wrote {a.out}: {a.clients} clients, {len(arrays['y_train'])} training and {len(arrays['y_test'])} test "
          f"examples; run: fedclust run examples/own_data/own_clients.yaml data.path={a.out}")


if __name__ == "__main__":
    main()
