"""Several runs in one launch: ``python tests/run_many.py RUNS.json`` (or under torchrun) runs each argument list
of RUNS.json (``fedclust run ARGS``) after the other in the same processes, as a script calling
``fedclust.runner.run`` in a loop would.  The processes start, import torch and Lightning and form their first
group once, which is most of a small run's cost on a CPU; each run still forms its own process group (keyed apart
on the rendezvous, fedclust.dist.startup_store) and ends it.  Exits with the first failing run's status."""

import json
import sys

from fedclust.cli import main

if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        runs = json.load(f)
    for args in runs:
        code = main(["run", *args])
        if code:
            sys.exit(code)
