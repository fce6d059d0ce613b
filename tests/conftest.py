import os
import sys
from pathlib import Path

import pytest

# One thread per process: pytest-xdist's workers (and the runs they start) share the machine's cores, and a torch
# that takes every core in each of them spends its time contending (the unit tests on 2 cores with 3 workers took
# twice as long).  Numbers do not depend on it: golden and multi-process runs fix their threads themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Python's bytecode cache on, where the environment turns it off (PYTHONDONTWRITEBYTECODE): otherwise each of the
# suite's ~200 launched runs, Slurm tasks and ranks compiles fedclust's modules afresh (0.2 s of CPU each).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Two tiers, one folder each: tests/unit (fast, in-process: `pytest tests/unit`) and tests/integration (whole runs,
# launched processes, Slurm jobs; marked "integration" here, so `-m "not integration"` leaves them out too).
# Helpers shared by both (batch.py, run_files.py, ...) sit in tests/; a test module may import another's helpers.
TESTS = Path(__file__).resolve().parent
for folder in (TESTS / "golden", TESTS / "integration", TESTS / "unit", TESTS):   # golden: record.py
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """With pytest-xdist's ``-n N``, group-aware distribution (``--dist loadgroup``): the Slurm tests share one
    worker and one cluster, and the tests of a shared whole-run fixture one worker (``xdist_group``), which
    launches its runs once instead of once per worker that draws one of its tests.  Not in addopts, so that
    ``python -m pytest`` starts where pytest-xdist is not installed.  ``--dist`` given other than ``load`` wins.

    Two halves: the controller's scheduler reads the option after this hook (pytest-xdist's own configure is
    trylast; its cmdline_main has already turned ``-n N`` into ``load``), and each worker, which parses the
    command line afresh, hears it from :func:`pytest_configure_node` and then tags its tests with their group."""
    if getattr(config.option, "numprocesses", None) and getattr(config.option, "dist", None) in ("no", "load"):
        config.option.dist = "loadgroup"
    if getattr(config, "workerinput", {}).get("fedclust_loadgroup"):
        config.option.loadgroup = True


@pytest.hookimpl(optionalhook=True)   # pytest-xdist's hook: absent without the plugin
def pytest_configure_node(node):
    node.workerinput["fedclust_loadgroup"] = node.config.option.dist == "loadgroup"


def pytest_collection_modifyitems(config, items):
    # The Slurm tests first: under pytest-xdist their worker starts them at once, while the others share the rest,
    # instead of leaving them, one after the other, for the end.
    items.sort(key=lambda item: item.path.name != "test_slurm.py")
    for item in items:
        tier = item.path.parent.name
        if tier == "integration":
            item.add_marker(pytest.mark.integration)
        elif item.get_closest_marker("integration") is not None:
            raise pytest.UsageError(f"{item.nodeid} is marked integration but lives in tests/{tier}: move it to "
                                    "tests/integration")
        if item.path.name == "test_slurm.py":   # one Slurm cluster: its tests share one pytest-xdist worker
            item.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.fixture(scope="session")
def slurm_env():
    """A one-node Slurm cluster on this machine (see tests/slurm_cluster.py)."""
    import slurm_cluster  # tests/ is on sys.path (pytest, no __init__.py)

    env = slurm_cluster.start()
    yield env
    slurm_cluster.stop()


