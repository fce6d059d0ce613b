"""Drift (``data.drift_round``, ``data.drift_rounds``, ``data.drift_fraction``; docs/algorithms.md "Drift"): the
moved clients and their new clusters against a plain draw, a moved client's rows against its pool examples under
the new transform, the same rows whichever process holds the client, Oracle's peers and the records' precision and
ARI against the current truth, the recovery measure on hand-made series, a run stopped after the drift round and
resumed equal to one never stopped, and every bad value refused naming its key.  A small fake Fashion-MNIST in a
temp folder, 8 clients, a few rounds."""

from __future__ import annotations

import gzip
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from fedclust import rng
from fedclust.algorithms.oracle import same_cluster_rows
from fedclust.config import load_config
from fedclust.data import cluster_of_clients, load_federated
from fedclust.data.base import StoredInputs
from fedclust.data.drift import moves, truths
from fedclust.dist import make_fabric
from fedclust.errors import ConfigError
from fedclust.export import evaluate_run
from fedclust.metrics import drift_recovery
from fedclust.runner import add_round_end_hook, build, client_data, prepare, run
from fedclust.tracking import round_payload

BASE = ["clients=8", "stage1_rounds=2", "algorithm.k=2", "algorithm.l=4", "progress=false", "figures=false",
        "data.train_size=10", "data.test_size=6", "data.download=false"]


def _idx(path: Path, arr: np.ndarray) -> None:
    data = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes()
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(data))


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """Four fake Fashion-MNIST IDX files (10 classes x 30 train / 20 test images)."""
    root = tmp_path_factory.mktemp("fake_fmnist_drift")
    for prefix, per_class, seed in (("train", 30, 1), ("t10k", 20, 2)):
        r = np.random.default_rng(seed)
        y = r.permutation(np.repeat(np.arange(10), per_class)).astype(np.uint8)
        _idx(root / f"{prefix}-images-idx3-ubyte", r.integers(0, 256, size=(len(y), 28, 28), dtype=np.uint8))
        _idx(root / f"{prefix}-labels-idx1-ubyte", y)
    return root


def _cfg(root: Path, *extra: str, rounds: int = 6):
    return load_config(None, BASE + [f"data.root={root}", f"rounds={rounds}", *extra])


# ---------------------------------------------------------------- the draw


def _plain_moves(seed, t, truth, K, share):
    """The rule written out client by client: in each cluster the ceil(share * size) clients of lowest key
    (ties: lower id) move, each to the j-th of the other clusters, j = floor(u * (K - 1))."""
    truth = [int(c) for c in truth]
    after = list(truth)
    for k in range(K):
        members = [c for c in range(len(truth)) if truth[c] == k]
        keys = {c: float(rng.uniform(seed, t, "drift_select", torch.tensor(c), 0)) for c in members}
        take = math.ceil(share * len(members) - 1e-9)
        for c in sorted(members, key=lambda c: (keys[c], c))[:take]:
            u = float(rng.uniform(seed, t, "drift_target", torch.tensor(c), 0))
            others = [j for j in range(K) if j != k]
            after[c] = others[int(u * (K - 1))]
    return after


@pytest.mark.parametrize("n,K,sizes,share,seed", [(8, 2, (), 0.25, 0), (13, 3, (), 0.3, 4),
                                                  (20, 4, (10, 6, 3, 1), 0.5, 1), (6, 2, (), 1.0, 2)])
def test_moves_and_targets_match_the_plain_rule(n, K, sizes, share, seed):
    truth = cluster_of_clients(n, K, sizes)
    moved, after = moves(seed, 7, truth, K, share)
    assert after.tolist() == _plain_moves(seed, 7, truth, K, share)
    assert torch.equal(moved, after != truth)                    # every move is real
    for k in range(K):                                           # stratified: ceil(share * size) of each cluster
        size = int((truth == k).sum())
        assert int(moved[truth == k].sum()) == math.ceil(share * size - 1e-9)
    # two events: the second draws from the clusters after the first
    both = truths(seed, truth, K, share, [3, 9])
    assert both[1].tolist() == _plain_moves(seed, 3, truth, K, share)
    assert both[2].tolist() == _plain_moves(seed, 9, both[1], K, share)


# ---------------------------------------------------------------- the rows


def _setup(cfg):
    return build(cfg, make_fabric("cpu"))


