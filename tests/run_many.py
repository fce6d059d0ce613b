"""Several runs in one launch: ``python tests/run_many.py RUNS.json`` (or under torchrun) runs each argument list
of RUNS.json (``fedclust run ARGS``) after the other in the same processes, as a script calling
``fedclust.runner.run`` in a loop would.  The processes start, import torch and Lightning and form their first
group once, which is most of a small run's cost on a CPU; each run still forms its own process group (keyed apart
on the rendezvous, fedclust.dist.startup_store) and ends it.  Exits with the first failing run's status.

``python tests/run_many.py --kill-after R RUNS.json`` (one process, or each rank under torchrun): each run in a
child forked from this process (torch already imported), which stops after round R with the tests' pause plug-in
(tests/plugins/pause_after_round.py, given in each run's arguments: rank 0 pauses, the other ranks wait for it in
the next round's gather) and is then killed with SIGKILL, as a node failure would kill it: its run directory is
left as such a crash leaves it.  Under torchrun, every other rank kills its child first and says so
(``<out>/.killed.<rank>``), then rank 0 kills its own, so that no rank outlives another to see it gone."""

import json
import os
import signal
import sys
import time
from pathlib import Path

from fedclust.cli import main

PAUSE_TIMEOUT = 240   # seconds a run may take to reach the round it stops after


def kill_after(runs: list[list[str]], after: int) -> None:
    os.environ["PAUSE_AFTER_ROUND"] = str(after)
    import fedclust.runner  # noqa: F401  (torch and the run's modules, once: fedclust.cli imports them lazily, and
    # each child would otherwise import them again, about 4 s of a 2-core CPU each against 0.4 s for its run)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")   # set under torchrun
    for i, args in enumerate(runs):
        out = Path(next(a.split("=", 1)[1] for a in args if a.startswith("out=")))
        if run_id:   # each child starts from this process's count of finished runs (none): its run is keyed
            os.environ["TORCHELASTIC_RUN_ID"] = f"{run_id}-killed-{i}"   # apart on the rendezvous by its index
        pid = os.fork()
        if pid == 0:   # the run, in a child: it pauses after round `after` and waits there to be killed
            try:
                main(["run", *args])
            finally:
                os._exit(3)   # never past its pause: reaching here is a failure the parent reports
        others = [out / f".killed.{r}" for r in range(1, world)] if rank == 0 else []
        wait_for(pid, [out / ".paused", *others], out)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            sys.exit(f"run_many: the run in {out} was not ended by SIGKILL (status {status})")
        if rank:
            (out / f".killed.{rank}").touch()
        for marker in others:   # gone, as the crash leaves the directory
            marker.unlink()


def wait_for(pid: int, markers: list[Path], out: Path) -> None:
    """Until every file of ``markers`` exists; exits, saying so, if the child ``pid`` ends first or takes longer
    than PAUSE_TIMEOUT."""
    end = time.time() + PAUSE_TIMEOUT
    while not all(m.exists() for m in markers):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done or time.time() > end:
            sys.exit(f"run_many: the run in {out} ended or took too long before pausing (status {status})")
        time.sleep(0.02)


if __name__ == "__main__":
    argv = sys.argv[1:]
    after = None
    if argv[0] == "--kill-after":
        after, argv = int(argv[1]), argv[2:]
    with open(argv[0]) as f:
        runs = json.load(f)
    if after is not None:
        kill_after(runs, after)
        sys.exit(0)
    for args in runs:
        code = main(["run", *args])
        if code:
            sys.exit(code)
