"""The Fashion-MNIST clients of FPFC's official code (xueyu-ubc/FPFC, LABELSWAP/data/generate_fmnist_dataset.py),
rewritten, as a fedclust npz file of natural clients (data.name=npz data.path=FILE).

The code's rule: m devices in K clusters (contiguous blocks, device i in cluster i // (m // K)). All 60,000
training images are split over the devices by Dirichlet(1) label shares: one permutation of the images, one
Dirichlet([1]*m) draw per class, and each class's permuted images cut at the cumulative shares. The 10,000 test
images are split the same way with a new permutation and new Dirichlet draws (the generator's `random=False`
argument is unused), so a device's test labels are not distributed as its training labels. Device i of cluster p
swaps labels p and 8 - p in both splits (p = 0: 0 and 8; p = 4 would be 4 and 4, so K <= 4). Pixels are scaled to
[0, 1] (fedclust then normalises a file's inputs by their mean and standard deviation). One numpy generator seeded
once draws, in order, the training permutation, the training shares, the test permutation and the test shares, as
`np.random.seed(seed)` and the code's calls do; the code's generator has no entry point, so the seed it ran with is
unknown (its main.py defaults to 123).

Usage: python experiments/fpfc_official_fmnist_data.py OUT.npz [seed] [devices] [clusters]; then
fedclust run configs/fpfc_official_fmnist.yaml data.name=npz data.path=OUT.npz \
    model=experiments/fpfc_official_convnet.py:ConvNet
"""
from __future__ import annotations

import sys

import numpy as np

CLASSES = 10


def dirichlet_split(labels: np.ndarray, devices: int, rs: np.random.RandomState, alpha: float = 1.0):
    """The code's `_setup_dataset`: a list of `devices` index arrays into `labels`, every index in exactly one."""
    perm = rs.permutation(len(labels))
    shares = rs.dirichlet([alpha] * devices, CLASSES)  # [classes, devices]
    parts = [[] for _ in range(devices)]
    for c in range(CLASSES):
        of_class = np.flatnonzero(labels[perm] == c)
        cuts = (np.cumsum(shares[c])[:-1] * len(of_class)).astype(int)
        for i, piece in enumerate(np.split(of_class, cuts)):
            parts[i].append(piece)
    return [perm[np.concatenate(p)] for p in parts]


def swap_table(cluster: int) -> np.ndarray:
    """Labels of cluster p: p and 8 - p exchanged, the rest kept."""
    if not 0 <= cluster <= 3:
        raise ValueError(f"the code's swap p <-> 8 - p is defined for clusters 0..3, got {cluster}")
    table = np.arange(CLASSES)
    table[cluster], table[8 - cluster] = 8 - cluster, cluster
    return table


def build(x_train, y_train, x_test, y_test, devices: int = 20, clusters: int = 4, seed: int = 123) -> dict:
    """The npz arrays (natural clients) for uint8 images [N, 28, 28] or [N, 1, 28, 28] and int labels."""
    if devices % clusters:
        raise ValueError(f"devices ({devices}) must be a multiple of clusters ({clusters}), as the code assumes")
    rs = np.random.RandomState(seed)
    cluster = np.arange(devices) // (devices // clusters)
    out = {"cluster": cluster.astype(np.int64), "num_classes": np.int64(CLASSES)}
    for name, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        x = np.asarray(x).reshape(len(x), 1, 28, 28)
        y = np.asarray(y).astype(np.int64)
        parts = dirichlet_split(y, devices, rs)
        xs, ys, cs = [], [], []
        for i, idx in enumerate(parts):
            xs.append(x[idx])
            ys.append(swap_table(int(cluster[i]))[y[idx]])
            cs.append(np.full(len(idx), i, dtype=np.int64))
        out[f"x_{name}"] = np.concatenate(xs).astype(np.float32) / np.float32(255.0)
        out[f"y_{name}"] = np.concatenate(ys)
        out[f"client_{name}"] = np.concatenate(cs)
    return out


def main(argv: list[str]) -> None:
    from fedclust.data.sources import load_fmnist

    out = argv[1]
    seed = int(argv[2]) if len(argv) > 2 else 123
    devices = int(argv[3]) if len(argv) > 3 else 20
    clusters = int(argv[4]) if len(argv) > 4 else 4
    raw = load_fmnist("data", download=False)
    arrays = build(raw.train_x.numpy(), raw.train_y.numpy(), raw.test_x.numpy(), raw.test_y.numpy(),
                   devices, clusters, seed)
    np.savez(out, **arrays)
    sizes = np.bincount(arrays["client_train"], minlength=devices)
    tests = np.bincount(arrays["client_test"], minlength=devices)
    print(f"{out}: {devices} devices in {clusters} clusters from {raw.source}; training images a device min "
          f"{sizes.min()} median {int(np.median(sizes))} max {sizes.max()}; test images min {tests.min()} "
          f"max {tests.max()}")


if __name__ == "__main__":
    main(sys.argv)
