"""data.name=leaf: LEAF's train/ and test/ JSON files (FEMNIST's flat rows, CelebA's image file names) made in
tmp_path, read into npz's natural form: the arrays against values computed by hand, which users become clients,
the options, every error naming its key, and one short run in-process."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedclust.config import load_config
from fedclust.data import check_data, load_federated, registry
from fedclust.data.sets import leaf
from fedclust.errors import ConfigError, DataError
from fedclust.schema import DataConfig

SMALL = ["rounds=2", "stage1_rounds=1", "algorithm.k=1", "algorithm.l=2", "progress=false", "figures=false"]
# 6 users of 2 groups: a* hold inputs around +1 and labels 0/1, b* around -1 and labels 2/3; (train, test) counts
COUNTS = {"b2": (3, 1), "a1": (2, 1), "a3": (4, 2), "b1": (2, 2), "a2": (3, 1), "b3": (1, 1)}


def _user(rng, name, n):
    sign = 1.0 if name.startswith("a") else -1.0
    x = np.round(sign + 0.5 * rng.normal(size=(n, 4)), 3).tolist()
    y = [(0 if sign > 0 else 2) + (i % 2) for i in range(n)]
    return x, y


def make_leaf(root, counts=None, extra=None, files=(2, 1), seed=0):
    """LEAF's layout under ``root``: the users of ``counts`` ({user: (train, test)}) dealt over ``files`` JSON
    files a split in dict order, plus ``extra`` ({split: {user: (x, y)}}); returns {split: {user: (x, y)}}."""
    rng = np.random.default_rng(seed)
    data: dict = {"train": {}, "test": {}}
    for name, (ntr, nte) in (COUNTS if counts is None else counts).items():
        for split, n in (("train", ntr), ("test", nte)):
            data[split][name] = _user(rng, name, n)
    for split, users in (extra or {}).items():
        data[split].update(users)
    for split, nfiles in zip(("train", "test"), files):
        (root / split).mkdir(parents=True, exist_ok=True)
        objs = [{"users": [], "num_samples": [], "user_data": {}} for _ in range(nfiles)]
        for i, (name, (x, y)) in enumerate(data[split].items()):
            obj = objs[i % nfiles]
            obj["users"].append(name)
            obj["num_samples"].append(len(y))
            obj["user_data"][name] = {"x": x, "y": y}
        for j, obj in enumerate(objs):
            (root / split / f"all_data_{j}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(obj))
    return data


def cfg_of(root, **options) -> DataConfig:
    return DataConfig(name="leaf", path=str(root), options=dict(options))


def _normalizer(rows: np.ndarray):
    """x_train's one mean and std (flat inputs), as float32 numbers, applied as fedclust does."""
    flat = rows.astype(np.float64)
    mean = torch.tensor(flat.mean(), dtype=torch.float32)
    std = torch.tensor(flat.std(), dtype=torch.float32)
    return lambda x: (torch.from_numpy(np.asarray(x, dtype=np.float32)) - mean) / std


def test_the_users_become_clients_in_sorted_order_with_their_examples(tmp_path):
    data = make_leaf(tmp_path / "d")
    users = sorted(COUNTS)                                             # a1 a2 a3 b1 b2 b3
    d = load_federated(cfg_of(tmp_path / "d"), 6, 0)
    assert d.train_x.shape == (6, 4, 4) and d.test_x.shape == (6, 2, 4)
    assert d.train_counts.tolist() == [COUNTS[u][0] for u in users]
    assert d.test_counts.tolist() == [COUNTS[u][1] for u in users]
    assert d.clusters is None and d.num_classes == 4 and d.input_shape == (4,)
    assert d.source == str((tmp_path / "d").resolve())
    norm = _normalizer(np.concatenate([np.asarray(data["train"][u][0], np.float32) for u in users]))
    for c, u in enumerate(users):
        for split, xs, ys in (("train", d.train_x, d.train_y), ("test", d.test_x, d.test_y)):
            x, y = data[split][u]
            assert torch.allclose(xs[c, :len(y)], norm(x), atol=1e-6), (u, split)      # the file's order
            assert ys[c, :len(y)].tolist() == y
            assert xs[c, len(y):].eq(0).all() and ys[c, len(y):].eq(0).all()           # padding
    part = load_federated(cfg_of(tmp_path / "d"), 6, 0, client_ids=[4, 1])
    assert torch.equal(part.train_x, d.train_x[[4, 1]]) and part.train_counts.tolist() == [3, 3]
    ds = registry.get("leaf")
    assert ds.kind_of(cfg_of(tmp_path / "d")) == "client" and not ds.has_true_clusters(cfg_of(tmp_path / "d"))


