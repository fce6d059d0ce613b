"""Data sets as plug-ins (fedclust/data/registry.py): the registry, a data set
added by a plugin file, your own arrays (data.name=npz, pool and natural
forms, every bad-data error), torchvision:NAME on generated files."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedclust.config import load_config
from fedclust.data import load_federated, registry
from fedclust.data.base import DataSet
from fedclust.data.partition import federated_indices
from fedclust.data.sets import npz as npz_mod
from fedclust.errors import ConfigError, DataError
from fedclust.metrics import cluster_recovery, neighbor_precision_recall
from fedclust.schema import DataConfig

PLUGIN = str(Path(__file__).resolve().parents[1] / "plugins" / "tiny_blobs.py")
SMALL = ["clients=6", "rounds=2", "stage1_rounds=1", "algorithm.k=1", "algorithm.l=2", "progress=false",
         "figures=false"]


def _run(cfg):
    from fedclust.runner import prepare, run

    return run(cfg, prepare(cfg))


# ---------------------------------------------------------------- registry

def test_registry_names_and_lookup():
    assert {"mnist", "fmnist", "cifar10", "synthetic", "npz", "torchvision:NAME"} <= set(registry.names())
    ds = registry.get("fmnist")
    assert (ds.name, ds.kind, ds.default_model, ds.input_shape(DataConfig()), ds.num_classes(DataConfig())) == \
        ("fmnist", "pool", "mlp", (1, 28, 28), 10)
    assert registry.get("synthetic").input_shape(DataConfig(synthetic_dim=7)) == (7,)
    assert registry.get("cifar10").default_model == "cnn" and registry.get("synthetic").default_model == "logreg"
    tv = registry.get("torchvision:KMNIST")
    assert (tv.name, tv.argument, tv.full_name) == ("torchvision", "KMNIST", "torchvision:KMNIST")


@pytest.mark.parametrize("name,part", [("fmnst", "did you mean 'fmnist'"), ("svhn", "known: cifar10"),
                                       ("torchvision", "write torchvision:NAME"), ("fmnist:x", "takes no ':x'"),
                                       ("syntetic", "did you mean 'synthetic'")])
def test_registry_refuses_unknown_names(name, part):
    with pytest.raises(ConfigError) as e:
        registry.get(name)
    assert e.value.field == "data.name" and e.value.value == name and part in str(e.value)
    assert registry.find(name) is None


def test_registry_refuses_duplicates_and_non_data_sets():
    class Again(DataSet):
        name = "fmnist"

    with pytest.raises(ValueError, match="registered twice"):
        registry.register(Again)
    with pytest.raises(TypeError):
        registry.register(object)

    class Bad(DataSet):
        name = "bad name"

    with pytest.raises(ValueError, match="identifier"):
        registry.register(Bad)


def test_a_data_set_from_a_plugin_file_runs(tmp_path):
    with pytest.raises(ConfigError, match="plugins"):          # not known without its plugin
        load_config(None, SMALL + ["data.name=blobs"])
    cfg = load_config(None, SMALL + [f"plugins=[{PLUGIN}]", "data.name=blobs", "algorithm.name=oracle",
                                     "data.train_size=20", "data.test_size=10", f"out={tmp_path / 'r'}"])
    summary = _run(cfg)
    assert summary["data"] == "blobs" and summary["data_clusters"] is None and summary["model"] == "logreg"
    assert summary["neighbor_precision"] == 1.0                 # oracle on the plugin's true clusters


@pytest.mark.parametrize("key,value", [("data.cluster_sizes", "[3,3]"), ("data.rotations", "[0,10]")])
def test_a_plugin_data_set_of_its_own_clients_refuses_the_cluster_layout(key, value):
    with pytest.raises(ConfigError) as e:   # it would ignore them: refused, naming the key
        load_config(None, SMALL + [f"plugins=[{PLUGIN}]", "data.name=blobs", f"{key}={value}"])
    assert e.value.field == key and "'blobs' does not apply it" in str(e.value)


# ---------------------------------------------------------------- npz, pool form

def _pool(seed=0, per_class=(12, 6), side=6, classes=10, channels=1):
    r = np.random.default_rng(seed)
    out = {}
    for split, n in zip(("train", "test"), per_class):
        y = r.permutation(np.repeat(np.arange(classes), n)).astype(np.int64)
        out[f"x_{split}"] = r.integers(0, 256, (len(y), channels, side, side), dtype=np.uint8)
        out[f"y_{split}"] = y
    return out


def _write(tmp_path, arrays, name="d.npz"):
    p = tmp_path / name
    np.savez(p, **arrays)
    return str(p)


@pytest.mark.parametrize("clusters,k", [("rotation", 2), ("rotation", 4), ("label_swap", 2)])
def test_npz_pool_is_split_and_transformed_as_fmnist(tmp_path, clusters, k):
    a = _pool()
    cfg = DataConfig(name="npz", path=_write(tmp_path, a), train_size=13, test_size=7, clusters=clusters,
                     num_clusters=k)
    n, seed = 8, 5
    got = load_federated(cfg, n, seed)
    # independently: the same split, the cluster's transform, x_train's statistics
    tr, te = federated_indices(torch.from_numpy(a["y_train"]), torch.from_numpy(a["y_test"]), n, 13, 7, seed,
                               num_classes=10)
    cluster = torch.arange(n) * k // n
    xt = torch.from_numpy(a["x_train"]).double()
    mean, std = xt.mean().item(), xt.std(unbiased=False).item()
    swaps = {0: {0: 1, 1: 0}, 1: {6: 7, 7: 6}}   # docs/algorithms.md: cluster 0 swaps 0<->1, cluster 1 6<->7
    for c in range(n):
        for idx, x, y, gx, gy in ((tr, a["x_train"], a["y_train"], got.train_x, got.train_y),
                                  (te, a["x_test"], a["y_test"], got.test_x, got.test_y)):
            img = torch.from_numpy(x[idx[c].numpy()])
            lab = torch.from_numpy(y[idx[c].numpy()])
            if clusters == "rotation":
                img = torch.rot90(img, [0, 2][cluster[c]] if k == 2 else int(cluster[c]), (-2, -1))
            else:
                lab = torch.tensor([swaps[int(cluster[c])].get(int(v), int(v)) for v in lab])
            want = (img.to(torch.float32) - torch.tensor(mean, dtype=torch.float32)) / torch.tensor(
                std, dtype=torch.float32)
            assert torch.equal(gy[c], lab)
            assert torch.allclose(gx[c], want, atol=1e-6)
    assert got.clusters.tolist() == cluster.tolist() and got.train_counts is None and got.num_classes == 10


def _write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> None:
    data = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes()
    path.write_bytes(gzip.compress(data) if gz else data)


def test_npz_pool_equals_the_builtin_fmnist_path(tmp_path):
    """The same images as fake Fashion-MNIST IDX files and as an npz: the same clients' images and labels
    (the inputs differ only by each path's normalisation)."""
    a = _pool(seed=3, side=28)
    root = tmp_path / "fm"
    root.mkdir()
    for stem, arr in (("train-images-idx3-ubyte", a["x_train"][:, 0]), ("train-labels-idx1-ubyte", a["y_train"]),
                      ("t10k-images-idx3-ubyte", a["x_test"][:, 0]), ("t10k-labels-idx1-ubyte", a["y_test"])):
        _write_idx(root / stem, arr.astype(np.uint8))
    kw = dict(train_size=11, test_size=5, num_clusters=4)
    fm = load_federated(DataConfig(name="fmnist", root=str(root), download=False, **kw), 8, 2)
    mine = load_federated(DataConfig(name="npz", path=_write(tmp_path, a), **kw), 8, 2)
    assert torch.equal(fm.train_y, mine.train_y) and torch.equal(fm.test_y, mine.test_y)
    xt = a["x_train"].astype(np.float64)
    back_fm = torch.round((fm.train_x.double() * 0.3530 + 0.2860) * 255)
    back_mine = torch.round(mine.train_x.double() * xt.std() + xt.mean())
    assert torch.equal(back_fm, back_mine)


def test_npz_pool_checks(tmp_path):
    path = _write(tmp_path, _pool(classes=4))
    with pytest.raises(ConfigError, match="at least 8 classes") as e:
        load_federated(DataConfig(name="npz", path=path, clusters="label_swap", train_size=4, test_size=2), 4, 0)
    assert e.value.field == "data.clusters"
    flat = _pool()
    flat = {k: (v.reshape(len(v), -1) if k.startswith("x") else v) for k, v in flat.items()}
    fpath = _write(tmp_path, flat, "flat.npz")
    with pytest.raises(ConfigError, match="square image inputs") as e:
        load_federated(DataConfig(name="npz", path=fpath, train_size=4, test_size=2), 4, 0)
    d = load_federated(DataConfig(name="npz", path=fpath, clusters="label_swap", train_size=4, test_size=2), 4, 0)
    assert d.input_shape == (36,)
    with pytest.raises(ConfigError, match="at most 12") as e:    # 4 classes x 12 training images, 4 clients
        load_federated(DataConfig(name="npz", path=path, clusters="rotation", train_size=13, test_size=2), 4, 0)
    assert e.value.field == "data.train_size"
    with pytest.raises(ConfigError, match="18x18") as e:          # the cnn on 36 numbers per example
        load_config(None, SMALL + ["data.name=npz", f"data.path={fpath}", "data.clusters=label_swap",
                                   "data.train_size=4", "data.test_size=2", "model=cnn"])
    assert e.value.field == "model"


# ---------------------------------------------------------------- npz, natural form

def _natural(train_owner, test_owner, cluster=None, dim=3, seed=0, classes=3):
    r = np.random.default_rng(seed)
    out = {"x_train": r.normal(size=(len(train_owner), dim)).astype(np.float32),
           "y_train": r.integers(0, classes, len(train_owner)),
           "x_test": r.normal(size=(len(test_owner), dim)).astype(np.float32),
           "y_test": r.integers(0, classes, len(test_owner)),
           "client_train": np.asarray(train_owner), "client_test": np.asarray(test_owner)}
    out["y_train"][0], out["y_test"][0] = classes - 1, 0
    out["y_train"][:classes] = np.arange(classes)[:len(train_owner)][::-1]   # every label occurs
    if cluster is not None:
        out["cluster"] = np.asarray(cluster)
    return out


def test_npz_natural_unequal_counts_are_padded(tmp_path):
    a = _natural([2, 0, 0, 1, 2, 0], [1, 0, 2, 1])
    path = _write(tmp_path, a)
    cfg = DataConfig(name="npz", path=path, train_size=999, test_size=999)   # ignored in this form
    d = load_federated(cfg, 3, 0)
    assert d.train_x.shape == (3, 3, 3) and d.test_x.shape == (3, 2, 3)
    assert d.train_counts.tolist() == [3, 1, 2] and d.test_counts.tolist() == [1, 2, 1]
    assert d.clusters is None and d.num_classes == 3
    xt = a["x_train"].astype(np.float64)
    norm = lambda x: (torch.from_numpy(x) - torch.tensor(xt.mean(), dtype=torch.float32)) / torch.tensor(  # noqa: E731
        xt.std(), dtype=torch.float32)
    assert torch.allclose(d.train_x[0], norm(a["x_train"][[1, 2, 5]]))              # the file's order
    assert d.train_y[0].tolist() == a["y_train"][[1, 2, 5]].tolist()
    assert torch.allclose(d.train_x[2, :2], norm(a["x_train"][[0, 4]]))
    assert d.train_x[1, 1:].eq(0).all() and d.train_y[1, 1:].eq(0).all()              # padding
    assert d.test_x[0, 1:].eq(0).all() and d.test_y[2, 1:].eq(0).all()
    part = load_federated(cfg, 3, 0, client_ids=[1, 2])
    assert torch.equal(part.train_x, d.train_x[1:]) and part.train_counts.tolist() == [1, 2]
    assert part.train_x.shape[1] == 3                                                   # the width over all clients


def test_npz_natural_equal_counts_and_clusters(tmp_path):
    a = _natural([0, 1, 2, 3] * 2, [3, 2, 1, 0], cluster=[0, 0, 1, 1])
    d = load_federated(DataConfig(name="npz", path=_write(tmp_path, a)), 4, 0)
    assert d.train_counts is None and d.test_counts is None and d.clusters.tolist() == [0, 0, 1, 1]
    assert registry.get("npz").kind_of(DataConfig(name="npz", path=str(tmp_path / "d.npz"))) == "client"


def test_npz_natural_config_errors(tmp_path):
    path = _write(tmp_path, _natural([0, 1, 2, 3], [3, 2, 1, 0], cluster=[0, 1, 2, 2]))
    base = SMALL + ["data.name=npz", f"data.path={path}"]
    with pytest.raises(ConfigError) as e:
        load_config(None, base + ["clients=6"])
    assert e.value.field == "clients" and "holds 4 clients" in str(e.value) and "set clients=4" in str(e.value)
    assert load_config(None, base + ["clients=4"]).data.num_clusters == 3        # read from the file
    with pytest.raises(ConfigError) as e:
        load_config(None, base + ["clients=4", "data.num_clusters=4"])
    assert e.value.field == "data.num_clusters" and "data.num_clusters=3" in str(e.value)
    load_config(None, base + ["clients=4", "data.num_clusters=3"])
    nocl = _write(tmp_path, _natural([0, 1, 2, 3], [3, 2, 1, 0]), "nocl.npz")
    with pytest.raises(ConfigError) as e:
        load_config(None, SMALL + ["data.name=npz", f"data.path={nocl}", "clients=4", "algorithm.name=oracle"])
    assert e.value.field == "data.path" and "`cluster` array" in str(e.value)


def test_unknown_clusters_give_null_metrics():
    lists = torch.tensor([[False, True, True], [True, False, False]])
    p, r = neighbor_precision_recall(lists, None, torch.tensor([0, 1]))
    assert p.isnan().all() and r.isnan().all()
    adj = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=bool)
    assert cluster_recovery(adj, None) == {"num_clusters": 2, "ari": None}