@pytest.fixture(scope="session")
def one_and_two(tmp_path_factory):
    """The runs of run_files.one_and_two_runs() on 1 and on 2 processes, in one job each (tests/run_many.py): ``{1:
    folder, 2: folder, "stderr": {1: ..., 2: ...}, "stdout": {1: ..., 2: ...}}``, each run's directory under its key
    in the folder. Tests that read it carry ``@pytest.mark.xdist_group("one_and_two")``: one worker launches the two
    jobs."""
    import os

    from batch import launch_many
    from run_files import one_and_two_runs

    root = tmp_path_factory.mktemp("one_and_two")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    got: dict = {"stderr": {}, "stdout": {}}
    (root / "inputs").mkdir()
    for nproc in (1, 2):
        got[nproc] = root / f"p{nproc}"
        runs = one_and_two_runs(root / "inputs", nproc)
        proc = launch_many(nproc, [[*args, f"out={got[nproc] / key}"] for key, args in runs.items()],
                           root / f"runs{nproc}.json", env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got["stderr"][nproc], got["stdout"][nproc] = proc.stderr, proc.stdout
    return got


@pytest.fixture(scope="session")
def killed_on_two(tmp_path_factory):
    """The runs of RESUMED_ON_TWO killed with SIGKILL after round KILL_AFTER on 2 processes (both ranks, in one
    2-process job for all: tests/run_many.py --kill-after), then continued on 2 processes (one job for all) and,
    from a copy, on 1 (2 -> 1: rows re-sharded; one job for all), with the uninterrupted runs to compare with where
    no golden files were recorded on a machine like this one: the folder holding killed/<name>,
    killed_to_one/<name>, whole/<name> and whole_one/<name>; FPFC's head fusion
    (tests/integration/test_fpfc_state_runs.py) as killed/fpfc_head, killed_to_one/fpfc_head, with its uninterrupted
    runs head/whole (2 processes) and head/one (1); PANMGrad exchanging in column blocks
    (tests/integration/test_exchange_runs.py) as killed/exchange_panm_grad, killed_to_one/exchange_panm_grad, with
    its uninterrupted run exchange/one (1 process); late joiners and drift (tests/integration/test_join_runs.py,
    test_drift_runs.py) as killed/join_panm_grad and killed/drift_dfca (and killed_to_one/), with their
    uninterrupted runs dynamics/<name> (2 processes). Tests that read it (tests/integration/test_resume.py,
    test_fpfc_state_runs.py, test_exchange_runs.py) carry ``@pytest.mark.xdist_group("killed_on_two")``."""
    import shutil

    from batch import killed_many, launch_many
    from run_files import EXCHANGE_BUDGET, JOIN_AFTER_STAGE_ONE, RESUMED_ON_TWO, drift_events, golden_here
    from test_fpfc_state import HEAD
    from test_resume import KILL_AFTER, PAUSE_PLUGIN, assert_killed, env, overrides

    root = tmp_path_factory.mktemp("killed_on_two")
    # tests/integration/test_fpfc_state_runs.py's head fusion too: killed, resumed on 2 and on 1, and run whole
    # on 2 and on 1 (head/whole, head/one) in the same jobs; test_exchange_runs.py's PANMGrad in column blocks
    killed = {name: (name, ()) for name in RESUMED_ON_TWO} | {"fpfc_head": ("fpfc", tuple(HEAD)),
                                                             "exchange_panm_grad": ("panm_grad", (EXCHANGE_BUDGET,))}
    dynamics = {"join_panm_grad": ("panm_grad", JOIN_AFTER_STAGE_ONE),            # and late joiners and drift
                "drift_dfca": ("dfca", tuple(drift_events(root)))}
    killed |= dynamics
    runs = [overrides(name, root / "killed" / key, *extra, f"plugins=[{PAUSE_PLUGIN}]")
            for key, (name, extra) in killed.items()]
    proc = killed_many(runs, KILL_AFTER, root / "killed.json", env(), nproc=2)   # one 2-process job kills them all
    assert proc.returncode == 0, proc.stderr[-3000:]
    for key in killed:
        assert_killed(root / "killed" / key)
        shutil.copytree(root / "killed" / key, root / "killed_to_one" / key)
    jobs = {2: [overrides(name, root / "killed" / key, *extra) for key, (name, extra) in killed.items()]
            + [overrides("fpfc", root / "head" / "whole", *HEAD)]
            + [overrides(name, root / "dynamics" / key, *extra) for key, (name, extra) in dynamics.items()],
            1: [overrides(name, root / "killed_to_one" / key, *extra) for key, (name, extra) in killed.items()]
            + [overrides("fpfc", root / "head" / "one", *HEAD),
               overrides("panm_grad", root / "exchange" / "one", EXCHANGE_BUDGET)]}
    if not golden_here():
        jobs[2] += [overrides(name, root / "whole" / name) for name in RESUMED_ON_TWO]
        jobs[1] += [overrides(name, root / "whole_one" / name) for name in RESUMED_ON_TWO]
    for nproc, runs in jobs.items():
        proc = launch_many(nproc, runs, root / f"again{nproc}.json", env())
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stderr.count("fedclust: resuming") == len(killed), proc.stderr[-3000:]
    return root
