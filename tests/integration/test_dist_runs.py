"""The distributed edge's start in a fresh process: one process gets no Fabric (none of its imports); several get
Fabric, imported without the torchmetrics its version probe would pull in nor the torch._dynamo its wrappers would
(a launched Python: what a process has imported is the claim)."""

import os
import subprocess
import sys

import pytest
from test_dist import LAUNCHER_VARS, ROOT

pytestmark = pytest.mark.integration


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
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "after one-process start: False"
    assert lines[1] == "after import_fabric: lightning_fabric False absent"   # hidden during the import, then unhidden
    assert lines[2] in ("torchmetrics importable: torchmetrics", "torchmetrics importable: not installed")
    assert lines[3] == "torch._dynamo imported: False False"
    assert lines[4] == "then: torch._dynamo.eval_frame"   # the real module, not the stand-in
