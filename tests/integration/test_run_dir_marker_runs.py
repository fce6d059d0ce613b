"""The whole-run tests of tests/unit/test_run_dir_marker.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import os
import sys
from pathlib import Path

from test_run_dir_marker import SMALL, config, small_run  # noqa: E402

from fedclust import checkpoint
from fedclust.cli import main
from fedclust.outputs import (
    LOCK_NAME,
    MARKER_NAME,
    check_run_dir,
    is_marked,
)
from fedclust.runner import prepare, run



_WRITES: list[tuple[str, str]] | None = None   # (event, path) of each write-intent while a test records


def _audit(event: str, args: tuple) -> None:
    if _WRITES is None or event not in ("open", "os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.symlink"):
        return
    if event == "open":
        flags = args[2] if isinstance(args[2], int) else 0
        if not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND):
            return
    target = args[1] if event in ("os.rename", "os.symlink") else args[0]
    if isinstance(target, (str, bytes, os.PathLike)):
        _WRITES.append((event, os.fsdecode(target)))


def test_a_fresh_start_in_a_run_directory_keeps_the_users_files(tmp_path, capsys):
    d = tmp_path / "run"
    small_run(d)
    (d / "figures").mkdir()
    (d / "figures" / "fig1.png").write_bytes(b"mine")
    (d / "checkpoints" / "resnet_epoch90.ckpt").write_bytes(b"mine")
    capsys.readouterr()
    summary = small_run(d, "algorithm.name=local", "overwrite=true")   # another config, replaced when asked
    assert summary["algorithm"] == "local"
    line = next(x for x in capsys.readouterr().err.splitlines() if "starting afresh" in x)
    assert "removed the earlier run's config.yaml, metrics.jsonl, summary.json, neighbors.npz, checkpoints" in line
    assert line.endswith("kept what fedclust did not write: checkpoints/resnet_epoch90.ckpt, figures/fig1.png")
    assert (d / "figures" / "fig1.png").read_bytes() == b"mine"
    assert (d / "checkpoints" / "resnet_epoch90.ckpt").read_bytes() == b"mine"
    assert [p.name for _, p in checkpoint.candidates(d)] == ["round-000004.pt", "round-000002.pt"]
    assert checkpoint.read(checkpoint.path_for(d, 4))["config"]["algorithm"]["name"] == "local"


def test_a_directory_of_an_earlier_version_resumes_and_gains_the_marker(tmp_path, capsys):
    d = tmp_path / "old"
    small_run(d)
    (d / MARKER_NAME).unlink()                                   # as an earlier fedclust left it
    (d / "summary.json").unlink()
    assert {"config.yaml", "metrics.jsonl", "checkpoints"} <= set(os.listdir(d)) and not is_marked(d)
    check_run_dir(d, overwrite=False)
    cfg = config(d, "rounds=6")
    prepared = prepare(cfg)
    assert prepared.resume_from is not None and prepared.resume_from[0].name == "round-000004.pt"
    capsys.readouterr()
    summary = run(cfg, prepared)
    assert "resuming" in capsys.readouterr().err and summary["rounds_completed"] == 6
    assert is_marked(d)


def test_the_marker_is_the_first_thing_written(tmp_path):
    global _WRITES
    sys.addaudithook(_audit)   # stays for the session: it records only while _WRITES is a list
    d = tmp_path / "run"
    _WRITES = []
    try:
        assert main(["run", *SMALL, f"out={d}", "figures=true"]) == 0
        writes = [(event, path) for event, path in _WRITES if path.startswith(str(d) + os.sep)]
    finally:
        _WRITES = None
    assert writes and writes[0] == ("open", str(d / MARKER_NAME))
    lock = writes.index(("open", str(d / LOCK_NAME)))
    assert lock == 1 and {Path(p).name for _, p in writes[2:]} >= {".config.yaml.tmp" + str(os.getpid()),
                                                                  "metrics.jsonl", "accuracy.png"}
    assert is_marked(d) and (d / "figures" / "accuracy.png").is_file()
