"""What a run used is saved with it (issue 44, part 3): the edge list and availability trace it read are hashed
into the resume check and summary.json; its attackers and each redraw epoch's graph are in neighbors.npz, and
``fedclust report`` counts attacker entries in the final lists from them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedclust import report
from fedclust.attack import attackers
from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.models import file_sha256
from fedclust.network import edge_array, make_graph
from fedclust.runner import prepare, run

pytestmark = pytest.mark.integration
BASE = ["data.name=synthetic", "clients=8", "data.train_size=20", "data.test_size=10", "algorithm.name=random",
        "algorithm.k=2", "progress=false", "figures=false", "checkpoint_every=1"]


def small_run(out: Path, *extra) -> dict:
    cfg = load_config(None, BASE + [f"out={out}", *extra])
    run(cfg, prepare(cfg))
    return json.loads((out / "summary.json").read_text())


def ring(n: int, step: int = 1) -> str:
    return "".join(f"{i} {(i + step) % n}\n" for i in range(n))


@pytest.mark.parametrize("key,write", [
    ("network.path", lambda p, v: p.write_text(ring(8, 1 if v == 0 else 3))),
    ("network.availability", lambda p, v: np.save(p, np.eye(8, dtype=bool)[[1, 2]] | (v == 0))),
])
def test_a_graph_or_trace_rewritten_before_a_resume_is_refused(tmp_path, key, write):
    path = tmp_path / ("edges.txt" if key == "network.path" else "trace.npy")
    write(path, 0)
    extra = [f"{key}={path}"] + (["network.graph=file"] if key == "network.path" else [])
    s = small_run(tmp_path / "r", "rounds=2", *extra)
    assert s["inputs"][key] == {"path": str(path.resolve()), "sha256": file_sha256(str(path))}
    assert s["setting"][key] == "sha256:" + file_sha256(str(path))
    write(path, 1)   # another graph (a ring of step 3), another trace
    with pytest.raises(ConfigError) as e:
        small_run(tmp_path / "r", "rounds=4", *extra)
    assert e.value.field == key and "changed" in str(e.value) and "Restore the file" in str(e.value)
    write(path, 0)   # the file as it was: the run continues
    assert small_run(tmp_path / "r", "rounds=4", *extra)["rounds_completed"] == 4


def test_the_attackers_and_every_graph_are_saved_and_the_report_counts_attackers(tmp_path):
    out = tmp_path / "a"
    extra = ["rounds=5", "network.graph=regular", "network.degree=3", "network.redraw_every=2",
             "attack.fraction=0.25", "attack.kind=sign_flip"]
    small_run(out, "rounds=3", *extra[1:])          # stopped after round 3, then continued: epochs drawn before
    small_run(out, *extra)
    cfg = load_config(None, BASE + extra)
    with np.load(out / "neighbors.npz") as f:
        bad, lists = f["attackers"], f["final_lists"]
        edges, start = f["graph_edges"], f["graph_epoch_start"]
    assert bad.tolist() == attackers(cfg.seed, 8, 0.25).nonzero().flatten().tolist() and len(bad) == 2
    assert start.tolist()[0] == 0 and len(start) == 4          # epochs 0, 1, 2 serve rounds 1-2, 3-4, 5
    for e in range(3):
        want = edge_array(make_graph(cfg.network, 8, cfg.seed, e))
        assert np.array_equal(edges[start[e]:start[e + 1]], want)
    honest = [i for i in range(8) if i not in bad]
    entries = [j for i in honest for j in lists[i] if j >= 0]
    count = sum(j in bad for j in entries)
    got = report.load_run(out)
    assert got["attacker_entries"] == count and got["attackers_in_lists"] == pytest.approx(count / len(entries))
    assert "attackers_in_lists" in report.METRICS