# ---------------------------------------------------------------- npz, bad data

def _good():
    return _natural([0, 1, 1, 0], [0, 1, 1, 0])


def _edit(**changes):
    a = _good()
    for k, v in changes.items():
        if v is None:
            del a[k]
        else:
            a[k] = v
    return a


BAD = [
    (_edit(x_test=None), ["missing array(s) x_test"]),
    (_edit(y_train=np.array([0, 1, 2])), ["'y_train' has shape [3]", "x_train has 4 rows"]),
    (_edit(y_train=np.array([0, -1, 2, 1])), ["label -1 at index 1", "0..K-1"]),
    (_edit(y_train=np.array([0.0, 1.0, 2.0, 1.0])), ["not integers", "astype"]),
    (_edit(num_classes=np.array(2)), ["label 2", "num_classes is 2"]),
    (_edit(client_train=np.array([0, 1, -1, 0])), ["'client_train' holds -1 at index 2"]),
    (_edit(client_train=np.array([0, 0, 0, 0])), ["client 1 has no training example"]),
    (_edit(client_test=np.array([0, 2, 2, 0])), ["client 2 has no training example"]),
    (_edit(client_test=np.array([0, 0, 0, 0])), ["client 1 has no test example"]),
    (_edit(client_test=None), ["holds 'client_train' but not 'client_test'"]),
    (_edit(cluster=np.array([0, 1, 1])), ["'cluster' has shape [3]", "shape [2]"]),
    (_edit(x_train=np.array([[0, 1, 2], [0, np.nan, 1], [1, 1, 1], [np.inf, 0, 0]])),
     ["NaN or inf values in 2 example(s)", "row 1"]),
    (_edit(x_test=np.ones((4, 2))), ["x_test's [2]"]),
    (_edit(x_train=np.array(["a", "b", "c", "d"])), ["dtype <U1"]),
    # labels from 1 (or with gaps) would add outputs no example has
    (_edit(y_train=np.array([1, 2, 3, 1]), y_test=np.array([3, 1, 2, 2])), ["labels [0] of 0..3 occur in neither",
                                                                            "renumber the labels", "num_classes"]),
    (_edit(y_train=np.array(["cat", "dog", "cat", "dog"])), ["not integers", "numpy.unique"]),
]


