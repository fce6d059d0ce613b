"""Launching several runs at once for tests that compare many runs (tests/run_many.py): one 1-process job and
one 2-process job for a whole list of configs, instead of one job each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_MANY = Path(__file__).resolve().parent / "run_many.py"


def _command(nproc: int, *args: str) -> list[str]:
    """``tests/run_many.py ARGS`` on ``nproc`` processes (torchrun for 2 or more)."""
    if nproc == 1:
        return [sys.executable, str(RUN_MANY), *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(RUN_MANY),
            *args]


def launch_many(nproc: int, runs: list[list[str]], where: Path, env: dict, timeout: float = 900):
    """Run each argument list of ``runs`` (``fedclust run ARGS``) one after the other in one job of ``nproc``
    processes (torchrun for 2 or more); their list is written to ``where``."""
    where.write_text(json.dumps(runs))
    return subprocess.run(_command(nproc, str(where)), cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True)


def killed_many(runs: list[list[str]], after: int, where: Path, env: dict, timeout: float = 900, nproc: int = 1):
    """Each run of ``runs`` on ``nproc`` processes, killed with SIGKILL after round ``after`` (on each process,
    each run in a child forked from one that has imported fedclust: tests/run_many.py --kill-after, one job for
    all); the runs' arguments must load the pause plug-in (tests/plugins/pause_after_round.py)."""
    where.write_text(json.dumps(runs))
    return subprocess.run(_command(nproc, "--kill-after", str(after), str(where)), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, start_new_session=True)
