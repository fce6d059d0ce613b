"""Behaviour is pinned: a short run of every registered algorithm gives the
metrics recorded in tests/golden/ before the plug-in refactor, number for
number (tests/golden/README.md)."""

import json
import math
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
sys.path.insert(0, str(GOLDEN))
from record import SCENARIOS, golden_run, golden_summary  # noqa: E402
from run_files import golden_dir, machine_fingerprint, machine_id  # noqa: E402

HERE = golden_dir()               # the recording made on a machine like this one, if any
SAME_ENV = HERE is not None
FILES = HERE or GOLDEN            # else the first recording, compared to 1e-6
NAMES = sorted(p.stem for p in GOLDEN.glob("*.jsonl"))   # each with <name>.summary.json


def _compare(got, want, where, close=not SAME_ENV):
    """``got`` equals ``want``, key by key and item by item; floats to 1e-6 where ``close`` (another machine's
    recording), else bit for bit."""
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), where
        for k in want:
            _compare(got[k], want[k], f"{where}.{k}", close)
    elif isinstance(want, list):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            _compare(g, w, f"{where}[{i}]", close)
    elif isinstance(want, float) and close:
        assert math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9), where
    else:
        assert got == want, f"{where}: {got!r} != golden {want!r}"


def test_every_registered_algorithm_has_a_golden_file():
    from fedclust.algorithms import registry

    assert sorted(set(NAMES) - set(SCENARIOS)) == registry.builtin_names()   # plug-ins loaded by other tests: none
    assert set(SCENARIOS) <= set(NAMES)                                          # and every condition's run


@pytest.mark.parametrize("name", NAMES)
def test_metrics_equal_the_golden_file(tmp_path, name):
    if not SAME_ENV:
        print(f"no golden files were recorded on a machine like this one ({machine_id()}: "
              f"{json.dumps(machine_fingerprint())}): comparing floats to 1e-6; python tests/golden/record.py "
              "--machine records them")
    if name == "drift_dfca":
        from fedclust.data import sources

        if sources.debian_fmnist_folder() is None and not (Path.cwd() / "data").exists():
            pytest.skip("drift_dfca reads real Fashion-MNIST: the Debian package dataset-fashion-mnist is not "
                        "installed (.ci/run installs it)")
    want = [json.loads(x) for x in (FILES / f"{name}.jsonl").read_text().splitlines()]
    got = golden_run(name, tmp_path / name)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        _compare(g, w, f"{name} round {w['round']}")
    _compare(golden_summary(tmp_path / name), json.loads((FILES / f"{name}.summary.json").read_text()),
             f"{name} summary")


@pytest.mark.parametrize("machine", sorted(p.name for p in (GOLDEN / "machines").glob("*") if p.is_dir()) or
                         [pytest.param("", marks=pytest.mark.skip(reason="no other machine's recording is kept"))])
def test_each_machines_recording_agrees_with_the_first(machine):
    """Another machine's recording (same code, same runs) differs from the canonical one only in float rounding:
    every non-float identical, every float within 1e-6 relative."""
    d = GOLDEN / "machines" / machine
    assert sorted(p.stem for p in d.glob("*.jsonl")) == NAMES
    for name in NAMES:
        for file in (f"{name}.jsonl", f"{name}.summary.json"):
            a = [json.loads(x) for x in (d / file).read_text().splitlines()] if file.endswith("l") else \
                json.loads((d / file).read_text())
            b = [json.loads(x) for x in (GOLDEN / file).read_text().splitlines()] if file.endswith("l") else \
                json.loads((GOLDEN / file).read_text())
            _compare(a, b, f"{machine}/{file}", close=True)
