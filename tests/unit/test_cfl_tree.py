"""CFL's tree of cluster models (the reference code's server.cache_model) and
its best-of-lineage evaluation on a validation split carved from each
client's training examples: hand-computed values, and a resumed run that
ends exactly as an uninterrupted one."""

import json
import sys
from pathlib import Path

import pytest
import torch

from fedclust.algorithms import cfl
from fedclust.algorithms.base import Context, RoundView
from fedclust.config import load_config
from fedclust.data.base import FederatedData, StoredInputs
from fedclust.data.validation import carve_masks, carve_validation, check_share, train_part
from fedclust.errors import ConfigError
from fedclust.runner import prepare, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from record import GOLDEN_OVERRIDES, WALL_TIME_KEYS  # noqa: E402


def ctx_of(n, P, client_ids=None):
    ids = torch.arange(n) if client_ids is None else client_ids
    return Context(n=n, client_ids=ids, clusters=torch.zeros(n, dtype=torch.int64), seed=3, stage1_rounds=0,
                   w0=torch.zeros(P), device=torch.device("cpu"))


# ----------------------------------------------------------------------------
# The tree


def test_lineage_by_hand():
    # round 21: 0 -> {0, 1}; round 25: 0 -> {0, 2}; round 30: 1 -> {1, 3}
    splits = [(21, 0, 1), (25, 0, 2), (30, 1, 3)]
    assert cfl.lineage(splits, 4).tolist() == [
        [True, True, False],     # cluster 0: in the root at 21 and in 0 at 25
        [True, False, True],     # cluster 1: the root at 21, then itself at 30
        [True, True, False],     # cluster 2: born of 0 at 25
        [True, False, True],     # cluster 3: born of 1 at 30
    ]
    assert cfl.lineage([], 1).shape == (1, 0)
    with pytest.raises(ValueError, match="outside"):
        cfl.lineage([(3, 0, 2)], 2)


def _round(algo, state, ctx, t, updates):
    """Round t with every client's update ``updates [n, P]`` from its cluster's model."""
    before = state.models[state.labels]
    after = before + updates
    return algo.aggregate(state, ctx, RoundView(round=t, before=before, after=after, all_after=after,
                                                all_labels=state.labels))


def test_a_split_caches_the_parent_and_lineages_follow():
    """Round 2 splits {0..5} into {0,1,2} | {3,4,5} (updates ±2·e0); round 3
    splits cluster 0 = {0,1,2} into {0,1} | {2} (updates 2·e1, 2·e1, −4·e1).
    The cache holds each parent's model as it was sent in its split's round;
    each client's lineage lists its ancestors' cached models."""
    n, P = 6, 3
    ctx = ctx_of(n, P)
    algo = cfl.Cfl(cfl.CflConfig(eps1=0.4, eps2=1.6, gamma_max=0.0, warmup=1, scale_to_model=False))
    state = algo.init(ctx)
    assert state.cache.shape == (0, P)
    e0, e1 = torch.eye(P)[0], torch.eye(P)[1]
    first = torch.stack([e0 * 0.5] * n)                      # round 1 (warm-up): everyone moves by e0/2
    state, _ = _round(algo, state, ctx, 1, first)
    root = state.models[0].clone()
    assert torch.allclose(root, e0 * 0.5) and state.cache.shape == (0, P)
    second = torch.stack([2 * e0, 2 * e0, 2 * e0 + 0.1 * e1, -2 * e0, -2 * e0, -2 * e0 - 0.1 * e1])
    state, res = _round(algo, state, ctx, 2, second)         # mean norm ~0, max 2 > 1.6: split
    assert state.splits == [(2, 0, 1)]
    assert torch.equal(state.cache, root[None])              # the parent as it was sent in round 2
    assert res.assignment.tolist() == [0, 0, 0, 1, 1, 1]
    assert torch.allclose(state.models[0], root + second[:3].mean(0))
    half = state.models[0].clone()
    third = torch.zeros(n, P)
    third[:3] = torch.stack([2 * e1, 2 * e1, -4 * e1])        # cluster 0: mean 0, max 4; cluster 1: still
    state, res = _round(algo, state, ctx, 3, third)
    assert state.splits == [(2, 0, 1), (3, 0, 2)]
    assert torch.equal(state.cache, torch.stack([root, half]))
    assert res.assignment.tolist() == [0, 0, 2, 1, 1, 1]
    tree = cfl.lineage(state.splits, state.models.shape[0])[res.assignment]
    assert tree.tolist() == [[True, True], [True, True], [True, True],      # 0, 1, 2: root, then cluster 0
                             [True, False], [True, False], [True, False]]   # 3, 4, 5: root only
    # the tree is replicated server state: saved once, restored exactly
    saved = algo.state_dict(state)
    assert "cache" in saved["server"]
    again = algo.load_state_dict(ctx, {"clients": saved["clients"],
                                       "server": {k: (v.clone() if torch.is_tensor(v) else v)
                                                  for k, v in saved["server"].items()}})
    assert torch.equal(again.cache, state.cache) and again.splits == state.splits