def test_users_of_one_split_only_or_too_few_examples_are_dropped_and_said(tmp_path, capsys):
    rng = np.random.default_rng(1)
    extra = {"train": {"a9": _user(rng, "a9", 2), "b0": _user(rng, "b0", 0)},
             "test": {"b8": _user(rng, "b8", 1), "b0": _user(rng, "b0", 1)}}
    make_leaf(tmp_path / "d", extra=extra)
    d = load_federated(cfg_of(tmp_path / "d"), 6, 0)                   # a9, b8 (one split), b0 (no training example)
    assert d.train_counts.tolist() == [2, 3, 4, 2, 3, 1]
    err = capsys.readouterr().err
    assert "6 users kept as the clients" in err and "1 in train/ only" in err and "1 in test/ only" in err
    assert "1 without an example in each" in err
    d = load_federated(cfg_of(tmp_path / "d", min_samples=4), 4, 0)   # LEAF's -k: train + test >= 4
    assert d.train_counts.tolist() == [3, 4, 2, 3]                     # a2 a3 b1 b2; a1 (3) and b3 (2) dropped
    assert "2 with fewer than data.options.min_samples=4" in capsys.readouterr().err
    with pytest.raises(ConfigError) as e:
        check_data(cfg_of(tmp_path / "d", min_samples=7), 6)
    assert e.value.field == "data.options.min_samples" and "the most any holds is 6" in str(e.value)


def test_the_shape_option_and_the_class_count(tmp_path):
    make_leaf(tmp_path / "d")
    d = load_federated(cfg_of(tmp_path / "d", shape=[1, 2, 2]), 6, 0)
    flat = load_federated(cfg_of(tmp_path / "d"), 6, 0)
    assert d.train_x.shape == (6, 4, 1, 2, 2) and d.input_shape == (1, 2, 2)
    assert torch.allclose(d.train_x.reshape(flat.train_x.shape), flat.train_x)   # one channel: the same numbers
    with pytest.raises(ConfigError) as e:
        check_data(cfg_of(tmp_path / "d", shape=[1, 3, 3]), 6)
    assert e.value.field == "data.options.shape" and "hold 4 values each" in str(e.value)
    assert registry.get("leaf").num_classes(cfg_of(tmp_path / "d", num_classes=10)) == 10
    with pytest.raises(DataError, match="raise data.options.num_classes"):
        check_data(cfg_of(tmp_path / "d", num_classes=3), 6)


def test_labels_with_a_gap_need_num_classes(tmp_path):
    rng = np.random.default_rng(2)
    make_leaf(tmp_path / "d", counts={}, extra={s: {u: (_user(rng, "a", 2)[0], [0, 5]) for u in ("u", "v")}
                                                for s in ("train", "test")})
    with pytest.raises(DataError) as e:
        check_data(cfg_of(tmp_path / "d"), 2)
    assert "labels [1, 2, 3, 4] of 0..5 occur in neither" in str(e.value)
    assert "data.options.num_classes (an integer >= 6)" in str(e.value)
    check_data(cfg_of(tmp_path / "d", num_classes=6), 2)


def test_celeba_image_names_are_read_as_leaf_reads_them(tmp_path):
    from PIL import Image

    raw = tmp_path / "d" / "raw" / "img_align_celeba"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(3)
    names = [f"{i:06d}.jpg" for i in range(8)]
    for name in names:
        Image.fromarray(rng.integers(0, 256, (7, 5, 3), dtype=np.uint8)).save(raw / name.replace(".jpg", ".png"),
                                                                                format="PNG")
    names = [n.replace(".jpg", ".png") for n in names]
    extra = {"train": {"c1": (names[:3], [1.0, 0.0, 1.0]), "c0": (names[3:5], [0.0, 1.0])},
             "test": {"c1": (names[5:6], [0.0]), "c0": (names[6:], [1.0, 1.0])}}
    make_leaf(tmp_path / "d", counts={}, extra=extra)
    cfg = cfg_of(tmp_path / "d", image_size=4)
    raw_data = registry.get("leaf").raw(cfg)
    want = np.stack([np.asarray(Image.open(raw / n).resize((4, 4)).convert("RGB")).transpose(2, 0, 1)
                     for n in names[3:5] + names[:3]])                # c0's then c1's
    assert raw_data.train_x.dtype == torch.uint8 and torch.equal(raw_data.train_x, torch.from_numpy(want))
    assert raw_data.train_y.tolist() == [0, 1, 1, 0, 1]
    d = load_federated(cfg, 2, 0)
    assert d.train_x.shape == (2, 3, 3, 4, 4) and d.num_classes == 2 and d.train_counts.tolist() == [2, 3]
    with pytest.raises(ConfigError) as e:
        check_data(cfg_of(tmp_path / "d", images=str(tmp_path / "nowhere")), 2)
    assert e.value.field == "data.options.images" and "image file names" in str(e.value)


