"""Test plug-in: with PAUSE_AFTER_ROUND=r in the environment, rank 0 stops
after round r's metrics (and checkpoint, if due) are written, creates
``<run dir>/.paused`` and waits there, so that a test can SIGKILL the job at
a known round.  Loaded with ``plugins=[tests/plugins/pause_after_round.py]``."""

import os
import time
from pathlib import Path

from fedclust.runner import add_round_end_hook

AFTER = int(os.environ.get("PAUSE_AFTER_ROUND", "0"))


def pause(s, state, run_dir):
    if state.round == AFTER and s.rank == 0:
        (Path(run_dir) / ".paused").touch()
        while True:
            time.sleep(3600)


if AFTER:
    add_round_end_hook(pause)
