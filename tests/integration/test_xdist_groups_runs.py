"""The suite's own set-up: under ``pytest -n N`` the tests of one ``xdist_group`` share one worker (tests/conftest.py
turns pytest-xdist's ``--dist load`` into ``loadgroup``), so a shared whole-run fixture runs once, and the Slurm
tests share one cluster."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="pytest-xdist is not installed: the grouping it does is not used")

CONFTEST = Path(__file__).resolve().parent.parent / "conftest.py"

GROUPED = '''
import os
from pathlib import Path

import pytest

@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("i", range(8))
def test_grouped(i):
    Path(os.environ["WHERE"], f"{i}").write_text(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.parametrize("i", range(8))
def test_free(i):
    pass
'''


@pytest.mark.parametrize("extra", [[], ["--dist", "load"]])
def test_the_tests_of_one_group_run_on_one_worker(tmp_path, extra):
    suite = tmp_path / "suite"
    (suite / "tests" / "unit").mkdir(parents=True)
    shutil.copy(CONFTEST, suite / "tests" / "conftest.py")
    (suite / "tests" / "unit" / "test_grouped.py").write_text(GROUPED)
    where = tmp_path / "where"
    where.mkdir()
    # the plug-ins pyproject.toml's addopts leaves out (the suite copied here has no pyproject.toml)
    unused = ["-p", "no:hypothesispytest", "-p", "no:benchmark", "-p", "no:anyio"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "3", "-p", "no:cacheprovider", *unused, *extra,
                           "tests"], cwd=suite, env={**__import__("os").environ, "WHERE": str(where)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers = {p.read_text() for p in where.iterdir()}
    assert len(list(where.iterdir())) == 8 and len(workers) == 1, workers