def test_the_config_check_names_clients_oracle_and_the_layout_keys(tmp_path):
    make_leaf(tmp_path / "d")
    base = SMALL + ["data.name=leaf", f"data.path={tmp_path / 'd'}"]
    with pytest.raises(ConfigError) as e:
        load_config(None, base + ["clients=5"])
    assert e.value.field == "clients" and "holds 6 clients" in str(e.value) and "set clients=6" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, base + ["clients=6", "algorithm.name=oracle"])
    assert e.value.field == "data.path" and "no true cluster" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, base + ["clients=6", "data.partition=dirichlet"])
    assert e.value.field == "data.partition" and "LEAF's users" in str(e.value)
    with pytest.raises(ConfigError) as e:   # another data set still refuses options, naming those that read them
        check_data(DataConfig(name="fmnist", options={"min_samples": 3}), 4)
    assert "leaf, torchvision:NAME read them" in str(e.value)


def _leaf_error(tmp_path, edit):
    root = tmp_path / "d"
    make_leaf(root)
    edit(root)
    return cfg_of(root)


def _rewrite(root, split, change):
    f = sorted((root / split).glob("*.json"))[0]
    obj = json.loads(f.read_text())
    change(obj)
    f.write_text(json.dumps(obj))


def _first(obj):
    return obj["user_data"][obj["users"][0]]


DATA_ERRORS = [
    (lambda r: (r / "test" / "bad.json").write_text("{not json"), ["cannot read test/bad.json as JSON"]),
    (lambda r: (r / "test" / "list.json").write_text("[1, 2]"), ["test/list.json is not a LEAF file", "'users'"]),
    (lambda r: _rewrite(r, "train", lambda o: _first(o)["y"].pop()), ["user 'b2' has 3 inputs (x) but 2 labels"]),
    (lambda r: _rewrite(r, "train", lambda o: o["num_samples"].__setitem__(0, 9)), ["num_samples says 9"]),
    (lambda r: _rewrite(r, "train", lambda o: o["user_data"].pop("b2")), ["user 'b2' has no 'x' and 'y' lists"]),
    (lambda r: _rewrite(r, "train", lambda o: _first(o)["y"].__setitem__(1, 0.5)), ["user 'b2''s y[1] is 0.5",
                                                                                     "whole numbers"]),
    (lambda r: _rewrite(r, "train", lambda o: _first(o)["y"].__setitem__(0, -1)), ["y[0] is -1"]),
    (lambda r: _rewrite(r, "train", lambda o: _first(o)["y"].__setitem__(0, "cat")), ["holds 'cat', not a number"]),
    (lambda r: _rewrite(r, "train", lambda o: _first(o)["x"][2].__setitem__(1, float("nan"))),
     ["user 'b2''s x[2] holds NaN or inf"]),
    (lambda r: _rewrite(r, "train", lambda o: _first(o)["x"][1].pop()), ["not a list of equally long rows"]),
    (lambda r: _rewrite(r, "test", lambda o: [row.pop() for u in o["user_data"].values() for row in u["x"]]),
     ["examples have shape [3]", "[4]"]),
    (lambda r: (r / "train" / "again.json").write_text(json.dumps(
        {"users": ["a1"], "num_samples": [1], "user_data": {"a1": {"x": [[0, 0, 0, 0]], "y": [0]}}})),
     ["user 'a1' is in both train/", "train/again.json"]),
    (lambda r: [f.rename(r / "test" / f.name.replace("all_data_", "x_")) for f in (r / "test").glob("*.json")]
     and _rewrite(r, "test", lambda o: o.update(users=[u + "_t" for u in o["users"]], user_data={
         u + "_t": v for u, v in o["user_data"].items()})),
     ["no user is in both train/ (6 users) and test/ (6)", "-t user", "-t sample"]),
]


@pytest.mark.parametrize("i", range(len(DATA_ERRORS)))
def test_bad_files_name_data_path_the_file_and_the_fix(tmp_path, i):
    edit, parts = DATA_ERRORS[i]
    cfg = _leaf_error(tmp_path, edit)
    with pytest.raises(DataError) as e:
        check_data(cfg, 6)
    msg = str(e.value)
    assert msg.startswith(f"data.path '{(tmp_path / 'd').resolve()}'"), msg
    for part in parts:
        assert part in msg, (part, msg)