@pytest.mark.parametrize("i", range(len(BAD)))
def test_npz_bad_data_errors(tmp_path, i):
    arrays, parts = BAD[i]
    path = _write(tmp_path, arrays)
    with pytest.raises(DataError) as e:
        load_config(None, SMALL + ["clients=2", "data.name=npz", f"data.path={path}"])
    msg = str(e.value)
    assert f"data.path '{Path(path).resolve()}'" in msg
    for part in parts:
        assert part in msg, msg


def test_npz_file_errors_and_pt(tmp_path):
    for path, part in (("", "set data.path=FILE.npz"), (str(tmp_path / "none.npz"), "no such file"),
                       (str(tmp_path / "d.csv"), "a .npz file")):
        with pytest.raises(ConfigError) as e:
            load_federated(DataConfig(name="npz", path=path), 2, 0)
        assert e.value.field == "data.path" and part in str(e.value)
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="cannot read it as .npz"):
        load_federated(DataConfig(name="npz", path=str(tmp_path / "broken.npz")), 2, 0)
    a = _good()
    torch.save({k: torch.from_numpy(np.asarray(v)) for k, v in a.items()}, tmp_path / "d.pt")
    got = load_federated(DataConfig(name="npz", path=str(tmp_path / "d.pt")), 2, 0)
    want = load_federated(DataConfig(name="npz", path=_write(tmp_path, a)), 2, 0)
    assert torch.equal(got.train_x, want.train_x) and torch.equal(got.test_y, want.test_y)


