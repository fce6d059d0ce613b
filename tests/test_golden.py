"""Behaviour is pinned: a short run of every registered algorithm gives the
metrics recorded in tests/golden/ before the plug-in refactor, number for
number (tests/golden/README.md)."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))
from record import golden_run, golden_summary  # noqa: E402

ENV = json.loads((GOLDEN / "environment.json").read_text())
SAME_ENV = (ENV["torch"] == torch.__version__
            and ENV["cpu_capability"] == torch.backends.cpu.get_cpu_capability())
NAMES = sorted(p.stem for p in GOLDEN.glob("*.jsonl"))   # each with <name>.summary.json




def _compare(got, want, where):
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), where
        for k in want:
            _compare(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _compare(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not SAME_ENV:
        assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9), where
    else:
        assert got == want, f"{where}: {got!r} != golden {want!r}"


def test_every_registered_algorithm_has_a_golden_file():
    from fedclust.algorithms import registry

    assert NAMES == registry.builtin_names()   # plug-ins other tests load in this process have none


@pytest.mark.parametrize("name", NAMES)
def test_metrics_equal_the_golden_file(tmp_path, name):
    if not SAME_ENV:
        print(f"golden files were recorded with torch {ENV['torch']} on {ENV['cpu_capability']}; here torch "
              f"{torch.__version__} on {torch.backends.cpu.get_cpu_capability()}: comparing floats to 1e-6")
    want = [json.loads(x) for x in (GOLDEN / f"{name}.jsonl").read_text().splitlines()]
    got = golden_run(name, tmp_path / name)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _compare(g, w, f"{name} round {w['round']}")
    _compare(golden_summary(tmp_path / name), json.loads((GOLDEN / f"{name}.summary.json").read_text()),
             f"{name} summary")
