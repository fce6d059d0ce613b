"""The whole-run tests of tests/unit/test_rendezvous.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import json
import subprocess
import time

from run_files import results
from test_rendezvous import free_port, kill  # noqa: E402
from test_resume import ROOT, command, env, launch, overrides

from fedclust.config import load_config
from fedclust.identity import config_digest


def test_a_stray_rank_of_another_run_exits_and_the_run_ends_as_alone(tmp_path):
    """Run A's two ranks started by hand on one node and, on the same port, rank 1 of run B (another seed,
    learning rate and out): B's rank exits with code 2 naming both run directories while A's rank 0 waits;
    A's own rank 1 then joins, and A ends exactly as A on one process."""
    port = free_port()
    a = overrides("random", tmp_path / "a", "rounds=2", "startup_timeout=120")
    b = overrides("random", tmp_path / "b", "rounds=2", "startup_timeout=60", "seed=5", "train.lr=0.3")

    def rank(args, r):
        extra = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                     NODE_RANK="0", LOCAL_RANK=str(r), RANK=str(r))
        return subprocess.Popen(command(1, args), cwd=ROOT, env=env(**extra), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    procs = []
    try:
        procs.append(rank(b, 1))
        began = time.monotonic()
        procs.append(rank(a, 0))
        _, stray = procs[0].communicate(timeout=120)
        assert time.monotonic() - began < 60, stray[-3000:]                # within its startup_timeout
        assert procs[0].returncode == 2, stray[-3000:]
        assert stray.strip().splitlines()[-1] == (
            f"fedclust: error: rank 1: the rendezvous at 127.0.0.1:{port} is another run's (out={tmp_path / 'a'}, "
            f"config {config_digest(load_config(None, a))[:12]}), not this run's (out={tmp_path / 'b'}, config "
            f"{config_digest(load_config(None, b))[:12]}): two runs share the address; start this run's processes "
            "with another MASTER_PORT (a free port; torchrun: --master-port)")
        assert procs[1].poll() is None                                    # A's rank 0 still waits for its rank 1
        procs.append(rank(a, 1))
        errs = [p.communicate(timeout=240)[1] for p in procs[1:]]
        assert [p.returncode for p in procs[1:]] == [0, 0], errs[0][-3000:] + errs[1][-3000:]
    finally:
        kill(procs)
    alone = launch(1, overrides("random", tmp_path / "alone", "rounds=2", "startup_timeout=120"))
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert results(tmp_path / "a") == results(tmp_path / "alone")
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["rounds_completed"] == 2
