"""The distributed edge's start: one process gets no Fabric (no process
group, none of Fabric's imports); several get Fabric, imported without the
torchmetrics its version probe would pull in nor the torch._dynamo its wrappers would."""

import subprocess
import sys
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


CHILD = """
import sys
from fedclust.dist import import_fabric, make_fabric
make_fabric("cpu")
print("after one-process start:", "lightning_fabric" in sys.modules)
Fabric, DDPStrategy = import_fabric()
print("after import_fabric:", Fabric.__module__.split(".")[0], "torchmetrics" in sys.modules,
      sys.modules.get("torchmetrics", "absent"))
try:
    import torchmetrics  # later imports of it still work where it is installed
    print("torchmetrics importable:", torchmetrics.__name__)
except ModuleNotFoundError as e:
    print("torchmetrics importable:", "not installed" if e.name == "torchmetrics" else repr(e))
print("torch._dynamo imported:", "torch._dynamo" in sys.modules, "sympy" in sys.modules)
import torch._dynamo  # the real one, once something asks for it
print("then:", torch._dynamo.OptimizedModule.__module__)
"""


def test_fabric_is_imported_only_for_several_processes_and_without_torchmetrics_or_dynamo():
    env = {k: v for k, v in __import__("os").environ.items() if k not in LAUNCHER_VARS}
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "after one-process start: False"
    assert lines[1] == "after import_fabric: lightning_fabric False absent"   # hidden during the import, then unhidden
    assert lines[2] in ("torchmetrics importable: torchmetrics", "torchmetrics importable: not installed")
    assert lines[3] == "torch._dynamo imported: False False"
    assert lines[4] == "then: torch._dynamo.eval_frame"   # the real module, not the stand-in