def test_npz_is_read_once_per_process(tmp_path, monkeypatch):
    path = _write(tmp_path, _good())
    calls = []
    real = npz_mod._read
    monkeypatch.setattr(npz_mod, "_read", lambda p: calls.append(p) or real(p))
    npz_mod._cached.cache_clear()
    cfg = load_config(None, SMALL + ["clients=2", "data.name=npz", f"data.path={path}"])
    load_federated(cfg.data, 2, 0)
    assert len(calls) == 1


# ---------------------------------------------------------------- torchvision:NAME

def test_torchvision_name_on_generated_kmnist_files(tmp_path):
    raw = tmp_path / "KMNIST" / "raw"
    raw.mkdir(parents=True)
    r = np.random.default_rng(1)
    tr_y = r.permutation(np.repeat(np.arange(10), 6)).astype(np.uint8)
    te_y = r.permutation(np.repeat(np.arange(10), 3)).astype(np.uint8)
    tr_x = r.integers(0, 256, (60, 28, 28), dtype=np.uint8)
    te_x = r.integers(0, 256, (30, 28, 28), dtype=np.uint8)
    for stem, arr in (("train-images-idx3-ubyte", tr_x), ("train-labels-idx1-ubyte", tr_y),
                      ("t10k-images-idx3-ubyte", te_x), ("t10k-labels-idx1-ubyte", te_y)):
        _write_idx(raw / stem, arr)
    cfg = DataConfig(name="torchvision:KMNIST", root=str(tmp_path), download=False, train_size=10, test_size=5)
    ds = registry.get(cfg.name)
    assert ds.input_shape(cfg) == (1, 28, 28) and ds.num_classes(cfg) == 10
    scaled = tr_x.astype(np.float64) / 255
    (mean,), (std,) = ds.normalization(cfg)
    assert mean == pytest.approx(scaled.mean()) and std == pytest.approx(scaled.std())
    d = load_federated(cfg, 4, 0)
    assert d.train_x.shape == (4, 10, 1, 28, 28) and d.source == str(raw.parent.parent / "KMNIST/raw")
    tr, _ = federated_indices(torch.from_numpy(tr_y).long(), torch.from_numpy(te_y).long(), 4, 10, 5, 0,
                              num_classes=10)
    assert torch.equal(d.train_y, torch.from_numpy(tr_y).long()[tr])
    want = (torch.from_numpy(tr_x[tr[0].numpy()]).float().div(255) - mean) / std
    assert torch.allclose(d.train_x[0, :, 0], want, atol=1e-5)   # client 0: cluster 0, not rotated


