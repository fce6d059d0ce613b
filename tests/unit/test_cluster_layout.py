"""Unequal clusters (``data.cluster_sizes``) and each cluster's angle (``data.rotations``): the assignment by
hand, every bad value refused naming its key, the default settings reproduced bit for bit, a non-right angle
against torchvision's ``rotate`` image by image and against the geometry of a turn, and the worst-cluster
accuracy over clusters of unequal size.  Small fake data sets written into a temp folder, so the tests run
everywhere in a few seconds; the DAC config's layout is also checked on the real Fashion-MNIST where the Debian
package is installed."""

from __future__ import annotations

import gzip
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedclust.config import load_config
from fedclust.data import cluster_of_clients, load_federated
from fedclust.data.base import StoredInputs
from fedclust.data.partition import block_sizes, federated_indices, rotate_images
from fedclust.errors import ConfigError
from fedclust.evaluation import honest_and_worst
from fedclust.schema import DataConfig

REPO = Path(__file__).resolve().parents[2]
SMALL = ["clients=8", "rounds=40", "stage1_rounds=4", "algorithm.k=2", "algorithm.l=4"]
TRAIN_PER_CLASS, TEST_PER_CLASS = 30, 20


def _idx(path: Path, arr: np.ndarray) -> None:
    data = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes()
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(data))


def _split(per_class: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    r = np.random.default_rng(seed)
    labels = r.permutation(np.repeat(np.arange(10), per_class)).astype(np.uint8)
    return r.integers(0, 256, size=(len(labels), 28, 28), dtype=np.uint8), labels


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory) -> Path:
    """Four fake Fashion-MNIST IDX files (10 classes x 30 train / 20 test images)."""
    root = tmp_path_factory.mktemp("fake_fmnist_layout")
    for prefix, (x, y) in (("train", _split(TRAIN_PER_CLASS, 1)), ("t10k", _split(TEST_PER_CLASS, 2))):
        _idx(root / f"{prefix}-images-idx3-ubyte", x)
        _idx(root / f"{prefix}-labels-idx1-ubyte", y)
    return root


def _raw(root: Path):
    from fedclust.data import sources
    return sources.load_fmnist(str(root), False)


def _cfg(root: Path, **kw) -> DataConfig:
    base = dict(name="fmnist", root=str(root), download=False, train_size=10, test_size=6)
    base.update(kw)
    return DataConfig(**base)


def _same(a, b) -> bool:
    """Bit for bit: the stored tensors (uint8 images) and their type."""
    if isinstance(a, StoredInputs) or isinstance(b, StoredInputs):
        return type(a) is type(b) and torch.equal(a.stored, b.stored) and torch.equal(a.materialize(), b.materialize())
    return torch.equal(a, b)


def _bilinear(images: torch.Tensor, angle: float) -> torch.Tensor:
    """torchvision's rotate, one image at a time (the reference)."""
    # imported here: torchvision's import (it loads torch._dynamo) costs every collecting worker about a second
    from torchvision.transforms.functional import InterpolationMode
    from torchvision.transforms.functional import rotate as tv_rotate

    return torch.stack([tv_rotate(img, angle, interpolation=InterpolationMode.BILINEAR) for img in images])


# ---------------------------------------------------------------- the assignment


def test_cluster_blocks_by_sizes_by_hand():
    assert cluster_of_clients(10, 3, [5, 3, 2]).tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2]
    assert cluster_of_clients(6, 3, [1, 4, 1]).tolist() == [0, 1, 1, 1, 1, 2]
    assert cluster_of_clients(4, 2, [1, 3]).dtype == torch.int64
    dac = cluster_of_clients(100, 4, [70, 20, 5, 5])
    assert dac[:70].eq(0).all() and dac[70:90].eq(1).all() and dac[90:95].eq(2).all() and dac[95:].eq(3).all()
    assert block_sizes(32, 2, [30, 2]) == [30, 2]                       # Facade's 30:2
    assert block_sizes(7, 3) == [3, 2, 2]                               # no sizes: near-equal, as before
    assert cluster_of_clients(7, 3, []).tolist() == cluster_of_clients(7, 3).tolist() == [0, 0, 0, 1, 1, 2, 2]
    for bad in ([5, 3], [5, 3, 1], [10, 0, 0]):                          # wrong count, wrong sum, an empty cluster
        with pytest.raises(ValueError):
            cluster_of_clients(10, 3, bad)


