"""experiments/reference/harness.py's dfca and fedspd rows without the reference checkouts: the inits files are
fedclust's ``cluster_inits`` of each method, the graph is connected and 4-regular, the DFCA driver's log files
(dfca_ref.py, ``write_logs``) are what ``finished`` and ``read_reference`` read, and the fedclust rows' keys
resolve to the reference's local steps and graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from run_files import experiment

from fedclust.algorithms.cluster_models import cluster_inits
from fedclust.config import load_config
from fedclust.models import initial_weights


def test_inits_files_are_fedclusts_cluster_inits_and_the_graph_fedspds(tmp_path, monkeypatch):
    harness = experiment("reference/harness")
    harness.write_inits(3, tmp_path)
    layout, w0 = initial_weights("mlp", (1, 28, 28), 10, 3)
    for name in ("dfca", "fedspd"):
        got = torch.load(tmp_path / f"inits_{name}.pt", weights_only=True)
        want = cluster_inits(w0, 2, 3, lambda s: initial_weights("mlp", (1, 28, 28), 10, s)[1],
                             stream=f"{name}_init")
        assert len(got) == 2 and list(got[0]) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight",
                                                  "fc3.bias"]
        for sd, row in zip(got, want):
            assert torch.equal(torch.cat([t.reshape(-1) for t in sd.values()]), row)
        assert torch.equal(got[0]["fc1.weight"], w0[:784 * 200].reshape(200, 784))   # w0 first
        assert not torch.equal(got[0]["fc1.weight"], got[1]["fc1.weight"])
    monkeypatch.syspath_prepend(str(Path(harness.__file__).parent))   # fedspd_ref imports dfca_ref
    adj = experiment("reference/fedspd_ref").adjacency(tmp_path / "graph.edges", 16)
    assert (adj == adj.T).all() and (np.diag(adj) == 1).all() and (adj.sum(1) == 5).all()   # 4 peers and itself
    reach = np.linalg.matrix_power(adj, 15)
    assert (reach > 0).all()   # connected


def test_driver_logs_read_back_by_the_harness(tmp_path):
    harness, driver = experiment("reference/harness"), experiment("reference/dfca_ref")
    assert driver.tested_rounds(100) == {1, 25, 50, 75, 100} and driver.tested_rounds(3) == {1, 3}
    cluster = np.repeat([0, 1], 8)
    folder = tmp_path / "ref-dfca"
    records = {r: [{"acc": 50.0 + uid, "loss": 1.0, "best_of_k": 60.0 + uid, "best": int(cluster[uid]),
                    "chosen": int(cluster[uid]) if r == 100 else 0} for uid in range(16)] for r in (1, 25, 100)}
    driver.write_logs(folder / "logs", {1: records[1], 25: records[25]})
    assert harness.finished(folder / "logs") == 0   # round 100 not written yet
    driver.write_logs(folder / "logs", records)
    assert harness.finished(folder / "logs") is None
    assert harness.read_reference(folder, cluster) is None   # done.json is the harness's mark
    (folder / "done.json").write_text(json.dumps({"seconds": 1.0}))
    got = harness.read_reference(folder, cluster)
    assert got["accuracy"] == 57.5 and got["accuracy_best_of_k"] == 67.5
    assert got["ari_trained_head"] == 1.0 and got["ari_reported_head"] == 1.0
    assert "Best model chosen:1" in (folder / "logs" / "15.log").read_text()


def test_fedclust_rows_read_best_of_k_and_take_the_references_steps(tmp_path, monkeypatch):
    harness = experiment("reference/harness")
    (tmp_path / "summary.json").write_text(json.dumps({"final_accuracy": 80.0, "final_accuracy_best_of_k": 81.0}))
    assert harness.read_fedclust(tmp_path) == {"accuracy": 80.0, "final_accuracy_best_of_k": 81.0}
    keys = [k for k in harness.fedclust_keys("dfca", 1, Path("split")) if not k.startswith("data.")]
    cfg = load_config(None, keys)
    assert (cfg.algorithm.name, cfg.dfca.clusters, cfg.dfca.init) == ("dfca", 2, "global")
    assert (cfg.train.batch_size, cfg.train.local_epochs, cfg.train.lr) == (200, 10, 0.05)
    keys = harness.fedclust_keys("fedspd", 1, tmp_path)
    assert keys[-1] == f"network.path={tmp_path / 'graph.edges'}"
    cfg = load_config(None, [k for k in keys if not k.startswith(("data.", "network."))])
    assert (cfg.fedspd.first_epochs, cfg.fedspd.finetune_rounds, cfg.fedspd.finetune_epochs) == (1, 5, 1)
    monkeypatch.syspath_prepend(str(Path(harness.__file__).parent))
    assert experiment("reference/fedspd_ref").epochs_of(100) == 94   # its epoch 0 is fedclust's rounds 1 and 2
