"""Late joiners (``network.join_round``, issue 48 part 2): who joins, against the rule written out client by
client; before its round a joiner never trains, is in no list and no average, and is scored at its initial model;
at its round its model is the initial one (or the chosen present client's); the records' joiner and incumbent
numbers; a run killed before or after the join round resumes to the same records; every bad value refused naming
its key."""

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
from fedclust.network import Join, join_peers, joiners
from fedclust.peers import as_indices
from fedclust.report import read_curve
from fedclust.runmodel import run_model

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


def _watch(monkeypatch):
    """Each round's outcome and the models right after the join's start, as the runner makes them."""
    seen: dict = {"outcomes": {}, "joined": None, "before_join": None}
    step, start = runner.round_step, Join.start

    def round_step(setup, state, t, *a):
        if t == setup.cfg.network.join_round:
            seen["before_join"] = state.flat.clone()
        out = step(setup, state, t, *a)
        seen["outcomes"][t] = out
        return out

    def join_start(self, flat, ids, all_reduce):
        start(self, flat, ids, all_reduce)
        seen["joined"] = flat.clone()

    monkeypatch.setattr(runner, "round_step", round_step)
    monkeypatch.setattr(Join, "start", join_start)
    return seen


@pytest.mark.parametrize("name,extra", [("random", []), ("panm_grad", ["network.join_init=peer"]),
                                        ("fedavg", []), ("ifca", ["network.p_offline=0.2", "ifca.restarts=1"]),
                                        ("random", ["train.init=per_client"]), ("dac", []), ("cobo", []),
                                        ("dpfl", []), ("epidemic", []), ("deprl", []), ("dfca", []),
                                        ("facade", ["network.join_init=peer"]), ("fedspd", []), ("cfl", []),
                                        ("fpfc", []), ("pens", []), ("oracle", [])])
def test_before_its_round_a_joiner_does_nothing_and_at_it_starts_as_asked(tmp_path, monkeypatch, name, extra):
    seen = _watch(monkeypatch)
    cfg = _cfg(tmp_path, name, *JOIN, *extra)
    runner.run(cfg, runner.prepare(cfg))
    late = joiners(cfg.seed, cfg.clients, 0.25)
    ids = late.nonzero().flatten()
    assert ids.tolist() == _plain_joiners(cfg.seed, cfg.clients, 0.25)
    for t, out in seen["outcomes"].items():
        trained = torch.ones(cfg.clients, dtype=torch.bool) if out.trained is None else out.trained.cpu()
        if t < 4:
            assert not trained[ids].any(), t                  # never trains
            assert torch.isnan(out.all_loss[ids]).all()
            for choice in (out.result.averaged, out.result.lists):
                if choice is None:
                    continue
                idx, valid = as_indices(choice)
                chosen = set(idx[valid].tolist())
                assert not chosen & set(ids.tolist()), (t, chosen)   # never chosen, never averaged
                assert not valid[ids].any()                           # and chooses nobody
        elif "network.p_offline=0.2" not in extra:
            assert trained[ids].all(), t
    joined = seen["joined"]
    if "network.join_init=peer" in extra:   # the chosen present client's model at the end of round 3
        peers = join_peers(cfg.seed, 4, late)
        assert torch.equal(joined[ids], seen["before_join"][peers[ids]])
    elif "train.init=per_client" in extra:
        assert torch.equal(joined[ids], run_model(cfg).client_rows(ids))
    else:
        assert torch.equal(joined[ids], run_model(cfg).w0.expand(len(ids), -1))
    if name == "fedavg":   # the server's model before: reset to w0 at the join
        assert not torch.equal(seen["before_join"][ids], joined[ids])
    # everyone else's model untouched by the join
    assert torch.equal(joined[~late], seen["before_join"][~late])


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


@pytest.mark.parametrize("kill_after", [2, 5])
def test_a_run_killed_before_or_after_the_join_resumes_to_the_same_records(tmp_path, kill_after):
    args = (*JOIN, "network.join_init=peer", "checkpoint_every=1")
    whole = _cfg(tmp_path / "whole", "panm_grad", *args)
    runner.run(whole, runner.prepare(whole))

    class Killed(Exception):
        pass

    def kill(setup, state, run_dir):
        if state.round == kill_after:
            raise Killed

    cut = _cfg(tmp_path / "cut", "panm_grad", *args)
    runner._ROUND_END_HOOKS.append(kill)
    try:
        with pytest.raises(Killed):
            runner.run(cut, runner.prepare(cut))
    finally:
        runner._ROUND_END_HOOKS.remove(kill)
    resumed = _cfg(tmp_path / "cut", "panm_grad", *args)
    assert runner.run(resumed, runner.prepare(resumed))["starts"] == 2
    assert _records(tmp_path / "cut" / "r") == _records(tmp_path / "whole" / "r")


def _builtin_names() -> list[str]:
    from fedclust.algorithms import registry

    return sorted(registry.builtin_names())


@pytest.mark.parametrize("name", _builtin_names())
def test_every_method_runs_with_late_joiners(tmp_path, name):
    cfg = _cfg(tmp_path, name, "network.join_round=3", "network.join_fraction=0.25", "network.join_init=peer",
               "network.p_offline=0.1", "ifca.restarts=1", rounds=5)
    summary = runner.run(cfg, runner.prepare(cfg))
    records = _records(tmp_path / "r")
    assert len(records) == 5 and all("joiner_accuracy" in r and "incumbent_accuracy" in r for r in records)
    assert summary["join"]["joiners"] == 2 and summary["join"]["joiner_accuracy_after"] is not None


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