def test_a_pool_and_synthetic_take_the_sizes(fake_root):
    d = load_federated(_cfg(fake_root, num_clusters=2, cluster_sizes=[6, 2]), 8, 0)
    assert d.clusters.tolist() == [0] * 6 + [1] * 2
    part = load_federated(_cfg(fake_root, num_clusters=2, cluster_sizes=[6, 2]), 8, 0, client_ids=[5, 6])
    assert part.clusters.tolist() == d.clusters.tolist()
    assert torch.equal(part.train_x.stored, d.train_x.stored[[5, 6]])
    even = load_federated(_cfg(fake_root), 8, 0).train_x.stored            # clusters [0 0 0 0 1 1 1 1]
    assert torch.equal(d.train_x.stored[6:], even[6:]) and torch.equal(d.train_x.stored[:4], even[:4])
    assert torch.equal(d.train_x.stored[4:6], torch.rot90(even[4:6], 2, (-2, -1)))   # clients 4, 5: now cluster 0
    swap = load_federated(_cfg(fake_root, clusters="label_swap", num_clusters=2, cluster_sizes=[2, 6]), 8, 0)
    plain = load_federated(_cfg(fake_root, clusters="label_swap", num_clusters=2), 8, 0)
    assert swap.clusters.tolist() == [0, 0] + [1] * 6
    assert torch.equal(swap.train_y[:2], plain.train_y[:2])              # clients 0, 1: cluster 0 in both
    assert torch.equal(swap.train_y[4:], plain.train_y[4:])              # clients 4..7: cluster 1 in both
    assert not torch.equal(swap.train_y[2:4], plain.train_y[2:4])        # clients 2, 3 moved to cluster 1's swap
    syn = DataConfig(name="synthetic", num_clusters=3, cluster_sizes=[1, 5, 2], train_size=5, test_size=5)
    s = load_federated(syn, 8, 0)
    assert s.clusters.tolist() == [0, 1, 1, 1, 1, 1, 2, 2]
    near = load_federated(DataConfig(name="synthetic", num_clusters=3, train_size=5, test_size=5), 8, 0)
    assert near.clusters.tolist() == [0, 0, 0, 1, 1, 1, 2, 2]
    same = [0, 3, 4, 5, 6, 7]                                            # in the same cluster both ways
    assert torch.equal(s.train_y[same], near.train_y[same]) and torch.equal(s.train_x, near.train_x)
    assert not torch.equal(s.train_y[1:3], near.train_y[1:3])            # clients 1, 2: cluster 1's (W, b), not 0's


# ---------------------------------------------------------------- bad values, each refused naming its key


def _refused(overrides: list[str], field: str, *words: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, SMALL + overrides)
    assert e.value.field == field, str(e.value)
    assert e.value.fix
    for w in words:
        assert w in str(e.value), str(e.value)


