"""Tests of fedclust.data (SPEC §2, §3) against hand values and plain loops.

Most tests use a small fake Fashion-MNIST written as IDX files into a temp
folder (10 classes x 60 train / 40 test images), so they run everywhere;
the reader is checked against torchvision on the real files of the Debian
package ``dataset-fashion-mnist`` when it is installed.
"""

from __future__ import annotations

import gzip
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedclust.config import DataConfig
from fedclust.data import (
    FederatedData,
    check_data,
    cluster_of_clients,
    load_federated,
    partition,
    registry,
    sources,
    synthetic,
)
from fedclust.data import idx as idx_mod
from fedclust.errors import ConfigError, DataError

TRAIN_PER_CLASS, TEST_PER_CLASS = 60, 40
MEAN, STD = 0.2860, 0.3530


# ---------------------------------------------------------------- helpers

def write_idx(path: Path, arr: np.ndarray, code: int = 0x08, gz: bool = True) -> None:
    """Plain IDX writer (independent of the reader under test)."""
    be = arr.astype(arr.dtype.newbyteorder(">"))
    data = bytes([0, 0, code, arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + be.tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def fake_split(n_per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    labels = r.permutation(np.repeat(np.arange(10), n_per_class)).astype(np.uint8)
    images = r.integers(0, 256, size=(len(labels), 28, 28), dtype=np.uint8)
    return images, labels


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory) -> Path:
    """A folder holding four fake Fashion-MNIST IDX .gz files."""
    root = tmp_path_factory.mktemp("fake_fmnist")
    tr_x, tr_y = fake_split(TRAIN_PER_CLASS, 1)
    te_x, te_y = fake_split(TEST_PER_CLASS, 2)
    write_idx(root / "train-images-idx3-ubyte", tr_x)
    write_idx(root / "train-labels-idx1-ubyte", tr_y)
    write_idx(root / "t10k-images-idx3-ubyte", te_x)
    write_idx(root / "t10k-labels-idx1-ubyte", te_y)
    return root


def cfg_of(root, **kw) -> DataConfig:
    base = dict(name="fmnist", root=str(root), download=False, train_size=20, test_size=20)
    base.update(kw)
    return DataConfig(**base)


def raw_of(root) -> sources.RawData:
    return sources.load_fmnist(root, False)


# ---------------------------------------------------------------- clusters and class counts

def test_cluster_blocks_by_hand():
    assert cluster_of_clients(10, 2).tolist() == [0] * 5 + [1] * 5
    assert cluster_of_clients(7, 3).tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert cluster_of_clients(9, 4).tolist() == [0, 0, 0, 1, 1, 2, 2, 3, 3]
    assert cluster_of_clients(9, 4).dtype == torch.int64


def test_class_counts_by_hand():
    c = partition.class_counts(3, 23, 10)
    assert c.tolist() == [
        [3, 3, 3, 2, 2, 2, 2, 2, 2, 2],
        [2, 2, 2, 3, 3, 3, 2, 2, 2, 2],
        [2, 2, 2, 2, 2, 2, 3, 3, 3, 2],
    ]
    assert partition.class_counts(4, 20, 10).eq(2).all()


def test_class_demand_and_max_per_client_match_brute_force():
    for n in (1, 3, 7, 20):
        for t in range(0, 45):
            assert partition.class_demand(n, t, 10).tolist() == partition.class_counts(n, t, 10).sum(0).tolist()
    have = torch.tensor([7, 5, 9, 6, 8, 5, 6, 7, 9, 10])
    for n in (1, 2, 3, 7, 13):
        best = max(t for t in range(0, 200) if (partition.class_demand(n, t, 10) <= have).all())
        assert partition.max_per_client(n, have) == best


# ---------------------------------------------------------------- split

def reference_split(labels, n, t, gen, share):
    """Plain loop version of split_indices with the same random draws."""
    K = 10
    counts = partition.class_counts(n, t, 10)
    pools = [[i for i in range(len(labels)) if int(labels[i]) == c] for c in range(K)]
    have = [len(p) for p in pools]
    width = max(have)
    rows = [[] for _ in range(n)]
    if all(int(counts[:, c].sum()) <= have[c] for c in range(K)):
        perms = [torch.randperm(h, generator=gen).tolist() for h in have]
        for c in range(K):
            start = 0
            for i in range(n):
                m = int(counts[i, c])
                rows[i] += [pools[c][p] for p in perms[c][start:start + m]]
                start += m
    else:
        assert share
        need = [int(counts[:, c].max()) for c in range(K)]
        slots = [max(have[c] // need[c], 1) for c in range(K)]
        copies = max((n + s - 1) // s for s in slots)
        keys = torch.rand(K, copies, width, generator=gen)
        for c in range(K):
            for i in range(n):
                perm = torch.argsort(keys[c, i // slots[c], : have[c]]).tolist()
                start = (i % slots[c]) * need[c]
                rows[i] += [pools[c][p] for p in perm[start:start + int(counts[i, c])]]
    order = torch.argsort(torch.rand(n, t, generator=gen), dim=1)
    return torch.tensor(rows).gather(1, order)


@pytest.mark.parametrize("n,t,share", [(12, 23, False), (7, 10, False), (20, 37, True), (13, 5, False)])
def test_split_matches_plain_loop(n, t, share):
    labels = torch.as_tensor(fake_split(30, 5)[1]).long()
    fast = partition.split_indices(labels, n, t, torch.Generator().manual_seed(4), share)
    ref = reference_split(labels, n, t, torch.Generator().manual_seed(4), share)
    assert torch.equal(fast, ref)


def test_split_balanced_and_disjoint():
    labels = torch.as_tensor(fake_split(30, 5)[1]).long()
    n, t = 12, 23
    idx = partition.split_indices(labels, n, t, torch.Generator().manual_seed(0))
    assert idx.shape == (n, t)
    assert idx.unique().numel() == n * t                     # no image on two clients, none twice
    counts = torch.stack([torch.bincount(labels[row], minlength=10) for row in idx])
    assert torch.equal(counts, partition.class_counts(n, t, 10))
    assert ((counts == 2) | (counts == 3)).all() and counts.sum(1).eq(t).all()


def test_split_too_small_and_share():
    labels = torch.arange(50) % 10                            # 5 images per class
    with pytest.raises(DataError) as e:
        partition.split_indices(labels, 4, 20, torch.Generator().manual_seed(0), what="data.train_size")
    msg = str(e.value)
    assert "need 8 images" in msg and "has 5" in msg and "data.train_size <= 12" in msg
    assert "data.share_images=true" in msg
    idx = partition.split_indices(labels, 4, 20, torch.Generator().manual_seed(0), share=True)
    for row in idx:                                           # distinct within a client, balanced
        assert row.unique().numel() == 20
        assert torch.bincount(labels[row], minlength=10).eq(2).all()
    assert idx.unique().numel() < idx.numel()                # shared across clients
    partition.split_indices(labels, 4, 12, torch.Generator().manual_seed(0))   # the limit fits
    with pytest.raises(DataError, match="distinct images of class"):
        partition.split_indices(labels, 4, 60, torch.Generator().manual_seed(0), share=True)


# ---------------------------------------------------------------- check_data

def test_check_data_sizes_without_reading():
    cfg = DataConfig(name="fmnist", root="/nonexistent", download=False)
    check_data(cfg, 100)                                      # 100 x 200 fits 6000 per class
    with pytest.raises(ConfigError) as e:
        check_data(cfg, 1000)
    assert e.value.field == "data.train_size" and e.value.value == 200
    for part in ("20000", "6000", "at most 60", "data.share_images=true"):
        assert part in str(e.value)
    check_data(DataConfig(name="fmnist", share_images=True), 1000)
    with pytest.raises(ConfigError) as e:
        check_data(DataConfig(name="cifar10", test_size=120), 100)   # 1200 > 1000 per class
    assert e.value.field == "data.test_size" and "at most 100" in str(e.value)
    with pytest.raises(ConfigError, match="class 5") as e:              # MNIST's smallest class
        check_data(DataConfig(name="mnist"), 280)
    assert "at most 193" in str(e.value)                                 # 54210 // 280


@pytest.mark.parametrize(
    "kw,n,field",
    [
        (dict(name="svhn"), 10, "data.name"),
        (dict(clusters="shuffle"), 10, "data.clusters"),
        (dict(num_clusters=0), 10, "data.num_clusters"),
        (dict(clusters="label_swap", num_clusters=0), 10, "data.num_clusters"),
        (dict(train_size=0), 10, "data.train_size"),
        (dict(test_size=-1), 10, "data.test_size"),
        (dict(num_clusters=4), 3, "clients"),
        (dict(name="synthetic", synthetic_dim=0), 10, "data.synthetic_dim"),
        (dict(name="synthetic", synthetic_alpha=-1.0), 10, "data.synthetic_alpha"),
        (dict(name="synthetic", num_clusters=0), 10, "data.num_clusters"),
    ],
)
def test_check_data_names_the_field(kw, n, field):
    with pytest.raises(ConfigError) as e:
        check_data(DataConfig(**kw), n)
    assert e.value.field == field


def test_check_data_synthetic_any_cluster_count():
    check_data(DataConfig(name="synthetic", num_clusters=3, train_size=10**6), 7)


# ---------------------------------------------------------------- load_federated (fake fmnist)

def test_load_shapes_and_determinism(fake_root):
    cfg = cfg_of(fake_root)
    a = load_federated(cfg, 20, seed=3)
    b = load_federated(cfg, 20, seed=3)
    c = load_federated(cfg, 20, seed=4)
    assert isinstance(a, FederatedData)
    assert a.train_x.shape == (20, 20, 1, 28, 28) and a.test_x.shape == (20, 20, 1, 28, 28)
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    assert a.input_shape == (1, 28, 28) and a.num_classes == 10
    assert a.clusters.tolist() == [0] * 10 + [1] * 10
    assert a.client_ids.tolist() == list(range(20))
    for f in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(a, f), getattr(b, f))
    assert not torch.equal(a.train_x, c.train_x)


@pytest.mark.parametrize("clusters,k", [("rotation", 4), ("label_swap", 2)])
def test_subset_equals_full_rows(fake_root, clusters, k):
    cfg = cfg_of(fake_root, clusters=clusters, num_clusters=k, train_size=13, test_size=7)
    full = load_federated(cfg, 20, seed=1)
    ids = [17, 3, 11]
    part = load_federated(cfg, 20, seed=1, client_ids=ids)
    assert part.client_ids.tolist() == ids and torch.equal(part.clusters, full.clusters)
    for f in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(part, f), getattr(full, f)[ids])


def test_load_balanced_disjoint_and_labels_kept(fake_root):
    cfg = cfg_of(fake_root)                                   # rotation: labels untouched
    raw = raw_of(fake_root)
    tr, te = partition.federated_indices(raw.train_y, raw.test_y, 20, 20, 20, seed=3, num_classes=10)
    d = load_federated(cfg, 20, seed=3)
    for idx, labels, y in ((tr, raw.train_y, d.train_y), (te, raw.test_y, d.test_y)):
        assert idx.unique().numel() == idx.numel()
        assert torch.equal(labels[idx], y)
        assert torch.stack([torch.bincount(r, minlength=10) for r in y]).eq(2).all()


def test_rotation_pixels_by_hand(fake_root):
    cfg = cfg_of(fake_root, num_clusters=4, train_size=10, test_size=10)
    raw = raw_of(fake_root)
    tr, te = partition.federated_indices(raw.train_y, raw.test_y, 8, 10, 10, seed=0, num_classes=10)
    d = load_federated(cfg, 8, seed=0)
    H = W = 28
    rules = {   # cluster -> source pixel (row, col) of output pixel (i, j)
        0: lambda i, j: (i, j),
        1: lambda i, j: (j, W - 1 - i),          # 90 deg counter-clockwise
        2: lambda i, j: (H - 1 - i, W - 1 - j),  # 180 deg
        3: lambda i, j: (H - 1 - j, i),          # 270 deg
    }
    for client in (0, 2, 4, 6):                               # clusters 0, 1, 2, 3
        cluster = int(d.clusters[client])
        for x, idx, images in ((d.train_x, tr, raw.train_x), (d.test_x, te, raw.test_x)):
            img = images[idx[client, 3], 0]
            for i, j in ((0, 0), (2, 5), (27, 1), (13, 20)):
                r, c = rules[cluster](i, j)
                want = (int(img[r, c]) / 255 - MEAN) / STD
                assert float(x[client, 3, 0, i, j]) == pytest.approx(want, abs=1e-5)
            assert torch.equal(x[client, 3], partition.normalize(torch.rot90(images[idx[client, 3]], cluster, (-2, -1)), (MEAN,), (STD,)))


@pytest.mark.parametrize("k,table", [
    (2, {0: {0: 1, 1: 0}, 1: {6: 7, 7: 6}}),
    (4, {0: {0: 1, 1: 0}, 1: {2: 3, 3: 2}, 2: {4: 5, 5: 4}, 3: {6: 7, 7: 6}}),
])
def test_label_swap_by_hand_table(fake_root, k, table):
    cfg = cfg_of(fake_root, clusters="label_swap", num_clusters=k)
    raw = raw_of(fake_root)
    tr, te = partition.federated_indices(raw.train_y, raw.test_y, 20, 20, 20, seed=2, num_classes=10)
    d = load_federated(cfg, 20, seed=2)
    for y, idx, labels, x, images in ((d.train_y, tr, raw.train_y, d.train_x, raw.train_x),
                                      (d.test_y, te, raw.test_y, d.test_x, raw.test_x)):
        for client in range(20):
            swap = table[int(d.clusters[client])]
            want = [swap.get(int(v), int(v)) for v in labels[idx[client]]]
            assert y[client].tolist() == want
        assert torch.equal(x, partition.normalize(images[idx], (MEAN,), (STD,)))   # images not rotated


def test_normalization_known_pixel_and_torchvision(fake_root):
    from torchvision import transforms

    raw = raw_of(fake_root)
    tr, _ = partition.federated_indices(raw.train_y, raw.test_y, 20, 20, 20, seed=3, num_classes=10)
    d = load_federated(cfg_of(fake_root), 20, seed=3)
    img = raw.train_x[tr[0, 0], 0]                             # client 0: cluster 0, no rotation
    v = int(img[5, 7])
    assert float(d.train_x[0, 0, 0, 5, 7]) == pytest.approx((v / 255 - 0.2860) / 0.3530, abs=1e-6)
    tv = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.2860,), (0.3530,))])
    assert torch.equal(d.train_x[0, 0], tv(img.numpy()[:, :, None]))
    black = partition.normalize(torch.zeros(1, 1, 1, dtype=torch.uint8), (0.2860,), (0.3530,))
    white = partition.normalize(torch.full((1, 1, 1), 255, dtype=torch.uint8), (0.2860,), (0.3530,))
    assert float(black) == pytest.approx(-0.8101983, abs=1e-6)
    assert float(white) == pytest.approx(2.0226629, abs=1e-6)
    cifar = partition.normalize(torch.full((3, 1, 1), 51, dtype=torch.uint8), registry.get("cifar10").mean, registry.get("cifar10").std)
    assert cifar.flatten().tolist() == pytest.approx([(0.2 - 0.4914) / 0.2470, (0.2 - 0.4822) / 0.2435,
                                                      (0.2 - 0.4465) / 0.2616], abs=1e-6)


@pytest.mark.parametrize("rule,mean,std", [("unit", 0.0, 1.0), ("symmetric", 0.5, 0.5)])
def test_data_normalize_unit_and_symmetric_against_torchvision(fake_root, rule, mean, std):
    """data.normalize=unit is ToTensor alone (x / 255, IFCA's code); symmetric is ToTensor + Normalize(0.5, 0.5)
    ([-1, 1], PENS's code); both on rotated clients too, and the export records the rule."""
    from torchvision import transforms

    from fedclust.data.base import PoolDataSet

    raw = raw_of(fake_root)
    tr, _ = partition.federated_indices(raw.train_y, raw.test_y, 20, 20, 20, seed=3, num_classes=10)
    d = load_federated(cfg_of(fake_root, normalize=rule), 20, seed=3)
    tv = transforms.Compose([transforms.ToTensor()] + ([transforms.Normalize((0.5,), (0.5,))] if std == 0.5 else []))
    for client in range(20):
        img = torch.rot90(raw.train_x[tr[client, 0]], 2 * int(d.clusters[client]), (-2, -1))[0]   # 0°, 180°
        assert torch.equal(d.train_x[client, 0], tv(img.numpy()[:, :, None]))
    v = int(raw.train_x[tr[0, 0], 0, 5, 7])
    assert float(d.train_x[0, 0, 0, 5, 7]) == pytest.approx((v / 255 - mean) / std, abs=1e-6)
    lo, hi = float(d.train_x.min()), float(d.train_x.max())
    assert (0 - mean) / std - 1e-6 <= lo < hi <= (1 - mean) / std + 1e-6
    ds = registry.get("fmnist")
    assert isinstance(ds, PoolDataSet)
    assert ds.input_normalization(cfg_of(fake_root, normalize=rule)) == ((mean,), (std,))
    assert ds.input_normalization(cfg_of(fake_root)) == ((0.2860,), (0.3530,))
    from fedclust.config import Config
    from fedclust.export import _normalization

    cfg = Config()
    cfg.data = cfg_of(fake_root, normalize=rule)
    assert _normalization(cfg) | {"rule": None} == {"mean": [mean], "std": [std], "scale": 255.0, "rule": None}


def test_data_normalize_refused_for_synthetic_and_unknown_rules(fake_root):
    with pytest.raises(ConfigError) as e:
        check_data(DataConfig(name="synthetic", normalize="unit"), 20)
    assert e.value.field == "data.normalize" and "leave it at its default, standard" in str(e.value)
    check_data(DataConfig(name="synthetic"), 20)


def test_too_small_raises_and_share_images_works(fake_root):
    with pytest.raises(DataError) as e:
        load_federated(cfg_of(fake_root, train_size=40), 20, seed=0)   # 80 per class > 60
    msg = str(e.value)
    assert "need 80 images" in msg and "has 60" in msg and "data.train_size <= 30" in msg
    with pytest.raises(DataError, match="data.test_size <= 20"):
        load_federated(cfg_of(fake_root, test_size=41), 20, seed=0)    # 82 per class > 40
    d = load_federated(cfg_of(fake_root, train_size=40, share_images=True), 20, seed=0)
    assert d.train_x.shape == (20, 40, 1, 28, 28)
    raw = raw_of(fake_root)
    tr, _ = partition.federated_indices(raw.train_y, raw.test_y, 20, 40, 20, seed=0, share=True, num_classes=10)
    assert all(row.unique().numel() == 40 for row in tr)
    assert tr.unique().numel() < tr.numel()


# ---------------------------------------------------------------- sources

def test_missing_dataset_names_folder(tmp_path, monkeypatch):
    with pytest.raises(DataError) as e:
        sources.load_torchvision("MNIST", tmp_path, download=False, label="mnist")
    assert "'mnist'" in str(e.value) and str(tmp_path / "MNIST" / "raw") in str(e.value)
    assert "data.download=true" in str(e.value)
    monkeypatch.setattr(sources, "debian_fmnist_folder", lambda: None)
    with pytest.raises(DataError) as e:
        load_federated(DataConfig(name="fmnist", root=str(tmp_path), download=False), 4, 0)
    msg = str(e.value)
    assert str(tmp_path) in msg and str(tmp_path / "FashionMNIST" / "raw") in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "data.root" in msg


def test_fmnist_found_in_torchvision_layout(fake_root, tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "debian_fmnist_folder", lambda: None)
    raw_dir = tmp_path / "FashionMNIST" / "raw"
    raw_dir.mkdir(parents=True)
    for f in fake_root.iterdir():                              # plain (gunzipped) files this time
        (raw_dir / f.name[:-3]).write_bytes(gzip.decompress(f.read_bytes()))
    a, b = sources.load_fmnist(tmp_path, False), raw_of(fake_root)
    assert all(torch.equal(x, y) for x, y in zip(a[:4], b[:4]))   # the four tensors
    assert (a.source, b.source) == (str(raw_dir), str(fake_root))   # the folder each was read from


def test_mnist_through_torchvision(tmp_path):
    raw_dir = tmp_path / "MNIST" / "raw"
    raw_dir.mkdir(parents=True)
    tr_x, tr_y = fake_split(3, 7)
    te_x, te_y = fake_split(2, 8)
    for stem, arr in (("train-images-idx3-ubyte", tr_x), ("train-labels-idx1-ubyte", tr_y),
                      ("t10k-images-idx3-ubyte", te_x), ("t10k-labels-idx1-ubyte", te_y)):
        write_idx(raw_dir / stem, arr, gz=False)
    raw = sources.load_torchvision("MNIST", tmp_path, False)
    assert raw.train_x.shape == (30, 1, 28, 28) and raw.train_x.dtype == torch.uint8
    assert torch.equal(raw.train_x[:, 0], torch.from_numpy(tr_x))
    assert torch.equal(raw.test_y, torch.from_numpy(te_y).long())


def test_cifar_through_torchvision_is_nchw(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as cifar

    monkeypatch.setattr(cifar, "check_integrity", lambda *a, **k: True)   # fake files have no md5
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    r = np.random.default_rng(0)
    batches = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batches[name] = (r.integers(0, 256, (4, 3072), dtype=np.uint8), r.integers(0, 10, 4).tolist())
        with open(folder / name, "wb") as f:
            pickle.dump({"data": batches[name][0], "labels": batches[name][1]}, f)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [str(i) for i in range(10)]}, f)
    raw = sources.load_torchvision("CIFAR10", tmp_path, False)
    assert raw.train_x.shape == (20, 3, 32, 32)
    want = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)]).reshape(-1, 3, 32, 32)
    assert torch.equal(raw.train_x, torch.from_numpy(want))  # channel c, row h, col w as in the pickle
    assert raw.test_y.tolist() == batches["test_batch"][1]


