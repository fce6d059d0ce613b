"""Late joiners (``network.join_round``, issue 48 part 2): who joins, against the rule written out client by
client; the records' joiner and incumbent numbers; every bad value refused naming its key (whole runs of every
method with joiners, and a killed run resumed: tests/integration/test_join_runs.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fedclust.runner as runner
from fedclust import rng
from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.network import join_peers, joiners
from fedclust.report import read_curve

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from record import GOLDEN_OVERRIDES  # noqa: E402

JOIN = ["network.join_round=4", "network.join_fraction=0.25"]


def _cfg(tmp_path: Path, name: str, *extra: str, rounds: int = 6):
    return load_config(None, [*GOLDEN_OVERRIDES, f"algorithm.name={name}", f"rounds={rounds}",
                              f"out={tmp_path / 'r'}", *extra])


def _records(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    for r in rows:
        r.pop("round_seconds", None)
    return rows


# ---------------------------------------------------------------- the draws


def _plain_joiners(seed: int, n: int, share: float) -> list[int]:
    keys = {c: float(rng.uniform(seed, 0, "join", torch.tensor(c), 0)) for c in range(n)}
    return sorted(sorted(range(n), key=lambda c: (keys[c], c))[:math.ceil(share * n - 1e-9)])


@pytest.mark.parametrize("seed,n,share", [(0, 8, 0.25), (3, 13, 0.3), (7, 100, 0.1), (1, 5, 0.5)])
def test_the_joiners_are_the_plain_draw(seed, n, share):
    got = joiners(seed, n, share)
    assert got.nonzero().flatten().tolist() == _plain_joiners(seed, n, share)
    peers = join_peers(seed, 9, got)
    present = [c for c in range(n) if not got[c]]
    for c in range(n):   # a joiner copies the present client at floor(u · P) in id order
        u = float(rng.uniform(seed, 9, "join_peer", torch.tensor(c), 0))
        assert int(peers[c]) == (present[int(u * len(present))] if got[c] else -1)


# ---------------------------------------------------------------- a run, round by round


def test_theorem_1_is_not_drawn_with_late_joiners(tmp_path):
    from fedclust.figures import theorem_1_breaks

    assert theorem_1_breaks(_cfg(tmp_path, "panm_grad", *JOIN)) == [("every client online", "network.join_round=4")]
    assert theorem_1_breaks(_cfg(tmp_path, "panm_grad")) == []


def test_the_records_split_joiners_from_incumbents(tmp_path):
    cfg = _cfg(tmp_path, "random", *JOIN)
    runner.run(cfg, runner.prepare(cfg))
    late = joiners(cfg.seed, cfg.clients, 0.25).numpy()
    records = _records(tmp_path / "r")
    first = records[0]
    for r in records:
        acc = np.array(r["client_accuracy"])
        assert r["joiner_accuracy"] == pytest.approx(acc[late].mean(), abs=0.01)
        assert r["incumbent_accuracy"] == pytest.approx(acc[~late].mean(), abs=0.01)
        if r["round"] < 4:   # scored at their initial model: the same every round before the join
            assert r["joiner_accuracy"] == first["joiner_accuracy"] and r["joiner_neighbor_precision"] is None
        assert r["incumbent_neighbor_precision"] is not None
    assert records[-1]["joiner_neighbor_precision"] is not None
    join = json.loads((tmp_path / "r" / "summary.json").read_text())["join"]
    after = [r for r in records if r["round"] >= 4]
    assert {k: join[k] for k in ("round", "joiners", "init")} == {"round": 4, "joiners": 2, "init": "initial"}
    for key in ("joiner_accuracy", "incumbent_accuracy", "joiner_neighbor_precision", "incumbent_neighbor_precision"):
        assert join[f"{key}_after"] == pytest.approx(np.mean([r[key] for r in after]))
    caught = [r["round"] - 4 for r in after if r["joiner_accuracy"] >= r["incumbent_accuracy"] - 1]
    assert join["catch_up_rounds"] == (caught[0] if caught else None)
    for key in ("joiner_accuracy", "incumbent_accuracy"):
        assert read_curve({"_dir": str(tmp_path / "r")}, metric=key) == {r["round"]: r[key] for r in records}
    plain = _cfg(tmp_path / "plain", "random")
    runner.run(plain, runner.prepare(plain))
    assert not {k for k in _records(tmp_path / "plain" / "r")[0] if "joiner" in k or "incumbent" in k}
    assert "join" not in json.loads((tmp_path / "plain" / "r" / "summary.json").read_text())


# ---------------------------------------------------------------- refused


@pytest.mark.parametrize("extra,key,part", [
    (["network.join_round=7", "network.join_fraction=0.25"], "network.join_round", "[2, rounds = 6]"),
    (["network.join_round=1", "network.join_fraction=0.25"], "network.join_round", "[2, rounds = 6]"),
    (["network.join_round=-2"], "network.join_round", "0 (no late joiners)"),
    (["network.join_round=3"], "network.join_fraction", "network.join_fraction=0.25"),
    (["network.join_round=3", "network.join_fraction=1"], "network.join_fraction", "(0, 1)"),
    (["network.join_round=3", "network.join_fraction=-0.1"], "network.join_fraction", "(0, 1)"),
    (["network.join_round=3", "network.join_fraction=0.95"], "network.join_fraction", "at least one client"),
    (["network.join_fraction=0.25"], "network.join_fraction", "no effect"),
    (["network.join_init=peer"], "network.join_init", "no effect"),
    (["network.join_round=3", "network.join_fraction=0.25", "network.join_init=copy"], "network.join_init",
     "peer"),
])
def test_bad_values_are_refused_naming_the_key_and_the_fix(tmp_path, extra, key, part):
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, "random", *extra)
    assert e.value.field == key and e.value.fix and part in str(e.value), str(e.value)
