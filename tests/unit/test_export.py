"""Models you can take away (issue 36, part 3): ``fedclust export``, ``fedclust.load_client_model`` and
``fedclust evaluate``, checked against the run's own checkpoint and records."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import fedclust
from fedclust.cli import main
from fedclust.config import load_config
from fedclust.errors import DataError
from fedclust.export import evaluate_run, export_run
from fedclust.runner import prepare, run

HERE = Path(__file__).resolve().parents[1]
SMALL = ["clients=8", "rounds=3", "data.train_size=40", "data.test_size=25", "progress=false", "figures=false"]


def small_run(out, *extra, config="configs/fmnist_rotation2.yaml"):
    cfg = load_config(config, SMALL + [f"out={out}", *extra])
    run(cfg, prepare(cfg))
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def newest_weights(out):
    return torch.load(sorted((out / "checkpoints").glob("round-*.pt"))[-1], weights_only=True)["weights"]


@pytest.mark.parametrize("extra", [("algorithm.name=panm_loss", "algorithm.l=3", "algorithm.k=2", "stage1_rounds=2"),
                                   ("algorithm.name=ifca", "ifca.restarts=1"),
                                   ("algorithm.name=dfca",)])
def test_export_holds_every_clients_model_and_evaluate_gives_the_runs_accuracies(tmp_path, extra):
    recs = small_run(tmp_path / "r", *extra)
    m = export_run(tmp_path / "r", tmp_path / "x")
    weights = newest_weights(tmp_path / "r")
    stacked = load_file(str(tmp_path / "x" / "models.safetensors"))
    assert m["round"] == 3 and m["clients"] == 8 and m["model"]["spec"] == "mlp"
    # each parameter stacked over clients, in the flat row's order: the rows back, number for number
    flat = torch.cat([stacked[t["name"]].reshape(8, -1) for t in m["model"]["tensors"]], dim=1)
    assert torch.equal(flat, weights)
    assert [c["true_cluster"] for c in m["client"]] == [0] * 4 + [1] * 4
    for c in (0, 5):
        module = fedclust.load_client_model(tmp_path / "x", c)
        assert not module.training
        assert torch.equal(torch.cat([p.detach().flatten() for p in module.parameters()]), weights[c])
        from_run = fedclust.load_client_model(tmp_path / "r", c)
        assert all(torch.equal(a, b) for a, b in zip(module.parameters(), from_run.parameters()))
    got = evaluate_run(tmp_path / "r")
    assert got["client_accuracy"] == recs[-1]["client_accuracy"]
    assert got["accuracy"] == pytest.approx(recs[-1]["accuracy"], abs=1e-9)
    if "algorithm.name=ifca" in extra:   # IFCA's cluster models, flat rows
        own = load_file(str(tmp_path / "x" / "method_models.safetensors"))
        assert list(own) == ["server.models"] and own["server.models"].shape[-1] == weights.shape[1]


def test_a_user_models_client_comes_back_as_its_own_class(tmp_path):
    small_run(tmp_path / "u", "algorithm.name=random", "algorithm.k=2",
              f"model={HERE / 'plugins' / 'user_models.py'}:TabularNet")
    export_run(tmp_path / "u", tmp_path / "ux", trust_code=True)   # the run names the model's file (tests/unit/test_trust.py)
    module = fedclust.load_client_model(tmp_path / "ux", 2, trust_code=True)
    assert type(module).__name__ == "TabularNet" and not module.training
    flat = torch.cat([p.detach().flatten() for p in module.parameters()])
    assert torch.equal(flat, newest_weights(tmp_path / "u")[2])
    with pytest.raises(fedclust.errors.OutputError, match="clients 0..7"):
        fedclust.load_client_model(tmp_path / "ux", 8, trust_code=True)


def natural(path, owners, seed=0):
    r = np.random.default_rng(seed)
    n = len(owners)
    arrays = {"x_train": r.normal(size=(n, 6)).astype(np.float32), "y_train": np.arange(n) % 3,
              "x_test": r.normal(size=(n, 6)).astype(np.float32), "y_test": (np.arange(n) + 1) % 3,
              "client_train": owners, "client_test": owners}
    np.savez(path, **arrays)
    return arrays


def test_evaluate_on_new_data_normalises_as_the_run_and_names_what_is_wrong(tmp_path, capsys):
    owners = np.repeat(np.arange(4), [5, 7, 6, 9])
    arrays = natural(tmp_path / "clients.npz", owners)
    small_run(tmp_path / "n", "data.name=npz", f"data.path={tmp_path / 'clients.npz'}", "clients=4",
              "algorithm.name=local", config=None)
    # the run's own test examples, given again as a file in another order: the same accuracies
    perm = np.random.default_rng(1).permutation(len(owners))
    np.savez(tmp_path / "again.npz", x_test=arrays["x_test"][perm], y_test=arrays["y_test"][perm],
             client_test=owners[perm])
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "n"), "--data", str(tmp_path / "again.npz"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["client_accuracy"] == evaluate_run(tmp_path / "n")["client_accuracy"]
    # every client needs an example, and the examples the model's shape
    np.savez(tmp_path / "missing.npz", x_test=arrays["x_test"][:5], y_test=arrays["y_test"][:5],
             client_test=owners[:5])
    with pytest.raises(DataError, match=r"clients \[1, 2, 3\] have no test example"):
        evaluate_run(tmp_path / "n", tmp_path / "missing.npz")
    np.savez(tmp_path / "shape.npz", x_test=np.zeros((4, 5), np.float32), y_test=np.zeros(4, int),
             client_test=np.arange(4))
    with pytest.raises(DataError, match=r"shape \[5\], the run's model takes \[6\]"):
        evaluate_run(tmp_path / "n", tmp_path / "shape.npz")


def test_export_of_a_directory_without_a_checkpoint_says_so(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["export", str(tmp_path / "empty"), str(tmp_path / "x")]) != 0
    assert "holds no checkpoint" in capsys.readouterr().err


def test_the_best_validation_models_are_kept_exported_and_score_the_recorded_accuracies(tmp_path):
    """With data.validation each client's model at its best-validation round is kept (through the checkpoint)
    and exported: on the run's test data it scores the record's test accuracy of that client at that round."""
    from fedclust.data import load_federated
    from fedclust.engine.train import evaluate
    from fedclust.export import read_run
    from fedclust.models import initial_weights, make_net

    recs = small_run(tmp_path / "v", "algorithm.name=random", "algorithm.k=2", "rounds=5", "data.validation=0.3",
                     "train.lr=0.5")
    m = export_run(tmp_path / "v", tmp_path / "vx")
    rounds = m["best_validation_rounds"]
    assert rounds == json.loads((tmp_path / "v" / "summary.json").read_text())["best_validation_rounds"]
    assert len(set(rounds)) > 1 or rounds[0] != 5          # some client's best is not the last round
    best = load_file(str(tmp_path / "vx" / "best_validation_models.safetensors"))
    flat = torch.cat([best[t["name"]].reshape(8, -1) for t in m["model"]["tensors"]], dim=1)
    cfg, _, _ = read_run(tmp_path / "v")
    fed = load_federated(cfg.data, 8, cfg.seed, list(range(8)), device=torch.device("cpu"))
    layout = initial_weights("mlp", (1, 28, 28), 10, cfg.seed)[0]
    acc, _ = evaluate(flat, layout, make_net("mlp", (1, 28, 28), 10)[0], fed.test_x, fed.test_y)
    by_round = {r["round"]: r["client_accuracy"] for r in recs}
    assert [round(100.0 * float(a), 2) for a in acc] == [by_round[rounds[c]][c] for c in range(8)]
    module = fedclust.load_client_model(tmp_path / "vx", 2, best=True)
    assert torch.equal(torch.cat([p.detach().flatten() for p in module.parameters()]), flat[2])
    with pytest.raises(fedclust.errors.OutputError, match="no best-validation models"):
        small_run(tmp_path / "plain", "algorithm.name=random", "algorithm.k=2")
        fedclust.load_client_model(tmp_path / "plain", 0, best=True)


def test_the_best_validation_models_survive_a_resume(tmp_path):
    """A run of 3 rounds extended to 5 keeps the same best-validation models as a run of 5 (through the
    checkpoint)."""
    extra = ("algorithm.name=random", "algorithm.k=2", "data.validation=0.3", "train.lr=0.5")
    small_run(tmp_path / "ext", *extra)
    small_run(tmp_path / "ext", *extra, "rounds=5")
    small_run(tmp_path / "whole", *extra, "rounds=5")
    got = [torch.load(sorted((tmp_path / d / "checkpoints").glob("round-*.pt"))[-1], weights_only=True)
           for d in ("ext", "whole")]
    assert got[0]["round"] == got[1]["round"] == 5
    assert torch.equal(got[0]["best_models"], got[1]["best_models"])
    assert torch.equal(got[0]["best_validation"], got[1]["best_validation"])
