import pytest


@pytest.fixture(scope="session")
def slurm_env():
    """A one-node Slurm cluster on this machine (see tests/slurm_cluster.py)."""
    import slurm_cluster   # tests/ is on sys.path (pytest, no __init__.py)

    env = slurm_cluster.start()
    yield env
    slurm_cluster.stop()
