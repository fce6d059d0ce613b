"""Exports that travel (issue 44, part 5): a user model's export loads in another directory with its file gone,
the manifest gives each cluster's transform, the run's total rounds and whether it had finished; evaluate --data
warns when the inputs' range is not the run's; evaluate --best scores the best-validation models."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import fedclust
from fedclust.cli import main
from fedclust.config import load_config
from fedclust.data.partition import label_tables
from fedclust.export import evaluate_run, export_run
from fedclust.runner import prepare, run

SMALL = ["clients=8", "rounds=3", "data.train_size=40", "data.test_size=25", "progress=false", "figures=false",
         "algorithm.name=random", "algorithm.k=2"]
MODEL = '''import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.fc = nn.Linear(784, 16)
        self.out = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.out(torch.relu(self.fc(torch.flatten(x, 1))))
'''


def small_run(out, *extra) -> list[dict]:
    cfg = load_config("configs/fmnist_rotation2.yaml", SMALL + [f"out={out}", *extra])
    run(cfg, prepare(cfg))
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_user_models_export_loads_anywhere(tmp_path, monkeypatch):
    model = tmp_path / "mine" / "net.py"
    model.parent.mkdir()
    model.write_text(MODEL)
    small_run(tmp_path / "r", f"model={model}:Net")
    m = export_run(tmp_path / "r", tmp_path / "x", trust_code=True)
    assert m["files"]["model_source"] == "model_source.py" and "model_source.py" in m["sha256"]
    want = fedclust.load_client_model(tmp_path / "x", 3, trust_code=True)
    model.unlink()                                   # the model's file is gone, and we are elsewhere
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    got = fedclust.load_client_model(tmp_path / "x", 3, trust_code=True)
    assert type(got).__name__ == "Net"
    assert all(torch.equal(a, b) for a, b in zip(got.parameters(), want.parameters()))
    with pytest.raises(fedclust.trust.UntrustedCode, match="model_source.py"):   # still only with trust
        fedclust.load_client_model(tmp_path / "x", 3)


def test_the_manifest_gives_each_clusters_transform_and_the_runs_progress(tmp_path):
    small_run(tmp_path / "rot")
    m = export_run(tmp_path / "rot", tmp_path / "rx")
    assert m["data"]["transforms"] == [{"cluster": 0, "rotation_degrees": 0.0}, {"cluster": 1, "rotation_degrees": 180.0}]
    assert (m["round"], m["total_rounds"], m["complete"]) == (3, 3, True)
    small_run(tmp_path / "swap", "data.clusters=label_swap", "data.num_clusters=4", "rounds=4", "checkpoint_every=1")
    (tmp_path / "swap" / "checkpoints" / "round-000004.pt").unlink()   # as exported while round 4 still ran
    m = export_run(tmp_path / "swap", tmp_path / "sx")
    table = label_tables(4, 10)
    assert m["data"]["transforms"] == [{"cluster": c, "labels": table[c].tolist()} for c in range(4)]
    assert (m["round"], m["total_rounds"], m["complete"]) == (3, 4, False)


def test_evaluate_warns_when_new_inputs_are_not_in_the_runs_range(tmp_path, capsys):
    small_run(tmp_path / "r")
    from fedclust.data import dataset

    cfg = load_config("configs/fmnist_rotation2.yaml", SMALL)
    raw = dataset(cfg.data).raw(cfg.data)
    owners = np.repeat(np.arange(8), 5)
    x = raw.test_x[:40].numpy()
    for name, images in (("raw", x), ("scaled", x.astype(np.float32) / 255)):
        np.savez(tmp_path / f"{name}.npz", x_test=images, y_test=raw.test_y[:40].numpy().astype(np.int64),
                 client_test=owners)
        capsys.readouterr()
        assert main(["evaluate", str(tmp_path / "r"), "--data", str(tmp_path / f"{name}.npz")]) == 0
        err = capsys.readouterr().err
        assert ("inputs lie in [0, 1], the run's raw training inputs in [0, 255]" in err) == (name == "scaled"), err


def test_evaluate_best_scores_the_best_validation_models(tmp_path, capsys):
    recs = small_run(tmp_path / "v", "rounds=5", "data.validation=0.3", "train.lr=0.5")
    rounds = json.loads((tmp_path / "v" / "summary.json").read_text())["best_validation_rounds"]
    by_round = {r["round"]: r["client_accuracy"] for r in recs}
    got = evaluate_run(tmp_path / "v", best=True)
    assert got["client_accuracy"] == [by_round[rounds[c]][c] for c in range(8)] and got["models"] == "best-validation"
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "v"), "--best"]) == 0
    assert "best-validation models" in capsys.readouterr().out
    small_run(tmp_path / "plain")
    assert main(["evaluate", str(tmp_path / "plain"), "--best"]) == 2
    assert "no best-validation models" in capsys.readouterr().err
    assert os.path.isdir(tmp_path / "plain")
