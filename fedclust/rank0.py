"""Rank 0's outputs around the round loop: the run directory's files
(:mod:`fedclust.outputs`), W&B (:mod:`fedclust.tracking`), progress, and at
the end neighbors.npz, summary.json, the figures and the run's last line.
The round loop (:func:`fedclust.runner.run`) calls it; nothing here runs a
collective."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from fedclust.data import FederatedData
from fedclust.evaluation import summary_text
from fedclust.figures import write_run_figures
from fedclust.outputs import RunWriter, write_atomic
from fedclust.progress import make_progress
from fedclust.rank import Setup
from fedclust.schema import Config
from fedclust.state import LoopState
from fedclust.tracking import Tracker


class RankZeroOutput:
    """Rank 0's outputs around the loop: the run directory's files, W&B,
    progress, and at the end neighbors.npz, summary.json, the figures and
    the last line."""

    def __init__(self, setup: Setup, state: LoopState, run_dir: str, resumed: Path | None):
        """``resumed``: the checkpoint the run continues from (None: a fresh start)."""
        cfg = setup.cfg
        self.setup, self.state, self.run_dir = setup, state, run_dir
        say = _say
        say(f"fedclust: run directory {run_dir}; data {data_source(cfg, setup.data)}")
        if resumed:
            say(f"fedclust: resuming {run_dir} from {resumed} (round {state.round} of {cfg.rounds})")
        self.writer = RunWriter(cfg, run_dir, history=state.history if resumed is not None else None, say=say)
        self.tracker = Tracker(cfg, run_dir, state.run_id) if cfg.wandb.enabled else None
        if self.tracker is not None:
            state.run_id = self.tracker.id   # kept in the checkpoints: a continued run continues this W&B run
        self.bar = make_progress(cfg.rounds, cfg.label or cfg.algorithm.name, cfg.progress, initial=state.round)
        self.exit_code = 1

    def log_round(self, record: dict) -> None:
        self.writer.log_round(record)
        if self.tracker:
            self.tracker.log_round(record)
        if self.bar is not None:
            self.bar.set_postfix(acc=f"{record['accuracy']:.2f}")

    def note(self, line: str) -> None:
        """One line about the run, on stderr (beside the progress)."""
        _say(line)

    def round_done(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def finish_run(self, summary: dict) -> None:
        """neighbors.npz, summary.json, the figures and W&B's results; the last line of output."""
        state, cfg = self.state, self.setup.cfg
        arrays = dict(state.saved)
        if state.final_lists is not None:
            arrays["final_lists"] = state.final_lists
        if state.final_assignment is not None:
            arrays["assignment"] = state.final_assignment.cpu().numpy()
        if self.setup.attackers is not None:   # the run's attacking clients (attack.fraction), ascending ids
            arrays["attackers"] = self.setup.attackers.nonzero().flatten().numpy().astype(np.int32)
        arrays.update(self.setup.network.record(cfg.rounds))   # the graph of each redraw epoch, for a graph run
        write_atomic(self.writer.dir / "neighbors.npz", lambda tmp: _savez(tmp, arrays))
        self.writer.write_summary(summary)
        figures = _figures(self.writer.dir, summary, cfg, state.history) if cfg.figures else []
        if self.tracker:
            self.tracker.log_results(summary, [self.writer.dir / "figures" / f for f in figures], state.final_lists,
                                     state.final_assignment, self.setup.data.clusters)
        self.exit_code = 0
        self.close()
        print(summary_text(summary, self.run_dir))

    def close(self) -> None:
        """Close the progress bar, metrics file and W&B run (again: nothing)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self.writer.close()
        if self.tracker:
            self.tracker.finish(self.exit_code)   # no-op if already finished


def _savez(path: Path, arrays: dict) -> None:
    with open(path, "wb") as f:   # a file object: numpy adds no .npz to the temporary name
        np.savez_compressed(f, **arrays)


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def data_source(cfg: Config, data: FederatedData) -> str:
    """Where the run's data came from, saying when it was not ``data.root``."""
    if data.source is None:
        return f"{cfg.data.name}, generated"
    source = Path(data.source)
    given = Path(cfg.data.path).expanduser().resolve() if cfg.data.path else None
    if source.is_file() or source == given:   # a data file or folder (data.path), not a folder under data.root
        return f"{cfg.data.name} from {source}"
    root = Path(cfg.data.root).expanduser().resolve()
    if source == root or root in source.parents:
        return f"{cfg.data.name} from {source}"
    why = "does not exist" if not root.exists() else f"holds no {cfg.data.name} files"
    return f"{cfg.data.name} from {source} (fallback: data.root {cfg.data.root!r} {why})"


def _figures(run_dir: Path, summary: dict, cfg: Config, history: list[dict]) -> list[str]:
    """The run's figures; a figure that fails is reported in one line, never failing the finished run."""
    try:
        return write_run_figures(run_dir, summary, cfg, records=history)
    except Exception as exc:   # matplotlib, fonts, odd data: the run's results are already on disk
        _say(f"fedclust: figures not written ({type(exc).__name__}: {exc}); the run's metrics and summary are "
             "complete")
        return []
