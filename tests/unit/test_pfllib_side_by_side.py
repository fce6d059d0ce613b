"""The pure parts of experiments/pfllib_side_by_side.py (issue 47): the split written in PFLlib's layout and as
fedclust's file of clients holds the same images per client (read back from both), PFLlib's printout is parsed
into round times and accuracies, the stand-ins for PFLlib's missing imports, the CNN's shape, the table.  No
PFLlib checkout is needed."""

import importlib.util
import json

import numpy as np
import torch
from run_files import experiment

side = experiment("pfllib_side_by_side")


def _pool(n, seed):
    rs = np.random.RandomState(seed)
    return rs.randint(0, 256, (n, 1, 28, 28)).astype(np.uint8), rs.randint(0, 10, n).astype(np.int64)


def test_split_is_the_same_in_pfllib_files_and_fedclust_npz(tmp_path):
    (xtr, ytr), (xte, yte) = _pool(50, 0), _pool(20, 1)
    split = side.make_split(xtr, ytr, xte, yte, clients=3, n_train=8, n_test=4, seed=7)
    pfl = side.write_pfllib(tmp_path / "dataset" / "FMNIST_side_3", split)
    npz = side.write_fedclust(tmp_path / "split.npz", split)
    a, b = side.read_pfllib(pfl, 3), side.read_fedclust(npz)
    assert len(a) == len(b) == 3
    for ca, cb in zip(a, b):
        for u, v in zip(ca, cb):
            assert u.dtype == v.dtype and np.array_equal(u, v)
        assert ca[0].shape == (8, 1, 28, 28) and ca[0].dtype == np.float32 and ca[1].dtype == np.int64
        assert ca[2].shape == (4, 1, 28, 28)
    assert json.loads((pfl / "config.json").read_text())["num_clients"] == 3
    # no training image on two clients; standardised over the written training images
    xs = np.concatenate([c[0] for c in a]).reshape(24, -1)
    assert len({row.tobytes() for row in xs}) == 24
    assert abs(float(xs.mean())) < 1e-5 and abs(float(xs.std()) - 1) < 1e-5
    # seeded: the same images again, another seed others
    again = side.make_split(xtr, ytr, xte, yte, 3, 8, 4, seed=7)
    other = side.make_split(xtr, ytr, xte, yte, 3, 8, 4, seed=8)
    assert np.array_equal(again[1][0], split[1][0]) and not np.array_equal(other[1][0], split[1][0])
    f = np.load(npz)
    assert f["client_train"].tolist() == [0] * 8 + [1] * 8 + [2] * 8 and int(f["num_classes"]) == 10


def test_split_refuses_more_images_than_the_pool():
    (xtr, ytr), (xte, yte) = _pool(20, 0), _pool(20, 1)
    try:
        side.make_split(xtr, ytr, xte, yte, clients=3, n_train=8, n_test=4)
    except ValueError as exc:
        assert "exceed" in str(exc)
    else:
        raise AssertionError("no error")


LOG = """==================================================
dataset = FMNIST_side_4
==================================================

-------------Round number: 0-------------

Evaluate global model
Averaged Train Loss: 2.3025
Averaged Test Accuracy: 0.1000
Averaged Test AUC: 0.5000
Std Test Accuracy: 0.0100
------------------------- time cost ------------------------- 2.5

-------------Round number: 1-------------

Evaluate global model
Averaged Test Accuracy: 0.4125
------------------------- time cost ------------------------- 1.25

-------------Round number: 2-------------

Evaluate global model
Averaged Test Accuracy: 0.6000
------------------------- time cost ------------------------- 1.5e-1

Best accuracy.
0.6

Average time cost per round.
0.7
"""


def test_parse_pfllib_printout():
    got = side.parse_pfllib(LOG.splitlines(keepends=True))
    assert got["round_seconds"] == [2.5, 1.25, 0.15]
    assert got["accuracy"] == [0.1, 0.4125, 0.6]
    lines = LOG.splitlines()
    assert all("time cost" in lines[k] for k in got["cost_lines"]) and len(got["cost_lines"]) == 3
    assert side.timed_slice(got["round_seconds"], 1, 2) == [1.25, 0.15]
    assert side.timed_slice(got["round_seconds"], 2, 2) is None


def test_shims_only_for_missing_modules(tmp_path):
    side.write_shims(tmp_path, ["sklearn", "calmsize"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calmsize.py", "sklearn"]

    def load(rel):
        spec = importlib.util.spec_from_file_location(rel.replace("/", "_"), tmp_path / rel)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    y = np.array([0, 2, 1, 2])
    onehot = load("sklearn/preprocessing.py").label_binarize(y, classes=np.arange(3))
    assert onehot.tolist() == [[1, 0, 0], [0, 0, 1], [0, 1, 0], [0, 0, 1]]
    auc = load("sklearn/metrics.py").roc_auc_score
    assert auc(np.array([[1, 0], [0, 1]]), np.array([[0.9, 0.1], [0.2, 0.8]])) == 1.0
    # micro AUC by hand: positives scored 0.5 and 0.3, negatives 0.5 and 0.1: pairs won 1 + 0.5 (tie) + 1 + 0
    assert auc(np.array([[1, 0], [0, 1]]), np.array([[0.5, 0.5], [0.1, 0.3]])) == 0.625


def test_cnn_is_pfllibs_shape():
    torch.manual_seed(0)
    m = side.FedAvgCNN((1, 28, 28), 10)
    assert sum(p.numel() for p in m.parameters()) == 582_026   # 832 + 51,264 + 524,800 + 5,130
    assert [n for n, _ in m.named_parameters()] == ["conv1.0.weight", "conv1.0.bias", "conv2.0.weight",
                                                    "conv2.0.bias", "fc1.0.weight", "fc1.0.bias", "fc.weight",
                                                    "fc.bias"]
    assert m(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_speedups_and_table():
    rows = [{"system": "fedclust", "clients": 20, "seconds_per_round": 0.05, "rounds_timed": 10,
             "final_accuracy": 70.0, "returncode": 0},
            {"system": "pfllib", "clients": 20, "seconds_per_round": 2.0, "rounds_timed": 10, "final_accuracy": 70.5,
             "returncode": 0},
            {"system": "fedclust", "clients": 1000, "seconds_per_round": 1.0, "rounds_timed": 2,
             "final_accuracy": None, "returncode": 0, "scale": True}]
    record = {"rows": rows, "speedups": side.speedups(rows)}
    assert record["speedups"] == {"20": 40.0}
    text = side.table(record)
    assert "| 20 | fedclust | 0.05 (10) | 40x (goal 20x) | 70.00 |" in text
    assert "| 1,000 | fedclust (scale) | 1 (2) |" in text