def test_torchvision_name_errors(tmp_path):
    with pytest.raises(DataError) as e:
        load_federated(DataConfig(name="torchvision:KMNIST", root=str(tmp_path), download=False), 4, 0)
    assert str(tmp_path / "KMNIST" / "raw") in str(e.value) and "data.download=true" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_federated(DataConfig(name="torchvision:KMINST", root=str(tmp_path), download=False), 4, 0)
    assert e.value.field == "data.name" and "did you mean 'torchvision:KMNIST'" in str(e.value)


def test_stored_inputs_read_as_the_normalized_tensor_bit_for_bit():
    from fedclust.data.base import StoredInputs
    from fedclust.data.partition import normalize

    g = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (3, 5, 1, 4, 4), generator=g, dtype=torch.uint8)
    norm = lambda x: normalize(x, (0.2860,), (0.3530,))   # noqa: E731
    x, whole = StoredInputs(raw, norm), norm(raw)
    assert (x.shape, x.device, x.dtype, x.dim(), x.element_size(), len(x)) == \
        (whole.shape, whole.device, torch.float32, 5, 4, 3)
    rows, idx = torch.arange(3)[:, None], torch.tensor([[4, 0], [1, 1], [3, 2]])
    for key in (slice(1, 3), (rows, idx), torch.tensor([2, 0]), (slice(None), slice(0, 2))):
        assert torch.equal(x[key], whole[key])                 # read by index: the same numbers
    assert torch.equal(x.double(), whole.double()) and torch.equal(torch.flatten(x, 0, 1), whole.flatten(0, 1))
    assert torch.equal(x - 1.0, whole - 1.0) and torch.equal(1.0 - x, 1.0 - whole)
    assert raw.element_size() == 1                             # a quarter of float32's memory


def test_image_pools_are_kept_as_stored_bytes(tmp_path):
    from fedclust.data.base import StoredInputs

    path = _write(tmp_path, _pool())                           # uint8 images
    d = load_federated(DataConfig(name="npz", path=path, train_size=10, test_size=5), 4, 0)
    assert isinstance(d.train_x, StoredInputs) and d.train_x.stored.dtype == torch.uint8
