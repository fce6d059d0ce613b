"""Progress of a run on rank 0: a tqdm bar on a terminal; in batch logs
(stderr not a terminal: Slurm, nohup, CI) one plain line every ``every``
rounds or ``seconds`` seconds, and at the last round, instead of thousands
of carriage returns."""

from __future__ import annotations

import sys
import time

LINE_EVERY_ROUNDS = 10
LINE_EVERY_SECONDS = 60.0


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class LineProgress:
    """tqdm's ``update`` / ``set_postfix`` / ``close``, writing lines such as
    ``panm_grad: round 20/300, accuracy 81.48, 0.52 s/round, ETA 0:02:26``."""

    def __init__(self, total: int, desc: str, stream=None, every: int = LINE_EVERY_ROUNDS,
                 seconds: float = LINE_EVERY_SECONDS, clock=time.monotonic, initial: int = 0):
        self.total, self.desc, self.every, self.seconds, self.clock = total, desc, every, seconds, clock
        self.stream = stream if stream is not None else sys.stderr
        self.done = self.last_done = self.first = initial   # initial: rounds done before (a resumed run)
        self.start = self.last_time = clock()
        self.accuracy = None

    def set_postfix(self, acc=None, **_):
        self.accuracy = acc

    def update(self, n: int = 1) -> None:
        self.done += n
        now = self.clock()
        if self.done >= self.total or self.done - self.last_done >= self.every or now - self.last_time >= self.seconds:
            self.last_done, self.last_time = self.done, now
            per_round = (now - self.start) / max(self.done - self.first, 1)
            acc = "" if self.accuracy is None else f", accuracy {self.accuracy}"
            self.stream.write(f"{self.desc}: round {self.done}/{self.total}{acc}, {per_round:.2f} s/round, "
                              f"ETA {_duration(per_round * (self.total - self.done))}\n")
            self.stream.flush()

    def close(self) -> None:
        pass


def make_progress(total: int, desc: str, enabled: bool, stream=None, initial: int = 0):
    """A tqdm bar where ``stream`` (default stderr) is a terminal, else a
    :class:`LineProgress`; None when progress is off."""
    if not enabled:
        return None
    stream = stream if stream is not None else sys.stderr
    if stream.isatty():
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit="round", file=stream, initial=initial)
    return LineProgress(total, desc, stream, initial=initial)