# ---------------------------------------------------------------- IDX reader

def test_idx_reader_hand_file(tmp_path):
    arr = np.array([[[1, -2], [300, 70000]]], dtype=np.int32)   # int32, 3 dims
    write_idx(tmp_path / "a", arr, code=0x0C, gz=False)
    write_idx(tmp_path / "b", arr, code=0x0C, gz=True)
    for p in (tmp_path / "a", tmp_path / "b.gz"):
        t = idx_mod.read_idx(p)
        assert t.shape == (1, 2, 2) and t.dtype == torch.int32
        assert t.tolist() == [[[1, -2], [300, 70000]]]
    (tmp_path / "c").write_bytes(b"\x00\x00\x08\x01" + struct.pack(">I", 3) + b"\x05\x06\x07")
    assert idx_mod.read_idx(tmp_path / "c").tolist() == [5, 6, 7]
    (tmp_path / "bad").write_bytes(b"\x00\x00\x08\x01" + struct.pack(">I", 9) + b"\x05")
    with pytest.raises(ValueError, match="shape"):
        idx_mod.read_idx(tmp_path / "bad")
    (tmp_path / "png").write_bytes(b"\x89PNG....")
    with pytest.raises(ValueError, match="not an IDX"):
        idx_mod.read_idx(tmp_path / "png")


