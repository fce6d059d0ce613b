"""Several nodes, simulated on one machine: two torchrun agents
(``--nnodes=2 --nproc_per_node=1``, c10d rendezvous on 127.0.0.1), each the
"node" of one rank, run a short config and end with the same metrics,
summary, neighbour lists and final models as the same config on one
process; torchrun's own log and the run's checkpoint show that it ran as
world size 2 over 2 nodes.  ``world_from_env`` reads such an environment as
1 device per node on 2 nodes."""

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed

from fedclust import checkpoint
from fedclust.dist import world_from_env

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from record import GOLDEN_OVERRIDES  # noqa: E402
from run_files import results



def env():
    # LOGLEVEL=INFO: torchrun logs its rendezvous result (group_rank, group_world_size, ...); fedclust does not read it.
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", LOGLEVEL="INFO")


def overrides(name, out):
    return GOLDEN_OVERRIDES + [f"algorithm.name={name}", f"out={out}"]   # 8 clients, 8 rounds


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_and_two_nodes(one_args, two_args):
    """The one-process reference (a fresh process, the same environment as the nodes' ranks) and both node
    agents, started together as two machines would be; each one's (returncode, stderr), the reference first."""
    port, rdzv_id = free_port(), f"fedclust-test-{uuid.uuid4().hex[:8]}"
    commands = [[sys.executable, "-m", "fedclust", "run", *one_args]] + [
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={r}", "--nproc_per_node=1",
         "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", f"--rdzv_id={rdzv_id}",
         "-m", "fedclust", "run", *two_args] for r in (0, 1)]
    procs = [subprocess.Popen(c, cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for c in commands]
    try:
        stderr = [p.communicate(timeout=120)[1] for p in procs]
        return [(p.returncode, err) for p, err in zip(procs, stderr)]
    finally:
        for p in procs:   # a node left waiting for its peer (rendezvous timeout: 15 min) ends with the test
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()


@pytest.mark.skipif(not torch.distributed.is_available() or importlib.util.find_spec("torch.distributed.run") is None,
                    reason="torchrun (torch.distributed.run) is missing: cannot launch two nodes")
# One algorithm: what is specific to several nodes is the launch (rendezvous, environment), not an algorithm's
# collectives, which tests/integration/test_resume.py and tests/unit/test_plugins.py run on 2 processes for every algorithm.
# "ifca" (a server algorithm, with its all-reduce) passes here too; it doubles the test's time (~20 s more).
@pytest.mark.parametrize("name", ["panm_grad"])
def test_two_nodes_run_as_one_process(tmp_path, name):
    ran = one_and_two_nodes(overrides(name, tmp_path / "one"), overrides(name, tmp_path / "two"))
    for rc, err in ran:
        assert rc == 0, err[-3000:]
    nodes = ran[1:]

    # Two torchrun agents met as two nodes of a world of 2 (torchrun's rendezvous log, LOGLEVEL=INFO; with c10d
    # the rendezvous, not --node_rank, numbers the nodes: group_rank, which Fabric reads as the node rank) ...
    logged = [dict(re.findall(r"\b(group_rank|group_world_size|global_world_sizes|global_ranks)=(\S+)", err))
              for _, err in nodes]
    assert sorted(x["group_rank"] for x in logged) == ["0", "1"]
    assert all(x["group_world_size"] == "2" and x["global_world_sizes"] == "[2]" for x in logged)
    assert sorted(x["global_ranks"] for x in logged) == ["[0]", "[1]"]
    # ... the process group formed with both, one on each node (each rank prints its line) ...
    members = sorted(m for _, err in nodes for m in re.findall(r"process group formed: rank (\d) of 2 \(gloo, node (\d)\)", err))
    assert members == [("0", "0"), ("1", "1")]
    # ... and the run itself recorded world size 2 (the one-process run: 1).
    assert checkpoint.newest(tmp_path / "two")[1]["world_size"] == 2
    assert checkpoint.newest(tmp_path / "one")[1]["world_size"] == 1

    # The same run, bit for bit: every metric (wall times aside), the summary, the final models of all clients.
    one, two = results(tmp_path / "one"), results(tmp_path / "two")
    assert [r["round"] for r in two[0]] == list(range(1, 9))
    assert one == two
    assert torch.equal(checkpoint.newest(tmp_path / "one")[1]["weights"],
                       checkpoint.newest(tmp_path / "two")[1]["weights"])
    if (tmp_path / "one" / "neighbors.npz").exists():
        a, b = np.load(tmp_path / "one" / "neighbors.npz"), np.load(tmp_path / "two" / "neighbors.npz")
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_world_from_env_reads_torchrun_on_several_nodes(monkeypatch):
    """What torchrun sets on each node: the ranks of this node and of all nodes."""
    for key in list(os.environ):
        if key.startswith("SLURM_"):
            monkeypatch.delenv(key)
    for local, world, expected in [("1", "2", (1, 2)), ("4", "8", (4, 2)), ("2", "2", (2, 1))]:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
        monkeypatch.setenv("WORLD_SIZE", world)
        assert world_from_env() == expected
