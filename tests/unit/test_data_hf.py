"""data.name=hf: a Hugging Face DatasetDict saved with save_to_disk in tmp_path (images as FEMNIST's on Flower
Datasets, or feature vectors), read into npz's natural form: the arrays against values computed by hand, the
options, every error naming its key, the message when `datasets` is missing, and one short run in-process."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from fedclust.config import load_config
from fedclust.data import check_data, load_federated, registry
from fedclust.data.sets import hf
from fedclust.errors import ConfigError, DataError
from fedclust.schema import DataConfig

datasets = None   # the Hugging Face library, set by the fixture below


@pytest.fixture(autouse=True)
def datasets_library():
    """Imports `datasets` when a test of this module first runs, not when the suite is collected (its import
    costs every collecting worker about a second); without it each test skips, saying why."""
    global datasets
    try:
        import datasets as library
    except ImportError as err:   # fedclust[test] installs it; without it say why these tests do not run
        pytest.skip(f"the Hugging Face `datasets` library is not installed ({err}): pip install 'fedclust[hf]'")
    library.disable_progress_bars()
    datasets = library

SMALL = ["rounds=2", "stage1_rounds=1", "algorithm.k=1", "algorithm.l=2", "progress=false", "figures=false"]
# 6 writers of 2 groups (w-a*: bright images, labels 0/1; w-b*: dark, labels 2/3), deliberately out of order
WRITERS = {"w-b2": (3, 1), "w-a1": (2, 1), "w-a3": (4, 2), "w-b1": (2, 2), "w-a2": (3, 1), "w-b3": (1, 1)}


def _rows(writers, split, seed):
    """(writer, image [5, 5] uint8, label) of every example of ``split``, writers interleaved."""
    rng = np.random.default_rng(seed)
    todo = {w: n[0 if split == "train" else 1] for w, n in writers.items()}
    out = []
    while any(todo.values()):
        for w in writers:
            if todo[w]:
                todo[w] -= 1
                bright = w.startswith("w-a")
                img = rng.integers(128 if bright else 0, 256 if bright else 128, (5, 5), dtype=np.uint8)
                out.append((w, img, (0 if bright else 2) + todo[w] % 2))
    return out


def make_hf(root, writers=None, vectors=False, seed=0, **columns):
    """A DatasetDict(train, test) saved at ``root``; ``columns`` renames writer_id/image/character or adds
    columns; returns {split: rows}."""
    rows = {s: _rows(WRITERS if writers is None else writers, s, seed + i) for i, s in enumerate(("train", "test"))}
    parts = {}
    for split, rs in rows.items():
        data = {"writer_id": [r[0] for r in rs], "character": [r[2] for r in rs]}
        if vectors:
            data["x"] = [r[1].reshape(-1)[:6].astype(np.float64) / 255 for r in rs]
            features = datasets.Features({"writer_id": datasets.Value("string"),
                                          "character": datasets.Value("int64"),
                                          "x": datasets.Sequence(datasets.Value("float64"))})
        else:
            from PIL import Image

            data["image"] = [Image.fromarray(r[1]) for r in rs]
            features = datasets.Features({"writer_id": datasets.Value("string"),
                                          "character": datasets.ClassLabel(num_classes=62), "image": datasets.Image()})
        data.update(columns)
        parts[split] = datasets.Dataset.from_dict(data, features=None if columns else features)
    datasets.DatasetDict(parts).save_to_disk(str(root))
    return rows


def cfg_of(root, **options) -> DataConfig:
    return DataConfig(name="hf", path=str(root), options={"client_column": "writer_id", "label_column": "character",
                                                          **options})


def test_writers_become_clients_in_sorted_order_with_their_images(tmp_path):
    rows = make_hf(tmp_path / "d")
    writers = sorted(WRITERS)                                          # w-a1 w-a2 w-a3 w-b1 w-b2 w-b3
    d = load_federated(cfg_of(tmp_path / "d"), 6, 0)
    assert d.train_x.shape == (6, 4, 1, 5, 5) and d.test_x.shape == (6, 2, 1, 5, 5) and d.input_shape == (1, 5, 5)
    assert d.train_counts.tolist() == [WRITERS[w][0] for w in writers]
    assert d.clusters is None and d.num_classes == 62                 # the ClassLabel's count
    train = np.stack([r[1] for r in rows["train"]]).astype(np.float64)
    mean = torch.tensor(train.mean(), dtype=torch.float32)
    std = torch.tensor(train.std(), dtype=torch.float32)
    for c, w in enumerate(writers):
        for split, xs, ys in (("train", d.train_x, d.train_y), ("test", d.test_x, d.test_y)):
            mine = [r for r in rows[split] if r[0] == w]              # the split's order
            want = (torch.from_numpy(np.stack([r[1] for r in mine])[:, None]).float() - mean) / std
            assert torch.allclose(xs[c, :len(mine)], want, atol=1e-6), (w, split)
            assert ys[c, :len(mine)].tolist() == [r[2] for r in mine]
            assert xs[c, len(mine):].eq(0).all()
    raw = registry.get("hf").raw(cfg_of(tmp_path / "d"))
    assert raw.train_x.dtype == torch.uint8                           # images kept as stored
    assert not registry.get("hf").has_true_clusters(cfg_of(tmp_path / "d"))


def test_feature_vectors_shape_num_classes_and_dropped_clients(tmp_path):
    writers = dict(WRITERS, **{"w-c0": (2, 0), "w-c9": (0, 1)})       # in one split only: dropped
    rows = make_hf(tmp_path / "d", writers=writers, vectors=True)
    d = load_federated(cfg_of(tmp_path / "d", input_column="x", num_classes=5), 6, 0)
    assert d.train_x.shape == (6, 4, 6) and d.num_classes == 5
    train = np.stack([r[1].reshape(-1)[:6] / 255 for r in rows["train"] if r[0] in WRITERS]).astype(np.float32)
    mean = torch.tensor(train.astype(np.float64).mean(), dtype=torch.float32)
    std = torch.tensor(train.astype(np.float64).std(), dtype=torch.float32)
    first = np.stack([r[1].reshape(-1)[:6] / 255 for r in rows["train"] if r[0] == "w-a1"])
    assert torch.allclose(d.train_x[0, :2], (torch.from_numpy(first.astype(np.float32)) - mean) / std, atol=1e-6)
    d = load_federated(cfg_of(tmp_path / "d", input_column="x", shape=[2, 3], min_samples=4), 4, 0)
    assert d.train_x.shape == (4, 4, 2, 3) and d.train_counts.tolist() == [3, 4, 2, 3]    # a2 a3 b1 b2
    with pytest.raises(ConfigError) as e:
        check_data(cfg_of(tmp_path / "d", input_column="x", shape=[4]), 6)
    assert e.value.field == "data.options.shape" and "hold 6 values each" in str(e.value)


def test_the_note_says_which_clients_were_dropped(tmp_path, capsys):
    make_hf(tmp_path / "d", writers=dict(WRITERS, **{"w-c0": (2, 0), "w-c9": (0, 1)}))
    load_federated(cfg_of(tmp_path / "d"), 6, 0)
    err = capsys.readouterr().err
    assert "6 clients kept as the clients" in err
    assert "1 in the train split only" in err and "1 in the test split only" in err


@pytest.mark.parametrize("options, field, part", [
    ({"client_column": None}, "data.options", "needs data.options.client_column"),
    ({"client_column": "writer"}, "data.options.client_column", "no column 'writer'; its columns: writer_id"),
    ({"label_column": None}, "data.options.label_column", "no column 'label'"),
    ({"input_column": "pixels"}, "data.options.input_column", "no column 'pixels'"),
    ({"label": "character"}, "data.options", "takes no option 'label' (did you mean 'label_column'?)"),
    ({"min_samples": 100}, "data.options.min_samples", "the most any holds is 6"),
    ({"min_samples": 1.5}, "data.options.min_samples", "whole number >= 0"),
    ({"client_column": 3}, "data.options.client_column", "a column's name"),
])
def test_option_errors_name_the_key(tmp_path, options, field, part):
    make_hf(tmp_path / "d")
    cfg = cfg_of(tmp_path / "d", **options)
    cfg.options = {k: v for k, v in cfg.options.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        check_data(cfg, 6)
    assert e.value.field == field and part in str(e.value), str(e.value)


def test_path_and_layout_errors(tmp_path):
    for path, part in (("", "set data.path=DIR"), (tmp_path / "none", "no such folder")):
        with pytest.raises(ConfigError) as e:
            check_data(cfg_of(path), 6)
        assert e.value.field == "data.path" and part in str(e.value)
    one = datasets.Dataset.from_dict({"writer_id": ["a"], "x": [[1.0]], "label": [0]})
    one.save_to_disk(str(tmp_path / "one"))
    with pytest.raises(ConfigError, match="one Dataset"):
        check_data(cfg_of(tmp_path / "one"), 1)
    datasets.DatasetDict(train=one, validation=one).save_to_disk(str(tmp_path / "noTest"))
    with pytest.raises(DataError, match="no test split .its splits: train, validation."):
        check_data(cfg_of(tmp_path / "noTest"), 1)


DATA_ERRORS = [
    (dict(character=["a", "b", "a", "b"]), ["holds <U1 values, not integers", "class_encode_column('character')"]),
    (dict(character=[0, -1, 1, 0]), ["[1] is -1", "missing label -1"]),
    (dict(character=[0.5, 1.0, 1.0, 0.0]), ["[0] is 0.5"]),
    (dict(x=[[0.0, 1.0], [float("nan"), 1.0], [1.0, 1.0], [0.0, 0.0]]), ["row 1 holds NaN or inf"]),
    (dict(x=[[0.0, 1.0], [1.0], [1.0, 1.0], [0.0, 0.0]]), ["different shapes"]),
    (dict(x=["a", "b", "c", "d"]), ["holds <U1 values", "input_column"]),
]


@pytest.mark.parametrize("i", range(len(DATA_ERRORS)))
def test_bad_columns_name_data_path_and_the_fix(tmp_path, i):
    change, parts = DATA_ERRORS[i]
    base = {"writer_id": ["a", "b", "a", "b"], "character": [0, 1, 1, 0], "x": [[0.0, 1.0]] * 4}
    base.update(change)
    good = datasets.Dataset.from_dict({"writer_id": ["a", "b"], "character": [0, 1], "x": [[0.0, 1.0]] * 2})
    datasets.DatasetDict(train=datasets.Dataset.from_dict(base), test=good).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(DataError) as e:
        check_data(cfg_of(tmp_path / "d"), 2)
    msg = str(e.value)
    assert msg.startswith(f"data.path '{(tmp_path / 'd').resolve()}'") and "the train split" in msg, msg
    for part in parts:
        assert part in msg, (part, msg)


def test_no_client_in_both_splits(tmp_path):
    make_hf(tmp_path / "d", writers={"w-a1": (2, 0), "w-b1": (0, 2)})
    with pytest.raises(DataError) as e:
        check_data(cfg_of(tmp_path / "d"), 2)
    assert "no client is in both the train split (1 clients) and the test split (1)" in str(e.value)
    assert "train_test_split" in str(e.value)


def test_a_missing_datasets_library_names_the_extra(tmp_path, monkeypatch):
    make_hf(tmp_path / "d")
    monkeypatch.setitem(sys.modules, "datasets", None)                  # import datasets raises ImportError
    hf._cached.cache_clear()
    with pytest.raises(ConfigError) as e:
        check_data(cfg_of(tmp_path / "d"), 6)
    assert e.value.field == "data.name" and "pip install 'fedclust[hf]'" in str(e.value)


def test_a_short_run_in_process(tmp_path):
    from fedclust.runner import prepare, run

    make_hf(tmp_path / "d")
    cfg = load_config(None, SMALL + ["clients=6", "data.name=hf", f"data.path={tmp_path / 'd'}",
                                     "data.options={client_column: writer_id, label_column: character}",
                                     "algorithm.name=panm_loss", f"out={tmp_path / 'r'}"])
    summary = run(cfg, prepare(cfg))
    assert summary["data"] == "hf" and summary["data_clusters"] is None and summary["ari"] is None
    assert summary["neighbor_precision"] is None and summary["rounds_completed"] == 2
    assert summary["data_source"] == str((tmp_path / "d").resolve())