def test_idx_reader_equals_torchvision_on_real_fmnist(tmp_path):
    deb = sources.debian_fmnist_folder()
    if deb is None:
        pytest.skip("Debian package dataset-fashion-mnist not installed (dpkg -L finds no IDX files)")
    from torchvision import datasets

    raw_dir = tmp_path / "FashionMNIST" / "raw"
    raw_dir.mkdir(parents=True)
    for stem in sources.FMNIST_FILES.values():
        with gzip.open(deb / (stem + ".gz")) as src, open(raw_dir / stem, "wb") as dst:
            shutil.copyfileobj(src, dst)
    for train, xs, ys in ((True, "train_x", "train_y"), (False, "test_x", "test_y")):
        tv = datasets.FashionMNIST(str(tmp_path), train=train, download=False)
        x = idx_mod.read_idx(deb / (sources.FMNIST_FILES[xs] + ".gz"))
        y = idx_mod.read_idx(deb / (sources.FMNIST_FILES[ys] + ".gz"))
        assert x.dtype == tv.data.dtype and torch.equal(x, tv.data)
        assert torch.equal(y.long(), tv.targets)
    # found without configuration: an empty root falls back to the Debian folder
    raw = sources.load_fmnist(tmp_path / "empty", False)
    assert raw.train_x.shape == (60000, 1, 28, 28) and raw.test_x.shape == (10000, 1, 28, 28)
    assert torch.bincount(raw.train_y).tolist() == list(registry.get("fmnist").counts[0])


