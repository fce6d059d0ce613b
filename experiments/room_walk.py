"""The walk of ``runner.run(cfg)`` through fedclust's modules ("rooms"), measured: one in-process run of the
golden settings (tests/golden/record.py: 8 clients, 8 rounds, synthetic MLP) under a profile hook that counts
every call from one fedclust module into another, by the module entered.

    python experiments/room_walk.py [ALGORITHM ...]      # default: panm_grad

Prints, per algorithm, how many modules the run enters and how often, the most entered first.  Counts calls, not
time; the run itself is the golden run (its numbers do not change under the hook)."""

from __future__ import annotations

import collections
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOWN = ("fedclust.rank0", "fedclust.evaluation", "fedclust.checkpoint", "fedclust.state", "fedclust.exchange")


def walk(name: str) -> collections.Counter:
    from record import GOLDEN_OVERRIDES

    from fedclust.config import load_config
    from fedclust.runner import prepare, run

    cfg = load_config(None, [*GOLDEN_OVERRIDES, f"algorithm.name={name}", f"out={tempfile.mkdtemp()}/run"])
    prep = prepare(cfg)
    entered: collections.Counter = collections.Counter()

    def hook(frame, event, arg):
        if event != "call" or frame.f_back is None:
            return
        callee, caller = frame.f_globals.get("__name__", ""), frame.f_back.f_globals.get("__name__", "")
        if callee != caller and callee.startswith("fedclust") and caller.startswith("fedclust"):
            entered[callee] += 1

    sys.setprofile(hook)
    try:
        run(cfg, prep)
    finally:
        sys.setprofile(None)
    return entered


def main(argv: list[str]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "golden")]
    for name in argv or ["panm_grad"]:
        entered = walk(name)
        print(f"{name}: {len(entered)} modules entered, {sum(entered.values())} entries from another module")
        for module, count in entered.most_common(10) + [(m, entered[m]) for m in SHOWN]:
            print(f"  {count:6d}  {module}")


if __name__ == "__main__":
    main(sys.argv[1:])
