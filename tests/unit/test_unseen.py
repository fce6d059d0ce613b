"""``fedclust evaluate RUN --data FILE --unseen`` (FLUX's unseen-client protocol, issue 48 part 2): each new client
takes the candidate model of lowest loss on the first half of its examples and is scored on the rest.  The
candidates are read here from the checkpoint by hand (IFCA's cluster models, DFCA's banks, Facade's core with each
head, a peer method's client models), every loss and accuracy computed by a plain loop over one ``nn.Module``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedclust import checkpoint
from fedclust.cli import main
from fedclust.config import load_config
from fedclust.data import dataset
from fedclust.errors import DataError
from fedclust.export import evaluate_unseen
from fedclust.models import build_model
from fedclust.runmodel import run_model
from fedclust.runner import prepare, run

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS / "golden")]
from record import GOLDEN_OVERRIDES  # noqa: E402
from run_files import image_pool  # noqa: E402


@pytest.fixture(scope="module")
def pool(tmp_path_factory) -> Path:
    return Path(image_pool(tmp_path_factory.mktemp("unseen") / "pool.npz"))


def _run(pool: Path, out: Path, name: str, *extra: str):
    cfg = load_config(None, [*GOLDEN_OVERRIDES, f"algorithm.name={name}", "rounds=4", "data.name=npz",
                             f"data.path={pool}", "data.clusters=rotation", "data.num_clusters=2", "model=mlp",
                             f"out={out}", *extra])
    run(cfg, prepare(cfg))
    return cfg


def _new_clients(pool: Path, path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Five new clients (ids 3, 40, 41, 1000, 7) of 5 to 12 test images each, the even ones turned 180°."""
    arrays = np.load(pool)
    r = np.random.default_rng(1)
    ids, sizes = [3, 40, 41, 1000, 7], [5, 12, 6, 9, 8]
    owner = np.concatenate([np.full(s, c) for c, s in zip(ids, sizes)])
    pick = r.choice(len(arrays["y_test"]), len(owner), replace=False)
    x, y = arrays["x_test"][pick].copy(), arrays["y_test"][pick]
    turn = np.isin(owner, [3, 40, 1000])
    x[turn] = np.rot90(x[turn], 2, axes=(2, 3))
    order = r.permutation(len(owner))   # the clients' examples interleaved: each keeps its own order
    x, y, owner = x[order], y[order], owner[order]
    np.savez(path, x_test=x, y_test=y, client_test=owner)
    return x, y, owner


def _candidates(name: str, cfg, out: Path) -> torch.Tensor:
    """The models a new client may take, by hand from the checkpoint."""
    payload = checkpoint.newest(out)[1]
    weights, saved = payload["weights"].float(), payload["algorithm"]
    if name == "ifca":
        return saved["server"]["models"].float()
    if name == "dfca":
        bank = saved["clients"]["bank"].float()
        return bank.reshape(-1, bank.shape[-1])
    if name == "facade":   # the head is the last layer (fc weight and bias, in the module's order)
        heads = saved["clients"]["heads"].float()
        module = build_model("mlp", (1, 10, 10), 4)
        last = list(module.named_parameters())[-2:]
        width = sum(p.numel() for _, p in last)
        rows = []
        for i in range(weights.shape[0]):
            for j in range(heads.shape[1]):
                row = weights[i].clone()
                row[-width:] = heads[i, j]
                rows.append(row)
        return torch.stack(rows)
    return weights


def _loss_and_accuracy(row: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    module = build_model("mlp", (1, 10, 10), 4)
    torch.nn.utils.vector_to_parameters(row, module.parameters())
    with torch.no_grad():
        logits = module(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).double().mean())


@pytest.mark.parametrize("name,extra", [("ifca", ["ifca.restarts=1"]), ("dfca", []), ("facade", []),
                                        ("panm_loss", [])])
def test_each_new_client_takes_the_candidate_of_lowest_loss_on_its_first_half(pool, tmp_path, name, extra):
    out = tmp_path / "r"
    cfg = _run(pool, out, name, *extra)
    x, y, owner = _new_clients(pool, tmp_path / "new.npz")
    got = evaluate_unseen(out, tmp_path / "new.npz")
    models = _candidates(name, cfg, out)
    ds = dataset(cfg.data)
    assert got["clients"] == [3, 7, 40, 41, 1000] and got["candidates"] == len(models)
    for c, client in enumerate(got["clients"]):   # a plain loop: each client, each candidate
        mine = np.nonzero(owner == client)[0]     # its examples in the file's order
        xc = ds.normalize(cfg.data, torch.from_numpy(x[mine]))
        yc = torch.from_numpy(y[mine]).long()
        h = len(mine) // 2
        losses = [_loss_and_accuracy(m, xc[:h], yc[:h])[0] for m in models]
        best = min(range(len(losses)), key=lambda j: (losses[j], j))
        assert got["choice"][c] == best or losses[got["choice"][c]] == pytest.approx(losses[best], rel=1e-5)
        accuracy = _loss_and_accuracy(models[got["choice"][c]], xc[h:], yc[h:])[1]
        assert got["client_accuracy"][c] == pytest.approx(100 * accuracy, abs=0.01)
    assert got["accuracy"] == pytest.approx(np.mean(got["client_accuracy"]), abs=0.01)


def test_the_cli_prints_the_choice_and_refuses_unseen_without_data(pool, tmp_path, capsys):
    out = tmp_path / "r"
    _run(pool, out, "ifca", "ifca.restarts=1")
    _new_clients(pool, tmp_path / "new.npz")
    capsys.readouterr()   # the run's own lines
    assert main(["evaluate", str(out), "--data", str(tmp_path / "new.npz"), "--unseen", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    # the rotated clients (3, 40, 1000) take one cluster model, the others the other
    assert printed["choice"][0] == printed["choice"][2] == printed["choice"][4] != printed["choice"][1]
    assert printed["clients"] == [3, 7, 40, 41, 1000] and printed["candidates"] == 2
    assert len(printed["choice"]) == 5 and all(c in (0, 1) for c in printed["choice"])
    assert main(["evaluate", str(out), "--unseen"]) == 2
    assert "--data FILE" in capsys.readouterr().err


def test_a_client_of_one_example_is_refused(pool, tmp_path):
    out = tmp_path / "r"
    _run(pool, out, "random")
    np.savez(tmp_path / "one.npz", x_test=np.zeros((3, 1, 10, 10), np.uint8), y_test=np.array([0, 1, 2]),
             client_test=np.array([5, 5, 9]))
    with pytest.raises(DataError, match=r"clients \[9\] hold fewer than 2 examples"):
        evaluate_unseen(out, tmp_path / "one.npz")


def test_the_default_candidates_are_the_client_models(pool, tmp_path):
    out = tmp_path / "r"
    cfg = _run(pool, out, "random")
    _new_clients(pool, tmp_path / "new.npz")
    assert evaluate_unseen(out, tmp_path / "new.npz")["candidates"] == cfg.clients
    assert run_model(cfg).layout.numel == checkpoint.newest(out)[1]["weights"].shape[1]