def test_bad_cluster_sizes_are_refused():
    _refused(["data.cluster_sizes=[5,2]"], "data.cluster_sizes", "sums to 7", "clients=8", "[5, 2]")
    _refused(["data.cluster_sizes=[8,0]"], "data.cluster_sizes", "cluster 1", "at least 1")
    _refused(["data.cluster_sizes=[-1,9]"], "data.cluster_sizes", "cluster 0", "at least 1")
    _refused(["data.cluster_sizes=[4,2,2]"], "data.cluster_sizes", "3 cluster sizes", "data.num_clusters=3")
    _refused(["data.num_clusters=4", "data.cluster_sizes=[6,2]"], "data.cluster_sizes", "data.num_clusters=2")
    _refused(["data.cluster_sizes=[4.5,3.5]"], "data.cluster_sizes", "whole numbers")
    _refused(["data.cluster_sizes=six"], "data.cluster_sizes", "data.cluster_sizes=[70,20,5,5]")
    # any number of clusters: rotation by evenly spaced angles, label_swap by permutations
    load_config(None, SMALL + ["data.num_clusters=3", "data.cluster_sizes=[4,2,2]"])
    load_config(None, SMALL + ["data.clusters=label_swap", "data.num_clusters=3", "data.cluster_sizes=[4,2,2]"])
    _refused(["data.name=synthetic", "data.num_clusters=3", "data.cluster_sizes=[4,2,1]"], "data.cluster_sizes",
             "sums to 7")
    load_config(None, SMALL + ["data.cluster_sizes=[7,1]"])
    load_config(None, SMALL + ["data.clusters=label_swap", "data.num_clusters=4", "data.cluster_sizes=[5,1,1,1]"])
    load_config(None, SMALL + ["data.name=synthetic", "data.num_clusters=3", "data.cluster_sizes=[1,1,6]"])


def test_bad_rotations_are_refused():
    _refused(["data.rotations=[0,180,90]"], "data.rotations", "3 angles", "data.num_clusters=3")
    _refused(["data.num_clusters=4", "data.rotations=[0,180]"], "data.rotations", "data.num_clusters=2")
    _refused(["data.clusters=label_swap", "data.rotations=[0,180]"], "data.rotations", "data.clusters=rotation")
    _refused(["data.rotations=[0,.nan]"], "data.rotations", "finite")
    _refused(["data.rotations=[0,ten]"], "data.rotations", "data.rotations=[0,180,10,350]")
    _refused(["data.name=synthetic", "data.rotations=[0,180]"], "data.rotations", "(W, b)")
    _refused(["data.num_clusters=0", "data.rotations=[]"], "data.num_clusters")
    # with each cluster's angle, any number of clusters
    load_config(None, SMALL + ["data.num_clusters=3", "data.rotations=[0,120,240]"])
    load_config(None, SMALL + ["data.num_clusters=3", "data.rotations=[0,120,240]", "data.cluster_sizes=[4,2,2]"])
    load_config(None, SMALL + ["data.num_clusters=1", "data.rotations=[10]"])
    cfg = load_config(str(REPO / "configs/fmnist_dac_covariate.yaml"))
    assert cfg.data.cluster_sizes == [70, 20, 5, 5] and cfg.data.rotations == [0, 180, 10, 350]
    assert cfg.data.num_clusters == 4 and cfg.clients == 100 and cfg.data.clusters == "rotation"


def test_a_file_of_own_clients_refuses_sizes_and_rotations(tmp_path):
    r = np.random.default_rng(0)
    owners = np.array([0, 1, 2, 3] * 2)
    arrays = {"x_train": r.normal(size=(8, 3)).astype(np.float32), "y_train": np.array([0, 1, 2, 0, 1, 2, 0, 1]),
              "x_test": r.normal(size=(4, 3)).astype(np.float32), "y_test": np.array([0, 1, 2, 2]),
              "client_train": owners, "client_test": np.array([3, 2, 1, 0]), "cluster": np.array([0, 0, 1, 1])}
    path = tmp_path / "own.npz"
    np.savez(path, **arrays)
    base = ["clients=4", "data.name=npz", f"data.path={path}"]
    load_config(None, SMALL + base)
    _refused(base + ["data.cluster_sizes=[2,2]"], "data.cluster_sizes", "own clients")
    _refused(base + ["data.rotations=[0,180]"], "data.rotations", "own clients")


# ---------------------------------------------------------------- rotations: the defaults bit for bit


@pytest.mark.parametrize("angles", [[0, 180], [0.0, 180.0], [360, -180]])
def test_two_rotations_given_are_the_default_two_cluster_data(fake_root, angles):
    want = load_federated(_cfg(fake_root), 8, 3)
    got = load_federated(_cfg(fake_root, rotations=angles), 8, 3)
    for a, b in ((want.train_x, got.train_x), (want.test_x, got.test_x)):
        assert isinstance(b, StoredInputs) and b.stored.dtype == torch.uint8 and _same(a, b)
    assert torch.equal(want.train_y, got.train_y) and torch.equal(want.clusters, got.clusters)