def test_best_of_lineage_by_hand():
    acc = torch.tensor([[0.50, 0.75, 0.70],      # client 0: the middle model is best
                        [0.80, 0.80, 0.80],      # client 1: a tie on accuracy: the lowest loss (column 1)
                        [0.90, 0.60, 0.60],      # client 2: column 0 is best but not in its lineage
                        [0.60, 0.60, 0.60]])     # client 3: ties everywhere: its own model (last column)
    loss = torch.tensor([[1.0, 0.9, 0.8],
                         [0.7, 0.5, 0.6],
                         [0.1, 0.9, 0.4],
                         [0.5, 0.5, 0.5]])
    allowed = torch.tensor([[True, True, True], [True, True, True], [False, True, True], [True, True, True]])
    assert cfl.best_of_lineage(acc, loss, allowed).tolist() == [1, 1, 2, 2]
    with pytest.raises(ValueError, match="at least one"):
        cfl.best_of_lineage(acc, loss, torch.zeros(4, 3, dtype=torch.bool))


def test_extra_accuracy_takes_the_best_lineage_model_by_hand():
    """P = 1 models and a stand-in score: a model's accuracy on client c's
    data is 1 − |w − target_c| (validation target and test target differ),
    its loss |w − target_c|.  Cache: the root 0.0 (split 0 → {0, 1}), then
    cluster 0 at 1.0 (split 0 → {0, 2}); the clusters now hold 2.0, 3.0, 4.0."""
    n = 4
    ctx = ctx_of(n, 1)
    state = cfl.CflState(models=torch.tensor([[2.0], [3.0], [4.0]]), labels=torch.tensor([0, 1, 2, 2]),
                         pending=torch.full((n,), -1), reference_norm=1.0, splits=[(5, 0, 1), (7, 0, 2)],
                         cache=torch.tensor([[0.0], [1.0]]))
    val_target = torch.tensor([0.9, 0.1, 3.8, 0.1])   # client 1 (lineage: root) picks the root; 2 its own; 3 root
    test_target = torch.tensor([0.7, 0.4, 4.0, 0.0])
    data = FederatedData(train_x=torch.zeros(n, 1, 1), train_y=torch.zeros(n, 1, dtype=torch.int64),
                         test_x=test_target[:, None, None], test_y=torch.zeros(n, 1, dtype=torch.int64),
                         clusters=None, client_ids=torch.arange(n), input_shape=(1,), num_classes=2,
                         val_x=val_target[:, None, None], val_y=torch.zeros(n, 1, dtype=torch.int64))

    def score(models, x, y, counts=None):
        d = (models[:, 0] - x[:, 0, 0]).abs()
        return 1 - d, d

    models = state.models[state.labels]
    own_acc = score(models, data.test_x, data.test_y)[0]
    got = cfl.Cfl(cfl.CflConfig()).extra_accuracy(state, ctx, data, models, own_acc, score)
    # client 0: lineage root 0.0, cluster-0 cache 1.0, own 2.0 -> 1.0 (val 0.9); test 1 - |1.0 - 0.7| = 0.7
    # client 1: root 0.0, own 3.0 -> root; test 1 - 0.4 = 0.6
    # client 2: root, 1.0, own 4.0 -> own (val 3.8); test 1 - 0 = 1
    # client 3: root (val 0.1 -> 0.9), 1.0, own 4.0 -> root; test 1 - 0 = 1
    assert got[cfl.BEST_OF_LINEAGE].tolist() == pytest.approx([0.7, 0.6, 1.0, 1.0])
    # no validation split: nothing (the record's key is null)
    assert cfl.Cfl(cfl.CflConfig()).extra_accuracy(state, ctx, FederatedData(
        **{**data.__dict__, "val_x": None, "val_y": None}), models, own_acc, score) == {}


# ----------------------------------------------------------------------------
# The validation split


def test_train_part_as_the_reference_code():
    # int(len(data) * train_frac) with train_frac = 0.8
    assert train_part(torch.tensor([200, 40, 7, 5, 2, 1]), 0.2).tolist() == [160, 32, 5, 4, 1, 0]
    assert train_part(200, 0.0).item() == 200
    assert train_part(10, 0.3).item() == 7          # 10 * 0.7 = 6.999...: still 7


@pytest.mark.parametrize("share,sizes", [(1.0, 10), (-0.1, 10), (float("nan"), 10), (0.2, 1), (0.5, [4, 1])])
def test_check_share_refuses(share, sizes):
    with pytest.raises(ConfigError, match="cfl.validation"):
        check_share(share, sizes, "cfl.validation")


def test_validation_key_is_checked_with_the_config():
    for bad in ("1.0", "-0.2"):
        with pytest.raises(ConfigError, match="cfl.validation"):
            load_config(None, ["algorithm.name=cfl", f"cfl.validation={bad}"])
    with pytest.raises(ConfigError, match="cfl.validation"):
        load_config(None, ["algorithm.name=cfl", "data.train_size=1"])     # 0 left to train on
    assert load_config(None, ["algorithm.name=cfl"]).cfl.validation == cfl.DEFAULT_VALIDATION == 0.2
    assert load_config(None, ["algorithm.name=cfl", "data.train_size=1", "cfl.validation=0"]).cfl.validation == 0


