"""Test plug-in: with SLOW_ROUND_SECONDS=s in the environment, every rank
sleeps s seconds after each round of a job's first start (Slurm's
SLURM_RESTART_COUNT unset or 0), so that a test's signal lands mid-run
without the run computing for long; a requeued job, and a run without the
variable (the one-process reference), run at full speed.  Loaded with
``plugins=[tests/plugins/slow_rounds.py]``."""

import os
import time

from fedclust.runner import add_round_end_hook

SECONDS = float(os.environ.get("SLOW_ROUND_SECONDS", "0"))

if SECONDS > 0 and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
    add_round_end_hook(lambda setup, state, run_dir: time.sleep(SECONDS))
