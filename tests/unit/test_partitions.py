"""Partitions researchers use (issue 36): data.partition (iid, dirichlet, shards), data.quantity_skew, any number
of clusters.  Each draw is checked against scipy.stats or a plain computation made here, every split for its
sizes and for examples on two clients, the iid default against today's split, the config's refusals by key,
the summary's and the report's words, and a 2-round run of a Dirichlet split of 4 rotation clusters."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
import yaml

from fedclust import report
from fedclust.config import load_config
from fedclust.data import check_data, load_federated, skew
from fedclust.data import partition as part
from fedclust.data.sets.npz import read_arrays
from fedclust.errors import ConfigError
from fedclust.schema import DataConfig

SMALL = ["clients=8", "rounds=2", "stage1_rounds=1", "algorithm.k=2", "algorithm.l=4", "progress=false",
         "figures=false"]
P_MIN = 1e-3   # a KS test's p-value below this fails (the draws are fixed by their seed: it passes or not, always)


def balanced_labels(per_class: int, classes: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).permutation(np.repeat(np.arange(classes), per_class)))


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """An npz pool of 8x8 one-channel uint8 images: 10 classes, 120 training and 60 test images of each."""
    r = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("pool") / "pool.npz"
    ytr, yte = balanced_labels(120).numpy(), balanced_labels(60, seed=1).numpy()
    np.savez(path, x_train=r.integers(0, 256, (len(ytr), 1, 8, 8), dtype=np.uint8), y_train=ytr,
             x_test=r.integers(0, 256, (len(yte), 1, 8, 8), dtype=np.uint8), y_test=yte)
    return str(path)


def cfg_of(path, **kw) -> DataConfig:
    return DataConfig(**{"name": "npz", "path": path, "train_size": 20, "test_size": 10, **kw})


# ---------------------------------------------------------------- the draws against scipy

@pytest.mark.parametrize("alpha,classes", [(0.3, 5), (0.05, 10), (2.0, 3)])
def test_dirichlet_proportions_follow_the_dirichlet_law(alpha, classes):
    # scipy imported where used: at module level every collecting worker pays for it
    from scipy import stats

    n = 4000
    p = skew.dirichlet_proportions(11, torch.arange(n), classes, alpha).numpy()
    assert np.isfinite(p).all() and np.allclose(p.sum(1), 1.0, atol=1e-12) and (p >= 0).all()
    law = stats.dirichlet(np.full(classes, alpha))
    for k in range(classes):   # each proportion's marginal is Beta(alpha, (K - 1) alpha)
        assert stats.kstest(p[:, k], stats.beta(alpha, (classes - 1) * alpha).cdf).pvalue > P_MIN, k
    assert np.allclose(p.mean(0), law.mean(), atol=4 * np.sqrt(law.var().max() / n))
    a0 = classes * alpha      # covariance of two proportions: -a_j a_k / (a0^2 (a0 + 1))
    cov = np.cov(p.T)
    want = -alpha * alpha / (a0 * a0 * (a0 + 1))
    assert abs(cov[0, 1] - want) < 6 * np.sqrt(law.var().max() ** 2 / n)


def test_dirichlet_rows_depend_on_the_client_alone():
    a = skew.dirichlet_proportions(3, torch.tensor([5, 9, 700]), 10, 0.1)
    b = skew.dirichlet_proportions(3, torch.arange(1000), 10, 0.1)[[5, 9, 700]]
    assert torch.equal(a, b)
    assert not torch.equal(a, skew.dirichlet_proportions(4, torch.tensor([5, 9, 700]), 10, 0.1))


def test_power_law_draws_and_sizes():
    from scipy import stats

    n, a, t, floor = 5000, 1.5, 200, 10
    x = torch.exp(skew.log_pareto(3, torch.arange(n), a)).numpy()
    assert stats.kstest(x, stats.pareto(b=a).cdf).pvalue > P_MIN
    sizes = skew.client_sizes(3, n, t, a, floor).numpy()
    assert sizes.sum() == n * t and sizes.min() >= floor
    rest = n * (t - floor)                      # shared in proportion to x, each within 1 of its exact share
    assert np.all(np.abs(sizes - floor - x / x.sum() * rest) < 1 + 1e-6)
    assert sizes.max() > 20 * np.median(sizes)  # skewed: the law's tail
    assert torch.equal(skew.client_sizes(3, n, t, 0.0, floor), torch.full((n,), t))


def test_largest_remainder_by_hand():
    got = skew.largest_remainder(torch.tensor([[0.5, 0.3, 0.2], [1.0, 1.0, 1.0], [0.0, 0.0, 1.0]]),
                                 torch.tensor([7, 4, 5]))
    # 3.5, 2.1, 1.4 -> 3, 2, 1 and the one left to the largest remainder; thirds of 4: the tie to the first column
    assert got.tolist() == [[4, 2, 1], [2, 1, 1], [0, 0, 5]]


# ---------------------------------------------------------------- shards, by a plain loop

def plain_shards(seed, have, sizes, s):
    labels = [k for k in range(len(have)) for _ in range(have[k])]
    used = skew._keyed_order(seed, "partition_shards_used", 0, len(labels)).tolist()[: sum(sizes)]
    stream = sorted(labels[u] for u in used)
    counts = [[0] * len(have) for _ in sizes]
    at = 0
    for slot in skew._keyed_order(seed, "partition_shards_deal", 0, len(sizes) * s).tolist():
        i, j = divmod(slot, s)
        size = sizes[i] // s + (1 if j < sizes[i] % s else 0)
        for label in stream[at:at + size]:
            counts[i][label] += 1
        at += size
    return counts


@pytest.mark.parametrize("have,sizes,s", [([30, 25, 40, 5], [7, 12, 9, 10, 8], 3), ([10, 10], [5, 5, 5, 5], 2),
                                          ([4, 9, 1, 6], [3, 1, 2], 1)])
def test_shards_match_a_plain_loop(have, sizes, s):
    got = skew.shard_counts(5, torch.tensor(have), torch.tensor(sizes), s)
    assert got.tolist() == plain_shards(5, have, sizes, s)
    assert got.sum(1).tolist() == sizes and (got.sum(0) <= torch.tensor(have)).all()


def test_shards_are_pathological():
    """McMahan et al.'s split: 100 clients x 60 of 6,000 images (600 a class), 2 shards of 30 a client: a shard
    lies within one class, so every client holds at most 2 classes, 30 images of each."""
    counts = skew.shard_counts(0, torch.full((10,), 600), torch.full((100,), 60), 2)
    assert counts.sum().item() == 6000 and (counts.sum(0) == 600).all()
    assert ((counts > 0).sum(1) <= 2).all() and (counts % 30 == 0).all()


# ---------------------------------------------------------------- fitting the pool, indices

def test_fit_to_pool_keeps_sizes_and_fits_every_class():
    g = torch.Generator().manual_seed(0)
    have = torch.tensor([50, 5, 80, 30])
    for _ in range(20):
        counts = torch.randint(0, 12, (15, 4), generator=g)
        counts[:, 1] += 3                                   # class 1 over-asked
        if counts.sum() > have.sum():
            continue
        got = skew.fit_to_pool(counts, have, 1, "t")
        assert torch.equal(got.sum(1), counts.sum(1)) and (got >= 0).all() and (got.sum(0) <= have).all()
    fits = torch.tensor([[1, 1, 1, 1], [2, 0, 0, 2]])
    assert skew.fit_to_pool(fits, have, 1, "t") is fits
    within = skew.fit_within_client(torch.tensor([[0, 9, 1, 0], [40, 40, 0, 0]]), have)
    assert within.sum(1).tolist() == [10, 80] and (within <= have).all()
    assert within[0].tolist() == [4, 5, 1, 0]               # the excess to the classes with room, in label order


@pytest.mark.parametrize("distinct", [True, False])
def test_indices_hold_the_counts(distinct):
    labels = balanced_labels(50)
    counts = torch.tensor([[5, 0, 0, 0, 0, 0, 0, 0, 0, 44], [0] * 9 + [5], [1] * 10, [30] + [0] * 9])
    split = skew.indices_from_counts(counts, labels, 2, "train", distinct)
    assert split.sizes.tolist() == [49, 5, 10, 30] and len(split.examples) == 94   # class 9: all 50
    idx, real = split.rows(torch.arange(4))
    for i in range(4):
        mine = idx[i][real[i]]
        assert torch.equal(torch.bincount(labels[mine], minlength=10), counts[i])
        assert mine.unique().numel() == len(mine)           # distinct within a client
        assert (idx[i][~real[i]] == 0).all()
    if distinct:
        assert split.examples.unique().numel() == len(split.examples)


@pytest.mark.parametrize("partition,kw", [("dirichlet", dict(alpha=0.1)), ("shards", dict(shards_per_client=3)),
                                          ("iid", dict(quantity_skew=1.2)),
                                          ("dirichlet", dict(alpha=1.0, quantity_skew=0.8))])
def test_no_example_on_two_clients(partition, kw):
    train, test = balanced_labels(300), balanced_labels(100, seed=1)
    tr, te = skew.skewed_indices(train, test, 50, 4, num_classes=10, partition=partition, train_size=40,
                                 test_size=20, **kw)
    assert tr.examples.unique().numel() == len(tr.examples) == 50 * 40
    assert int(tr.sizes.min()) >= 10 and (te.sizes == 20).all()
    if kw.get("quantity_skew"):
        assert int(tr.sizes.max()) > 40
    else:
        assert (tr.sizes == 40).all()
    rows, real = te.rows(torch.arange(50))
    assert all(rows[i][real[i]].unique().numel() == 20 for i in range(50))   # a test set distinct within itself


def test_a_test_set_follows_its_clients_training_labels():
    train, test = balanced_labels(300), balanced_labels(100, seed=1)
    tr, te = skew.skewed_indices(train, test, 30, 8, num_classes=10, partition="dirichlet", alpha=0.1,
                                 train_size=50, test_size=10)
    a, real_a = tr.rows(torch.arange(30))
    b, _ = te.rows(torch.arange(30))
    for i in range(30):
        mine = torch.bincount(train[a[i][real_a[i]]], minlength=10).double()
        want = skew.largest_remainder(mine[None], torch.tensor([10]))[0]
        assert torch.equal(torch.bincount(test[b[i]], minlength=10), want)


def test_thousands_of_clients_and_a_small_alpha_end_in_one_pass():
    """2,000 clients at alpha 0.05 using the whole split, and the case other tools loop on (they redraw until
    every client holds a minimum): 500 clients, alpha 0.3, 100 classes."""
    start = time.perf_counter()
    train, test = balanced_labels(6000), balanced_labels(1000, seed=1)
    tr, _ = skew.skewed_indices(train, test, 2000, 0, num_classes=10, partition="dirichlet", alpha=0.05,
                                train_size=30, test_size=10)
    assert (tr.sizes == 30).all() and torch.equal(tr.examples.sort().values, torch.arange(60000))
    train, test = balanced_labels(600, classes=100), balanced_labels(100, classes=100, seed=1)
    tr, _ = skew.skewed_indices(train, test, 500, 0, num_classes=100, partition="dirichlet", alpha=0.3,
                                train_size=100, test_size=10)
    assert (tr.sizes == 100).all() and tr.examples.unique().numel() == 50000
    assert time.perf_counter() - start < 30    # about 2 s on 2 busy cores


# ---------------------------------------------------------------- loading

def test_the_iid_default_is_todays_split(pool):
    cfg = cfg_of(pool, clusters="label_swap", num_clusters=4)
    raw = read_arrays(cfg)
    tr, te = part.federated_indices(raw.train_y, raw.test_y, 12, 20, 10, seed=3, num_classes=10)
    d = load_federated(cfg, 12, seed=3)
    table = part.label_tables(4, 10)
    assert torch.equal(d.train_y, table[d.clusters[:, None], raw.train_y[tr]])
    assert torch.equal(d.test_y, table[d.clusters[:, None], raw.test_y[te]])
    assert d.train_counts is None and d.test_counts is None
    assert torch.equal(d.train_x.materialize() if hasattr(d.train_x, "materialize") else d.train_x,
                       load_federated(cfg_of(pool, clusters="label_swap", num_clusters=4, partition="iid",
                                             quantity_skew=0.0), 12, seed=3).train_x.materialize())


def test_a_dirichlet_split_of_rotation_clusters_with_skewed_sizes(pool):
    cfg = cfg_of(pool, num_clusters=4, partition="dirichlet", alpha=0.2, quantity_skew=1.0)
    full = load_federated(cfg, 12, seed=1)
    tr, te = skew.skewed_indices(read_arrays(cfg).train_y, read_arrays(cfg).test_y, 12, 1, num_classes=10,
                                 partition="dirichlet", alpha=0.2, quantity_skew=1.0, train_size=20, test_size=10)
    assert torch.equal(full.train_counts, tr.sizes) and full.test_counts is None
    assert full.train_x.shape[1] == int(tr.sizes.max())
    assert full.clusters.tolist() == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    raw = read_arrays(cfg)
    idx, real = tr.rows(torch.arange(12))
    assert torch.equal(full.train_y, raw.train_y[idx] * real)   # rotation keeps the labels; padding y = 0
    stored = full.train_x.stored
    assert (stored[~real] == 0).all()
    turned = part.rotate(raw.train_x[idx], full.clusters, 4)       # 0°, 90°, 180°, 270°
    assert torch.equal(stored[real], turned[real])
    ids = [11, 0, 6]
    held = load_federated(cfg, 12, seed=1, client_ids=ids)
    assert torch.equal(held.train_counts, full.train_counts[ids])
    for f in ("train_y", "test_y"):
        assert torch.equal(getattr(held, f), getattr(full, f)[ids])
    assert torch.equal(held.train_x.stored, stored[ids])


def test_any_number_of_clusters(pool):
    assert part.rotation_angles(3) == (0.0, 120.0, 240.0) and part.rotation_angles(1) == (0.0,)
    assert part.rotation_angles(2) == (0.0, 180.0) and part.rotation_angles(4) == (0.0, 90.0, 180.0, 270.0)
    table = part.label_tables(3, 10)
    assert table[0].tolist() == list(range(10))
    for c in (1, 2):                                              # a permutation keyed on the cluster alone
        assert sorted(table[c].tolist()) == list(range(10)) and torch.equal(table[c], part.label_permutation(c, 10))
    assert torch.equal(part.label_tables(5, 10)[:3], table)      # the same for every count
    assert torch.equal(part.label_tables(2, 10)[1], torch.tensor([0, 1, 2, 3, 4, 5, 7, 6, 8, 9]))   # the paper's
    cfg = cfg_of(pool, clusters="label_swap", num_clusters=3, partition="shards")
    d = load_federated(cfg, 9, seed=0)
    raw = read_arrays(cfg)
    tr, _ = skew.skewed_indices(raw.train_y, raw.test_y, 9, 0, num_classes=10, partition="shards",
                                train_size=20, test_size=10)
    idx, _ = tr.rows(torch.arange(9))
    assert torch.equal(d.train_y, table[d.clusters[:, None], raw.train_y[idx]])
    one = load_federated(cfg_of(pool, num_clusters=1, partition="dirichlet", alpha=0.5), 6, seed=0)
    tr, te = skew.skewed_indices(raw.train_y, raw.test_y, 6, 0, num_classes=10, partition="dirichlet",
                                 train_size=20, test_size=10)
    idx, _ = tr.rows(torch.arange(6))
    assert torch.equal(one.train_x.stored, raw.train_x[idx]) and one.clusters.tolist() == [0] * 6


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("overrides,field,words", [
    (["data.partition=hetero"], "data.partition", ["dirichlet"]),
    (["data.partition=dirichlet", "data.alpha=0"], "data.alpha", ["> 0"]),
    (["data.partition=dirichlet", "data.alpha=.inf"], "data.alpha", ["finite"]),
    (["data.alpha=0.1"], "data.alpha", ["data.partition=dirichlet"]),
    (["data.shards_per_client=3"], "data.shards_per_client", ["data.partition=shards"]),
    (["data.partition=dirichlet", "data.shards_per_client=3"], "data.shards_per_client", ["data.partition=shards"]),
    (["data.partition=shards", "data.shards_per_client=0"], "data.shards_per_client", [">= 1"]),
    (["data.partition=shards", "data.shards_per_client=201"], "data.shards_per_client", ["at most 200"]),
    (["data.partition=shards", "clients=400"], "data.train_size", ["80000", "60000", "at most 150"]),
    (["data.partition=shards", "data.share_images=true"], "data.share_images", ["shards"]),
    (["data.partition=dirichlet", "clients=400"], "data.train_size", ["at most 150", "data.share_images=true"]),
    (["data.partition=dirichlet", "data.test_size=10001"], "data.test_size", ["at most 10000"]),
    (["data.quantity_skew=-1"], "data.quantity_skew", ["0"]),
    (["data.quantity_skew=.nan"], "data.quantity_skew", ["finite"]),
    (["data.name=synthetic", "data.partition=dirichlet"], "data.partition", ["synthetic"]),
    (["data.name=synthetic", "data.quantity_skew=1.5"], "data.quantity_skew", ["synthetic"]),
])
def test_bad_partition_keys_are_refused(overrides, field, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, SMALL + overrides)
    assert e.value.field == field and e.value.fix, str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_good_partition_settings_load():
    for overrides in (["data.partition=dirichlet", "data.alpha=0.05", "clients=2000", "data.share_images=true"],
                      ["data.partition=shards", "data.shards_per_client=5", "data.num_clusters=4"],
                      ["data.quantity_skew=1.5", "data.clusters=label_swap", "data.num_clusters=3"],
                      ["data.num_clusters=1", "data.partition=dirichlet"]):
        load_config(None, SMALL + overrides)
    check_data(DataConfig(partition="dirichlet", clusters="label_swap", num_clusters=7), 10)


def test_a_file_of_own_clients_refuses_a_partition(tmp_path):
    r = np.random.default_rng(0)
    path = tmp_path / "own.npz"
    np.savez(path, x_train=r.normal(size=(8, 3)), y_train=np.array([0, 1] * 4), x_test=r.normal(size=(4, 3)),
             y_test=np.array([0, 1] * 2), client_train=np.array([0, 1, 2, 3] * 2), client_test=np.arange(4))
    with pytest.raises(ConfigError) as e:
        check_data(DataConfig(name="npz", path=str(path), partition="shards"), 4)
    assert e.value.field == "data.partition" and "own clients" in str(e.value)


# ---------------------------------------------------------------- the summary and the report

def test_the_summary_and_the_report_name_the_partition(tmp_path):
    assert skew.partition_record("dirichlet", 0.1, 2, 0.0) == {
        "data_partition": "dirichlet", "data_alpha": 0.1, "data_shards_per_client": None, "data_quantity_skew": 0.0}
    assert report.layout_text({"partition": "dirichlet", "alpha": 0.1}) == "dirichlet 0.1"
    assert report.layout_text({"partition": "shards", "shards_per_client": 2, "quantity_skew": 1.5,
                               "rotations": [0, 90]}) == "shards 2/client, quantity skew 1.5, angles 0/90"
    assert report.layout_text({"partition": "iid"}) is None and report.layout_text({}) is None
    runs = []
    for name, data, acc in (("a", {"partition": "dirichlet", "alpha": 0.1}, 50.0),
                            ("b", {"partition": "dirichlet", "alpha": 1.0}, 70.0), ("c", {}, 90.0)):
        d = tmp_path / name
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"algorithm": "fedavg", "label": "fedavg", "data": "fmnist",
                                                    "data_clusters": "rotation", "true_clusters": 4, "seed": 0,
                                                    "final_accuracy": acc}))
        (d / "config.yaml").write_text(yaml.safe_dump({"algorithm": {"name": "fedavg"}, "clients": 8,
                                                       "data": {"name": "fmnist", "num_clusters": 4, **data}}))
        runs.append(report.load_run(d))
    res = report.Results(runs)
    headers = [report.setting_text(k) for k in res.settings]
    assert len(headers) == 3 and any(h.startswith("fmnist, rotation 4, dirichlet 0.1,") for h in headers)
    assert any(h.startswith("fmnist, rotation 4, dirichlet 1,") for h in headers)
    means = sorted(res.cell("fedavg", k, "final_accuracy")[0] for k in res.settings)
    assert means == [50.0, 70.0, 90.0]                          # never averaged together
    (tmp_path / "a" / "config.yaml").unlink()                   # summary.json alone still says the split
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    s.update(skew.partition_record("dirichlet", 0.1, 2, 0.0))
    (tmp_path / "a" / "summary.json").write_text(json.dumps(s))
    assert "dirichlet 0.1" in report.setting_text(report.setting(report.load_run(tmp_path / "a")))
    one = dict(report.load_run(tmp_path / "c"), true_clusters=1, data_clusters="label_swap")
    assert report.setting_text(report.setting(one)).startswith("fmnist, 1 cluster")