def _stored(x):
    return x.stored if isinstance(x, StoredInputs) else x


@pytest.mark.parametrize("kind", ["rotation", "label_swap"])
def test_a_moved_clients_rows_are_its_examples_under_the_new_transform(root, kind):
    cfg = _cfg(root, "algorithm.name=oracle", f"data.clusters={kind}", "data.drift_round=3",
               "data.drift_fraction=0.5")
    setup = _setup(cfg)
    d, drift = setup.data, setup.drift
    before = {k: _stored(getattr(d, k)).clone() for k in ("train_x", "train_y", "test_x", "test_y")}
    first = cluster_of_clients(8, 2)
    assert torch.equal(d.clusters, first) and setup.ctx.clusters is d.clusters
    drift.enter(2)                                               # before the event: nothing moves
    assert all(torch.equal(_stored(getattr(d, k)), v) for k, v in before.items())
    drift.enter(3)
    now = truths(cfg.seed, first, 2, 0.5, [3])[1]
    moved = now != first
    assert int(moved.sum()) == 4 and torch.equal(d.clusters, now)
    for k, old in before.items():
        new = _stored(getattr(d, k))
        assert torch.equal(new[~moved], old[~moved])             # the others keep their rows
        if kind == "rotation" and k.endswith("_x"):   # 0° <-> 180°: the same examples turned half a turn
            assert torch.equal(new[moved], torch.rot90(old[moved], 2, dims=(-2, -1)))
        elif kind == "label_swap" and k.endswith("_y"):   # the swap of 0<->1, 6<->7, either way
            table = torch.tensor([1, 0, 2, 3, 4, 5, 7, 6, 8, 9])
            assert torch.equal(new[moved], table[old[moved]])
        else:
            assert torch.equal(new[moved], old[moved])
    # the same rows as the pool's examples loaded directly under the new clusters
    direct = load_federated(cfg.data, 8, cfg.seed, list(range(8)), held=now)
    assert torch.equal(_stored(d.train_x), _stored(direct.train_x)) and torch.equal(d.test_y, direct.test_y)
    # Oracle's peers are drawn from the current truth
    rows = same_cluster_rows(setup.ctx)(0, 8)
    assert torch.equal(rows, now[:, None] == now[None, :])
    drift.enter(2)                                               # and back (a resume before the event)
    assert all(torch.equal(_stored(getattr(d, k)), v) for k, v in before.items())
    assert torch.equal(d.clusters, first)


def test_the_rows_do_not_depend_on_which_process_holds_a_client(root, monkeypatch):
    cfg = _cfg(root, "algorithm.name=local", "data.drift_rounds=[3,5]", "data.drift_fraction=0.5",
               "data.validation=0.2")
    whole = _setup(cfg)
    whole.drift.enter(5)
    for rank in (0, 1):   # the two halves of a 2-process run, built as a rank would
        fabric = make_fabric("cpu")
        monkeypatch.setattr(type(fabric), "global_rank", rank, raising=False)
        monkeypatch.setattr(type(fabric), "world_size", 2, raising=False)
        half = build(cfg, fabric)
        half.drift.enter(5)
        rows = slice(4 * rank, 4 * rank + 4)
        for k in ("train_x", "train_y", "test_x", "test_y", "val_x", "val_y"):
            assert torch.equal(_stored(getattr(half.data, k)), _stored(getattr(whole.data, k))[rows]), k
        assert torch.equal(half.data.clusters, whole.data.clusters)


# ---------------------------------------------------------------- the records


def test_recovery_on_hand_made_series():
    rounds = list(range(1, 21))
    acc = [50, 60, 70, 80, 80, 80, 82, 78, 80, 80] + [40, 60, 75, 80, 79.5, 81, 81, 81, 81, 81]
    got = drift_recovery(rounds, acc, 11)
    pre = (82 + 78 + 80 + 80 + 80) / 5                           # rounds 6..10
    assert got["pre_accuracy"] == pytest.approx(pre)
    assert got["recovery_rounds"] == 3 and got["recovered"]      # round 14: 80 >= 79 (round 13: 75 < 79)
    assert got["accuracy_after"] == pytest.approx(np.mean(acc[10:]))
    never = drift_recovery(rounds, acc[:10] + [40] * 10, 11)
    assert never["recovery_rounds"] is None and not never["recovered"]
    sparse = drift_recovery([2, 4, 12, 14], [70, 90, 89.5, 95], 10)   # none in [5, 10): the last before
    assert sparse["pre_accuracy"] == 90 and sparse["recovery_rounds"] == 2
    assert drift_recovery([12], [50], 10)["pre_accuracy"] is None