def test_bad_paths_and_options_are_config_errors_before_anything_is_read(tmp_path, monkeypatch):
    make_leaf(tmp_path / "d")
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "train").mkdir()
    (tmp_path / "nojson" / "train").mkdir(parents=True)
    (tmp_path / "nojson" / "test").mkdir()
    (tmp_path / "nojson" / "train" / "a.json").write_text("{}")
    (tmp_path / "f.json").write_text("{}")
    for path, part in (("", "set data.path=DIR"), (tmp_path / "none", "no such folder"),
                       (tmp_path / "f.json", "a file, not a folder"), (tmp_path / "only", "has no test/ folder"),
                       (tmp_path / "nojson", "holds no .json file")):
        with pytest.raises(ConfigError) as e:
            check_data(cfg_of(path), 6)
        assert e.value.field == "data.path" and part in str(e.value), str(e.value)
        assert "preprocess.sh" in str(e.value) or "DIR" in str(e.value) or "folder" in str(e.value)
    monkeypatch.setattr(leaf, "_read_split", lambda *a: pytest.fail("read before the options were checked"))
    for options, field, part in (
            ({"min_sample": 3}, "data.options", "takes no option 'min_sample' (did you mean 'min_samples'?)"),
            ({"min_samples": -1}, "data.options.min_samples", "whole number >= 0"),
            ({"min_samples": True}, "data.options.min_samples", "whole number >= 0"),
            ({"shape": [1, 0, 4]}, "data.options.shape", "list of whole numbers >= 1"),
            ({"shape": "784"}, "data.options.shape", "[1,28,28]"),
            ({"num_classes": 1}, "data.options.num_classes", ">= 2"),
            ({"image_size": 0}, "data.options.image_size", ">= 1"),
            ({"images": 3}, "data.options.images", "a path")):
        with pytest.raises(ConfigError) as e:
            check_data(cfg_of(tmp_path / "d", **options), 6)
        assert e.value.field == field and part in str(e.value), (options, str(e.value))


def test_the_files_are_read_once_per_process(tmp_path, monkeypatch):
    make_leaf(tmp_path / "d")
    calls = []
    real = leaf._read_split
    monkeypatch.setattr(leaf, "_read_split", lambda *a: calls.append(a[1]) or real(*a))
    leaf._cached.cache_clear()
    cfg = load_config(None, SMALL + ["clients=6", "data.name=leaf", f"data.path={tmp_path / 'd'}"])
    load_federated(cfg.data, 6, 0)
    assert calls == ["train", "test"]
    _rewrite(tmp_path / "d", "test", lambda o: None)                    # a file written again: read again
    load_federated(cfg.data, 6, 0)
    assert len(calls) == 4


def test_a_short_run_in_process(tmp_path):
    from fedclust.runner import prepare, run

    make_leaf(tmp_path / "d")
    cfg = load_config(None, SMALL + ["clients=6", "data.name=leaf", f"data.path={tmp_path / 'd'}",
                                     "algorithm.name=panm_loss", "data.options.shape=[1,2,2]", f"out={tmp_path / 'r'}"])
    summary = run(cfg, prepare(cfg))
    assert summary["data"] == "leaf" and summary["data_clusters"] is None and summary["ari"] is None
    assert summary["neighbor_precision"] is None and summary["rounds_completed"] == 2   # no true clusters
    assert summary["data_source"] == str((tmp_path / "d").resolve())
    assert 0.0 <= summary["final_accuracy"] <= 100.0


def test_the_folder_is_hashed_file_by_file_and_a_resume_after_a_change_is_refused(tmp_path):
    import hashlib

    from fedclust.checkpoint import input_files
    from fedclust.models import file_sha256
    from fedclust.runner import prepare, run

    make_leaf(tmp_path / "d")
    args = SMALL + ["clients=6", "data.name=leaf", f"data.path={tmp_path / 'd'}", "algorithm.name=local",
                    "checkpoint_every=1", f"out={tmp_path / 'r'}"]
    cfg = load_config(None, args)
    files = sorted(p for p in (tmp_path / "d").rglob("*") if p.is_file())
    by_hand = hashlib.sha256("".join(f"{p.relative_to(tmp_path / 'd').as_posix()}\0{file_sha256(str(p))}\n"
                                     for p in files).encode()).hexdigest()
    got = input_files(cfg)["data.path"]
    assert got["sha256"] == by_hand and got["folder"] is True and len(files) == 3
    run(cfg, prepare(cfg))
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["data_sha256"] == by_hand
    _rewrite(tmp_path / "d", "test", lambda o: _first(o)["x"][0].__setitem__(0, 9.0))   # one value under it
    cfg = load_config(None, [a.replace("rounds=2", "rounds=3") for a in args])
    with pytest.raises(ConfigError, match="the folder .* changed"):
        run(cfg, prepare(cfg))
