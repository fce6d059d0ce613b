import os

import pytest

# One thread per process: pytest-xdist's workers (and the runs they start) share the machine's cores, and a torch
# that takes every core in each of them spends its time contending (the unit tests on 2 cores with 3 workers took
# twice as long).  Numbers do not depend on it: golden and multi-process runs fix their threads themselves.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Files whose every test runs fedclust end to end (whole runs, launched processes, Slurm jobs): marked
# "integration", so that `pytest -m "not integration"` runs the fast unit tests alone.  Tests of this kind in
# other files carry @pytest.mark.integration themselves.
INTEGRATION_FILES = {"test_resume.py", "test_slurm.py", "test_multinode.py", "test_wandb.py", "test_run.py",
                     "test_outputs.py"}


def pytest_collection_modifyitems(config, items):
    # The Slurm tests first: under pytest-xdist their worker starts them at once, while the others share the rest,
    # instead of leaving them, one after the other, for the end.
    items.sort(key=lambda item: item.path.name != "test_slurm.py")
    for item in items:
        if item.path.name in INTEGRATION_FILES:
            item.add_marker(pytest.mark.integration)
        if item.path.name == "test_slurm.py":   # one Slurm cluster: its tests share one pytest-xdist worker
            item.add_marker(pytest.mark.xdist_group("slurm"))


@pytest.fixture(scope="session")
def slurm_env():
    """A one-node Slurm cluster on this machine (see tests/slurm_cluster.py)."""
    import slurm_cluster   # tests/ is on sys.path (pytest, no __init__.py)

    env = slurm_cluster.start()
    yield env
    slurm_cluster.stop()


@pytest.fixture(scope="session")
def one_and_two(tmp_path_factory):
    """Every run of run_files.one_and_two_runs() on 1 and on 2 processes, in one job each (tests/run_many.py):
    ``{1: folder, 2: folder, "stderr": {1: ..., 2: ...}}``, each run's directory under its key in the folder.
    Tests that read it carry ``@pytest.mark.xdist_group("one_and_two")``: one worker launches the two jobs."""
    import os

    from batch import launch_many
    from run_files import one_and_two_runs

    root = tmp_path_factory.mktemp("one_and_two")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    got: dict = {"stderr": {}}
    for nproc in (1, 2):
        got[nproc] = root / f"p{nproc}"
        runs = [[*args, f"out={got[nproc] / key}"] for key, args in one_and_two_runs().items()]
        proc = launch_many(nproc, runs, root / f"runs{nproc}.json", env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got["stderr"][nproc] = proc.stderr
    return got
