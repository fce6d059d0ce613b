"""Progress in batch logs: plain lines, no carriage returns."""

import io

from fedclust.config import load_config
from fedclust.progress import LineProgress, make_progress
from fedclust.runner import prepare, run


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_line_every_n_rounds_or_m_seconds_and_at_the_end():
    out, clock = io.StringIO(), Clock()
    p = LineProgress(25, "random", out, every=10, seconds=60.0, clock=clock)
    for r in range(1, 26):
        clock.t += 2.0 if r != 13 else 70.0          # round 13 takes 70 s: a line by time
        p.set_postfix(acc=f"{50 + r:.2f}")
        p.update(1)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert [l.split(",")[0] for l in lines] == ["random: round 10/25", "random: round 13/25", "random: round 23/25",
                                                "random: round 25/25"]
    # round 10: 20 s for 10 rounds = 2.00 s/round, 15 rounds left = 30 s
    assert lines[0] == "random: round 10/25, accuracy 60.00, 2.00 s/round, ETA 0:00:30"
    assert lines[-1].endswith("ETA 0:00:00")


def test_make_progress_picks_lines_off_a_terminal_and_none_when_off():
    assert make_progress(5, "x", False) is None
    assert isinstance(make_progress(5, "x", True, io.StringIO()), LineProgress)


def test_a_run_logs_plain_lines_when_stderr_is_not_a_terminal(tmp_path, capsys):
    cfg = load_config(None, ["data.name=synthetic", "data.train_size=40", "data.test_size=20", "clients=4",
                             "rounds=3", "algorithm.name=local", "figures=false", "progress=true",
                             f"out={tmp_path / 'r'}"])
    run(cfg, prepare(cfg))
    err = capsys.readouterr().err
    assert "\r" not in err
    assert "local: round 3/3, accuracy " in err
