"""The Facade benchmark's end in whole runs (in process, one thread): DePRL's and Facade's final all-reduce
(``deprl.final_allreduce``, ``facade.final_allreduce``) and Facade's reported head (``facade.report_head``); a run
killed before its last round or after it resumes to the records of one never stopped, and the last round's models
are the all-reduced ones (every online client's body or core equal)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from fedclust.config import load_config
from fedclust.runner import add_round_end_hook

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from record import GOLDEN_OVERRIDES, run_on_one_thread  # noqa: E402

OPTIONS = {
    "deprl": ["algorithm.name=deprl", "deprl.final_allreduce=true", "deprl.head_epochs=1"],
    "facade": ["algorithm.name=facade", "facade.final_allreduce=true", "facade.report_head=lowest_test_loss",
               "facade.warmup=1"],
}


class Killed(Exception):
    pass


def _cfg(name, out, *extra):
    return load_config(None, GOLDEN_OVERRIDES + OPTIONS[name] + ["rounds=4", "checkpoint_every=1", f"out={out}",
                                                                  *extra])


def _records(out: Path) -> list[dict]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "round_seconds"} for r in rows]


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_the_run_ends_all_reduced_and_resumes_to_the_same_records(name, tmp_path):
    held = {}

    def keep(setup, state, run_dir):
        if state.round == 4:
            held["models"], held["algo"] = state.flat.clone(), setup.algo

    remove = add_round_end_hook(keep)
    try:
        run_on_one_thread(_cfg(name, tmp_path / "whole"))
    finally:
        remove()
    models, algo = held["models"], held["algo"]
    head = torch.zeros(models.shape[1], dtype=torch.bool)
    for a, b in (algo.head_columns if name == "deprl" else algo.columns):
        head[a:b] = True
    assert torch.equal(models[:, ~head], models[:1, ~head].expand(len(models), -1))   # one body / core for all
    for kill_at in (3, 4):   # before the last round (its all-reduce redone), after it (the run complete)
        def kill(setup, state, run_dir, kill_at=kill_at):
            if state.round == kill_at:
                raise Killed

        out = tmp_path / f"cut{kill_at}"
        remove = add_round_end_hook(kill)
        try:
            with pytest.raises(Killed):
                run_on_one_thread(_cfg(name, out))
        finally:
            remove()
        run_on_one_thread(_cfg(name, out))
        assert _records(out) == _records(tmp_path / "whole"), kill_at


def test_the_reported_accuracy_is_each_clients_head_of_lowest_test_loss(tmp_path):
    """The last record's per-client accuracies: each client's core with its head of lowest test loss, scored here
    from the run's last state, head by head."""
    from fedclust.engine.train import evaluate

    got = {}

    def score(setup, state, run_dir):
        if state.round == 4:
            d, algo = setup.data, setup.algo
            per_head = [evaluate(algo._models(state.flat, state.algo_state.heads[:, j]), setup.layout, setup.arch,
                                 d.test_x, d.test_y, counts=d.test_counts) for j in range(algo.facade.heads)]
            losses = torch.stack([loss for _, loss in per_head], dim=1)
            best = losses.argmin(dim=1)
            got["accuracy"] = [round(100.0 * float(per_head[int(b)][0][i]), 2) for i, b in enumerate(best)]

    remove = add_round_end_hook(score)
    try:
        run_on_one_thread(_cfg("facade", tmp_path / "run"))
    finally:
        remove()
    assert _records(tmp_path / "run")[-1]["client_accuracy"] == got["accuracy"]