# ---------------------------------------------------------------- synthetic

def syn_cfg(**kw) -> DataConfig:
    base = dict(name="synthetic", num_clusters=2, train_size=30, test_size=20, synthetic_dim=12)
    base.update(kw)
    return DataConfig(**base)


def test_synthetic_deterministic_subset_and_shapes():
    a = load_federated(syn_cfg(), 20, seed=5)
    b = load_federated(syn_cfg(), 20, seed=5)
    c = load_federated(syn_cfg(), 20, seed=6)
    part = load_federated(syn_cfg(), 20, seed=5, client_ids=[19, 2])
    assert a.train_x.shape == (20, 30, 12) and a.test_x.shape == (20, 20, 12) and a.input_shape == (12,)
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    for f in ("train_x", "train_y", "test_x", "test_y"):
        assert torch.equal(getattr(a, f), getattr(b, f))
        assert torch.equal(getattr(part, f), getattr(a, f)[[19, 2]])
    assert not torch.equal(a.train_x, c.train_x)


def test_synthetic_labels_follow_cluster_model():
    """y = argmax(x W_k + b_k) with one (W_k, b_k) per cluster, checked by a plain loop."""
    cfg = syn_cfg(num_clusters=3)
    d = load_federated(cfg, 9, seed=1)
    W, b = synthetic.cluster_params(1, torch.arange(3), 12, 1.0)
    assert not torch.allclose(W[0], W[1]) and not torch.allclose(b[1], b[2])   # clusters differ
    for client in range(9):
        k = int(d.clusters[client])
        x = torch.cat([d.train_x[client], d.test_x[client]]).double()
        y = torch.cat([d.train_y[client], d.test_y[client]])
        for s in range(len(x)):
            logits = [sum(float(x[s, j]) * float(W[k, j, c]) for j in range(12)) + float(b[k, c])
                      for c in range(10)]
            margin = sorted(logits)[-1] - sorted(logits)[-2]
            if margin > 1e-4:                                 # float32 storage of x
                assert int(y[s]) == int(np.argmax(logits))
    # another cluster's model labels the same inputs differently
    x0 = d.train_x[0].double()
    assert not torch.equal(torch.argmax(x0 @ W[0] + b[0], 1), torch.argmax(x0 @ W[1] + b[1], 1))