def test_four_rotations_given_are_the_default_four_cluster_data(fake_root):
    want = load_federated(_cfg(fake_root, num_clusters=4), 8, 1, client_ids=[7, 0, 3, 4, 5])
    got = load_federated(_cfg(fake_root, num_clusters=4, rotations=[0, 90, 180, 270]), 8, 1,
                         client_ids=[7, 0, 3, 4, 5])
    assert _same(want.train_x, got.train_x) and _same(want.test_x, got.test_x)
    assert torch.equal(want.train_y, got.train_y) and torch.equal(want.test_y, got.test_y)
    raw = _raw(fake_root)                                         # and both are the quarter turns written plainly
    tr, _ = federated_indices(raw.train_y, raw.test_y, 8, 10, 6, 1, num_classes=10)
    for row, client in enumerate([7, 0, 3, 4, 5]):
        turns = client // 2                                       # clusters [0 0 1 1 2 2 3 3]: 0, 90, 180, 270
        assert torch.equal(got.train_x.stored[row], torch.rot90(raw.train_x[tr[client]], turns, (-2, -1)))
    turned = load_federated(_cfg(fake_root, num_clusters=4, rotations=[-270, 450, 540, -90]), 8, 1,
                            client_ids=[7, 0, 3, 4, 5])           # turns of 90, 90, 180, 270 degrees
    keep = [0, 2, 3, 4]                                           # clients 7, 3, 4, 5: clusters 3, 1, 2, 2
    assert torch.equal(turned.train_x.stored[keep], want.train_x.stored[keep])
    assert torch.equal(turned.train_x.stored[1], torch.rot90(want.train_x.stored[1], 1, (-2, -1)))   # client 0


# ---------------------------------------------------------------- rotations by other angles


def test_a_ten_degree_rotation_is_torchvision_rotate_image_by_image(fake_root):
    cfg = _cfg(fake_root, num_clusters=3, rotations=[0, 10, 350], cluster_sizes=[3, 3, 2])
    n, seed = 8, 2
    d = load_federated(cfg, n, seed)
    raw = _raw(fake_root)
    tr, te = federated_indices(raw.train_y, raw.test_y, n, 10, 6, seed, num_classes=10)
    angle_of = [0, 10, 350]
    cluster = [0, 0, 0, 1, 1, 1, 2, 2]
    for held, (images, idx) in ((d.train_x, (raw.train_x, tr)), (d.test_x, (raw.test_x, te))):
        assert isinstance(held, StoredInputs) and held.stored.dtype == torch.uint8   # kept as bytes
        for c in range(n):
            own = images[idx[c]]                                        # [m, 1, 28, 28] uint8
            a = angle_of[cluster[c]]
            want = own if a == 0 else _bilinear(own, a)
            assert torch.equal(held.stored[c], want), c
            if a:
                assert not torch.equal(want, own)
    minus = _bilinear(raw.train_x[tr[6]], -10)              # 350° is −10°
    assert (d.train_x.stored[6].int() - minus.int()).abs().max() <= 1
    assert torch.allclose(d.train_x[6], (d.train_x.stored[6].float() / 255 - 0.2860) / 0.3530, atol=1e-6)