def _plain_ari(a, b) -> float:
    """Hubert and Arabie's adjusted Rand index from pair counts, written out."""
    n = len(a)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    same_a = [a[i] == a[j] for i, j in pairs]
    same_b = [b[i] == b[j] for i, j in pairs]
    both = sum(x and y for x, y in zip(same_a, same_b))
    expected = sum(same_a) * sum(same_b) / len(pairs)
    top = (sum(same_a) + sum(same_b)) / 2
    return 1.0 if top == expected else (both - expected) / (top - expected)


def _records(run_dir: Path) -> list[dict]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("round_seconds", None)
        out.append(r)
    return out


@pytest.mark.parametrize("name", ["oracle", "ifca"])
def test_precision_and_ari_are_against_the_current_truth(root, tmp_path, name):
    extra = ["ifca.clusters=2", "ifca.restarts=1"] if name == "ifca" else []
    cfg = _cfg(root, f"algorithm.name={name}", "data.drift_round=3", "data.drift_fraction=0.5",
               f"out={tmp_path / 'r'}", *extra, rounds=4)
    summary = run(cfg, prepare(cfg))
    saved = np.load(tmp_path / "r" / "neighbors.npz")
    now = saved["drift_clusters"][1]
    assert saved["drift_rounds"].tolist() == [3] and saved["drift_clusters"][0].tolist() == [0] * 4 + [1] * 4
    last = _records(tmp_path / "r")[-1]
    assert last["drift_epoch"] == 1 and _records(tmp_path / "r")[1]["drift_epoch"] == 0
    moved = now != saved["drift_clusters"][0]
    acc = np.array(last["client_accuracy"])
    assert last["drift_moved_accuracy"][0] == pytest.approx(acc[moved].mean(), abs=0.01)
    if name == "oracle":   # every listed neighbour in the client's current cluster, by hand
        lists = saved["final_lists"]
        by_hand = np.mean([np.mean([now[j] == now[i] for j in lists[i] if j >= 0]) for i in range(8)])
        assert last["neighbor_precision"] == pytest.approx(by_hand) == 1.0
        first = saved["drift_clusters"][0]
        assert np.mean([np.mean([first[j] == first[i] for j in lists[i] if j >= 0]) for i in range(8)]) < 1
    else:
        assignment = saved["assignment"]
        assert last["ari"] == pytest.approx(_plain_ari(now, assignment))
    event = summary["drift"][0]
    assert event["round"] == 3 and event["moved"] == 4
    assert set(event) == {"round", "moved", "pre_accuracy", "recovery_rounds", "recovered", "accuracy_after"}


def test_a_run_stopped_after_the_drift_round_resumes_to_the_same_records(root, tmp_path):
    args = ("algorithm.name=panm_grad", "data.drift_round=3", "data.drift_fraction=0.5", "checkpoint_every=1")
    whole = _cfg(root, *args, f"out={tmp_path / 'whole'}")
    run(whole, prepare(whole))

    class Killed(Exception):
        pass

    def kill(setup, state, run_dir):
        if state.round == 4:
            raise Killed

    cut = _cfg(root, *args, f"out={tmp_path / 'cut'}")
    remove = add_round_end_hook(kill)
    try:
        with pytest.raises(Killed):
            run(cut, prepare(cut))
    finally:
        remove()
    resumed = _cfg(root, *args, f"out={tmp_path / 'cut'}")
    summary = run(resumed, prepare(resumed))
    assert summary["starts"] == 2
    assert _records(tmp_path / "cut") == _records(tmp_path / "whole")
    a, b = (json.loads((tmp_path / d / "summary.json").read_text())["drift"] for d in ("cut", "whole"))
    assert a == b
    # fedclust evaluate tests the last checkpoint's models on the test data of its round: after the drift
    assert evaluate_run(tmp_path / "whole")["client_accuracy"] == _records(tmp_path / "whole")[-1]["client_accuracy"]


# ---------------------------------------------------------------- refused