def test_synthetic_distributions():
    # scipy imported where used: at module level every collecting worker pays for it
    from scipy import stats

    z = synthetic.normals(3, "test_normals", torch.arange(4), 5000).flatten().numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-3
    dim, m = 8, 20000
    ids = torch.tensor([4])
    x, _ = synthetic.synthetic_clients(3, ids, torch.tensor([0]), m, dim, 1.0, 1.0)
    v = synthetic.client_means(3, ids, dim, 1.0)[0]
    var = [float(j) ** -1.2 for j in range(1, dim + 1)]
    xd = x[0].double()
    assert torch.allclose(xd.mean(0), v, atol=0.03)
    assert xd.var(0).tolist() == pytest.approx(var, rel=0.05)
    # alpha scales the spread of the cluster means u_k (W_k ~ N(u_k, 1))
    W, _ = synthetic.cluster_params(0, torch.arange(400), 5, 3.0)
    assert float(W.mean((1, 2)).std()) == pytest.approx(3.0, rel=0.15)


def test_synthetic_shared_inputs_share_one_mean_and_keep_the_labelling():
    """data.synthetic_inputs=shared: every client's inputs around client 0's
    mean v_0 (the per-client noise unchanged); labels still argmax(x W_k + b_k)."""
    own = load_federated(syn_cfg(), 6, seed=4)
    shared = load_federated(syn_cfg(synthetic_inputs="shared"), 6, seed=4)
    v = synthetic.client_means(4, torch.arange(6), 12, 1.0)
    noise = own.train_x - v[:, None, :].float()
    assert torch.allclose(shared.train_x, v[0].float() + noise, atol=1e-5)
    assert torch.equal(shared.train_x[0], own.train_x[0])      # client 0 keeps its own mean
    W, b = synthetic.cluster_params(4, shared.clusters, 12, 1.0)
    for c in range(6):
        want = torch.argmax(shared.train_x[c].double() @ W[c] + b[c], dim=-1)
        assert torch.equal(shared.train_y[c], want)
    with pytest.raises(ConfigError, match="data.synthetic_inputs"):
        check_data(syn_cfg(synthetic_inputs="common"), 6)


def test_stream_ids_come_from_names():
    from fedclust import rng

    assert rng.stream_id("batch") == 1 and rng.stream_id("kmeans") == 101   # frozen: results reproduce
    new = rng.stream_id("my_algorithm_draws")
    assert new == rng.stream_id("my_algorithm_draws") and new >= 0x40000000   # stable, never a frozen number
    assert new != rng.stream_id("my_algorithm_draws2")
    import zlib

    assert new == (zlib.crc32(b"my_algorithm_draws") & 0x7FFFFFFF) | 0x40000000
    with pytest.raises(ValueError):
        rng.stream_id(7)