def test_a_turn_moves_a_point_by_the_rotation_matrix_and_fills_zeros():
    side, c = 41, 20.0                       # pixel centres 0..40: the image centre is pixel 20
    rows, cols = torch.meshgrid(torch.arange(side, dtype=torch.float64), torch.arange(side, dtype=torch.float64),
                                indexing="ij")

    def blob(r, q):
        return torch.exp(-((rows - r) ** 2 + (cols - q) ** 2) / 4.0)

    img = blob(c, c + 12.0).to(torch.float32)[None, None]      # 12 pixels right of the centre
    for angle in (10.0, 350.0, -25.0, 123.0):
        out = rotate_images(img, angle)[0, 0].double()
        t = math.radians(angle)                                # counter-clockwise as displayed (rows grow down)
        want_r, want_q = c - 12.0 * math.sin(t), c + 12.0 * math.cos(t)
        mass = out.sum()
        assert float((out * rows).sum() / mass) == pytest.approx(want_r, abs=0.05), angle
        assert float((out * cols).sum() / mass) == pytest.approx(want_q, abs=0.05), angle
    full = torch.full((2, 1, 21, 21), 200, dtype=torch.uint8)
    turned = rotate_images(full, 10)                           # a corner's source lies > 1 pixel outside
    assert turned.dtype == torch.uint8 and turned[:, :, 10, 10].eq(200).all()          # the centre stays
    assert turned[:, :, [0, 0, 20, 20], [0, 20, 0, 20]].eq(0).all()                   # zero fill
    assert turned[:, :, 3:18, 3:18].eq(200).all()                                     # inside: unchanged
    assert torch.equal(rotate_images(full, 90), full) and torch.equal(rotate_images(full, -360), full)


def test_a_large_batch_is_turned_in_chunks_with_the_same_numbers(monkeypatch):
    from fedclust.data import partition

    x = (torch.rand(3, 5, 1, 12, 12, generator=torch.Generator().manual_seed(0)) * 255).to(torch.uint8)
    whole = rotate_images(x, 10)
    monkeypatch.setattr(partition, "ROTATE_CHUNK_VALUES", 144 * 4)   # 4 images a call
    assert torch.equal(rotate_images(x, 10), whole)
    assert torch.equal(whole.reshape(-1, 1, 12, 12), _bilinear(x.reshape(-1, 1, 12, 12), 10))


# ---------------------------------------------------------------- worst-cluster accuracy, unequal clusters


def test_worst_cluster_accuracy_over_unequal_clusters_by_hand():
    acc = torch.tensor([0.9, 0.8, 0.7, 0.9, 1.0, 0.2, 0.4, 0.6], dtype=torch.float64)
    clusters = cluster_of_clients(8, 3, [5, 2, 1])             # [0 0 0 0 0 1 1 2]
    got = honest_and_worst(acc, None, clusters)
    by_hand = {0: (0.9 + 0.8 + 0.7 + 0.9 + 1.0) / 5, 1: (0.2 + 0.4) / 2, 2: 0.6}   # 0.86, 0.30, 0.60
    assert got["worst_cluster_accuracy"] == pytest.approx(100 * min(by_hand.values()))   # 30: the small cluster
    assert got["honest_accuracy"] == pytest.approx(100 * 5.5 / 8)                       # per client, not per cluster
    attackers = torch.tensor([False] * 5 + [True, False, False])    # client 5 attacks: cluster 1 is client 6 alone
    got = honest_and_worst(acc, attackers, clusters)
    assert got["worst_cluster_accuracy"] == pytest.approx(40.0)


# ---------------------------------------------------------------- the DAC setting on the real files


def test_the_dac_setting_on_the_real_fashion_mnist():
    root = Path("/usr/share/datasets/fashion-mnist")
    if not root.is_dir():
        pytest.skip("the Debian package dataset-fashion-mnist is not installed")
    cfg = load_config(str(REPO / "configs/fmnist_dac_covariate.yaml"), [f"data.root={root}", "data.download=false"])
    ids = [0, 69, 70, 89, 90, 95, 99]
    d = load_federated(cfg.data, cfg.clients, cfg.seed, client_ids=ids)
    assert d.clusters.bincount().tolist() == [70, 20, 5, 5]
    assert [int(d.clusters[i]) for i in ids] == [0, 0, 1, 1, 2, 3, 3]
    raw = _raw(root)
    tr, _ = federated_indices(raw.train_y, raw.test_y, 100, 200, 100, cfg.seed, num_classes=10)
    for row, (i, angle) in enumerate(zip(ids, [0, 0, 180, 180, 10, 350, 350])):
        own = raw.train_x[tr[i]]
        want = own if angle == 0 else (torch.rot90(own, 2, (-2, -1)) if angle == 180 else _bilinear(own, angle))
        assert torch.equal(d.train_x.stored[row], want), i
