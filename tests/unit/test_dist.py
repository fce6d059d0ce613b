"""The distributed edge's start: one process gets no Fabric and no process group (what a fresh process imports:
tests/integration/test_dist_runs.py)."""

from pathlib import Path

import torch

from fedclust.dist import OneProcess, gather_parts, gather_rows, make_fabric

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER_VARS = ("LOCAL_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES")


def test_one_process_is_rank_0_of_1_on_its_device(monkeypatch):
    for var in LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    fabric = make_fabric("cpu")
    assert isinstance(fabric, OneProcess)
    assert (fabric.world_size, fabric.global_rank, fabric.device) == (1, 0, torch.device("cpu"))
    fabric.barrier()
    rows = torch.arange(6.0).view(3, 2)
    assert gather_rows(fabric, rows, 3) is rows                       # nothing to gather: the rows themselves
    parts = [rows, rows[:, :1]]
    assert all(a is b for a, b in zip(gather_parts(fabric, parts, 3), parts, strict=True))