def _data(n=5, m=10, counts=None, stored=False):
    x = torch.arange(n * m, dtype=torch.float32).reshape(n, m, 1) + 1     # example (c, i) is c*m + i + 1
    y = torch.arange(n * m).reshape(n, m) % 7
    if counts is not None:
        pad = torch.arange(m)[None, :] >= counts[:, None]
        x, y = x.masked_fill(pad[..., None], 0), y.masked_fill(pad, 0)
    if stored:
        x = StoredInputs(x.to(torch.uint8), lambda v: v.to(torch.float32) * 2)
    return FederatedData(train_x=x, train_y=y, test_x=torch.zeros(n, 3, 1), test_y=torch.zeros(n, 3, dtype=torch.int64),
                         clusters=None, client_ids=torch.arange(n), input_shape=(1,), num_classes=7,
                         train_counts=counts)


def _examples(x, count):
    return set(x[:count, 0].tolist())


def test_carve_sizes_disjoint_and_every_example_once():
    data = _data()
    got = carve_validation(data, 0.2, seed=4)
    assert got.train_x.shape == (5, 8, 1) and got.val_x.shape == (5, 2, 1)
    assert got.train_counts is None and got.val_counts is None
    for c in range(5):
        tr, va = _examples(got.train_x[c], 8), _examples(got.val_x[c], 2)
        assert not tr & va and tr | va == _examples(data.train_x[c], 10)
        assert got.train_x[c, :, 0].tolist() == sorted(tr)                  # kept in their order
        assert torch.equal(got.train_y[c], (got.train_x[c, :, 0].long() - 1) % 7)   # labels travel with images
    assert carve_validation(data, 0.0, seed=4) is data
    # the reference's numbers: 200 -> 160 + 40
    big = carve_validation(_data(n=2, m=200), 0.2, seed=0)
    assert big.train_x.shape[1] == 160 and big.val_x.shape[1] == 40


def test_carve_depends_only_on_seed_and_client():
    a = carve_validation(_data(), 0.2, seed=4)
    b = carve_validation(_data(), 0.2, seed=4)
    assert torch.equal(a.val_x, b.val_x)
    # clients 2..4 held alone (another rank's shard): the same split as within all five
    part = _data()
    part = FederatedData(**{**part.__dict__, "train_x": part.train_x[2:], "train_y": part.train_y[2:],
                            "client_ids": torch.arange(2, 5), "test_x": part.test_x[2:], "test_y": part.test_y[2:]})
    assert torch.equal(carve_validation(part, 0.2, seed=4).val_x, a.val_x[2:])
    other = carve_validation(_data(), 0.2, seed=5)
    assert not torch.equal(other.val_x, a.val_x)
    train, val = carve_masks(4, torch.arange(5), 10, None, 0.2)
    assert (train.sum(1) == 8).all() and (val.sum(1) == 2).all() and not (train & val).any()
    # clients differ: not the same positions for all
    assert len({tuple(r.nonzero().flatten().tolist()) for r in val}) > 1


def test_carve_clients_of_their_own_sizes_and_stored_images():
    counts = torch.tensor([10, 7, 5, 2, 10])
    got = carve_validation(_data(counts=counts, stored=True), 0.2, seed=1)
    assert isinstance(got.train_x, StoredInputs) and isinstance(got.val_x, StoredInputs)
    keep = train_part(counts, 0.2)                                            # 8, 5, 4, 1, 8
    assert got.train_counts.tolist() == keep.tolist() and got.val_counts.tolist() == (counts - keep).tolist()
    assert got.train_x.shape[1] == 10                                         # the file's width, on every rank
    assert got.val_x.shape[1] == int((counts - keep).max())
    raw = _data(counts=counts)
    for c in range(5):
        tr = _examples(got.train_x.stored[c].float(), int(keep[c]))
        va = _examples(got.val_x.stored[c].float(), int(counts[c] - keep[c]))
        assert not tr & va and tr | va == _examples(raw.train_x[c], int(counts[c]))
        assert (got.train_x.stored[c, int(keep[c]):] == 0).all() and (got.train_y[c, int(keep[c]):] == 0).all()
    assert torch.equal(got.train_x[0], got.train_x.stored[0].float() * 2)   # still normalised when read
    with pytest.raises(ConfigError, match="cfl.validation"):
        carve_validation(_data(counts=torch.tensor([10, 1, 5, 2, 10])), 0.2, seed=1, field="cfl.validation")


# ----------------------------------------------------------------------------
# Whole runs (small: 12 Synthetic clients, 8 rounds, splits in rounds 3 and 4)

TREE = ["algorithm.name=cfl", "cfl.eps1=1.5", "clients=12"]


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _run(out, *extra):
    cfg = load_config(None, GOLDEN_OVERRIDES + TREE + [f"out={out}", *extra])
    return run(cfg, prepare(cfg))


def _records(out):
    lines = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((Path(out) / "summary.json").read_text())
    strip = lambda r: {k: v for k, v in r.items() if k not in WALL_TIME_KEYS}   # noqa: E731
    return [strip(r) for r in lines], strip(summary)