@pytest.mark.parametrize("extra,key,part", [
    (["data.drift_round=7"], "data.drift_round", "[2, rounds = 6]"),
    (["data.drift_round=1"], "data.drift_round", "[2, rounds = 6]"),
    (["data.drift_round=-1"], "data.drift_round", "0 (no drift)"),
    (["data.drift_rounds=[4,3]"], "data.drift_rounds", "increasing"),
    (["data.drift_rounds=[3,9]"], "data.drift_rounds", "[2, rounds = 6]"),
    (["data.drift_round=3", "data.drift_rounds=[4]"], "data.drift_rounds", "data.drift_round=0"),
    (["data.drift_round=3", "data.drift_fraction=0"], "data.drift_fraction", "(0, 1]"),
    (["data.drift_round=3", "data.drift_fraction=1.5"], "data.drift_fraction", "(0, 1]"),
    (["data.drift_fraction=0.5"], "data.drift_fraction", "no effect"),
    (["data.drift_round=3", "data.num_clusters=1"], "data.drift_round", "data.num_clusters >= 2"),
    (["data.drift_round=3", "data.name=synthetic", "data.train_size=200", "data.test_size=100"],
     "data.drift_round", "has none"),
])
def test_bad_values_are_refused_naming_the_key_and_the_fix(root, extra, key, part):
    with pytest.raises(ConfigError) as e:
        _cfg(root, "algorithm.name=local", *extra)
    assert e.value.field == key and e.value.fix and part in str(e.value), str(e.value)


def test_a_file_of_own_clients_is_refused_with_the_reason(root, tmp_path):
    """A natural-clients npz (its clients and clusters its own, a `cluster` array too) has no transform to move a
    client to."""
    r = np.random.default_rng(0)
    owners = np.repeat(np.arange(8), 3)
    path = tmp_path / "clients.npz"
    np.savez(path, x_train=r.normal(size=(24, 3)).astype(np.float32), y_train=np.arange(24) % 3,
             x_test=r.normal(size=(24, 3)).astype(np.float32), y_test=np.arange(24) % 3, client_train=owners,
             client_test=owners, cluster=np.arange(8) % 2)
    load_config(None, BASE + ["rounds=6", "algorithm.name=local", "data.name=npz", f"data.path={path}"])
    with pytest.raises(ConfigError) as e:
        load_config(None, BASE + ["rounds=6", "algorithm.name=local", "data.name=npz", f"data.path={path}",
                                  "data.drift_round=3"])
    assert e.value.field == "data.drift_round" and "has none" in str(e.value) and "a pool" in e.value.fix


def test_each_events_moved_accuracy_goes_to_wandb_as_a_number():
    class FakeWandb:
        @staticmethod
        def Histogram(values):
            return ("histogram", tuple(values))

    payload = round_payload({"round": 4, "accuracy": 70.0, "client_accuracy": [60.0, 80.0], "drift_epoch": 1,
                             "drift_moved_accuracy": [55.5, 66.0]}, FakeWandb)
    assert payload["drift_moved_accuracy_1"] == 55.5 and payload["drift_moved_accuracy_2"] == 66.0
    assert payload["drift_epoch"] == 1 and "drift_moved_accuracy" not in payload


@pytest.mark.parametrize("skew", [["data.quantity_skew=0.7"], ["data.partition=dirichlet", "data.alpha=0.3",
                                                               "data.quantity_skew=0.7"]])
def test_clients_of_unequal_sizes_and_a_validation_split_move_whole(root, skew):
    """Clients of unequal sizes (their rows padded to the widest) and the validation split carved from them: after
    the event every row, padding and count equal the data loaded whole under the new clusters."""
    cfg = _cfg(root, "algorithm.name=local", "data.train_size=30", "data.validation=0.3", "data.drift_round=3",
               "data.drift_fraction=0.5", *skew)
    setup = _setup(cfg)
    setup.drift.enter(3)
    now = truths(cfg.seed, cluster_of_clients(8, 2), 2, 0.5, [3])[1]
    direct = client_data(cfg, setup.algo, torch.arange(8), torch.device("cpu"), None, held=now)
    assert setup.data.train_counts is not None                   # the sizes differ
    for k in ("train_x", "train_y", "test_x", "test_y", "val_x", "val_y", "train_counts", "val_counts"):
        assert torch.equal(_stored(getattr(setup.data, k)), _stored(getattr(direct, k))), k
