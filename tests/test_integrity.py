"""A checkpoint that is not what was written is never used, and every message
is true (issue 32's fault list): checksums verified on load, a run never cut
back, its compute time over every process, a failed requeue said, a full disk
in one line with no partial file, signals at start-up and after the end, a
torchrun that dies, a rank missing at start-up, a stalled collective inside an
algorithm."""

import errno
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from fedclust import checkpoint
from fedclust.cli import main
from fedclust.errors import CheckpointError
from fedclust.stopping import EXIT_REQUEUE

from test_resume import (ROOT, assert_uninterrupted, command, env, fake_scontrol, killed_run, launch, overrides,
                         wait_for_lines)

HOOKS = "tests/plugins/process_hooks.py"


def corrupt_weights(path: Path, seed: int = 0) -> None:
    """64 random bytes into the middle of the largest tensor's stored bytes (the weights), not the pickle: the
    zip's headers and the pickled structure are untouched, so the file still loads."""
    with zipfile.ZipFile(path) as z:
        big = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(big.header_offset)
        name_len, extra_len = struct.unpack("<HH", f.read(30)[26:30])
        start = big.header_offset + 30 + name_len + extra_len
        assert big.file_size > 128
        f.seek(start + big.file_size // 2 - 32)
        f.write(torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(seed),
                              dtype=torch.uint8).numpy().tobytes())


# ----------------------------------------------------------------------------
# Checksums


def test_a_checkpoint_carries_a_checksum_of_its_contents_checked_on_load(tmp_path):
    x = torch.arange(4096, dtype=torch.float32)
    for r in (1, 2):
        checkpoint.write(tmp_path, r, {"config": {}, "x": x * r, "history": [{"a": 0.1}]})
    newest = checkpoint.path_for(tmp_path, 2)
    assert checkpoint.read(newest)["checksum"] == checkpoint.digest(checkpoint.read(newest))
    corrupt_weights(newest)
    torch.load(newest, weights_only=True)                       # the file still loads: only the checksum sees it
    with pytest.raises(ValueError, match="do not match the checksum"):
        checkpoint.read(newest)
    with pytest.warns(UserWarning, match="round-000002.pt cannot be used .*checksum"):
        path, payload = checkpoint.newest(tmp_path)
    assert path.name == "round-000001.pt" and torch.equal(payload["x"], x)


def test_the_digest_sees_every_value_and_nothing_else():
    base = {"w": torch.zeros(3), "h": [{"acc": 1.0, "n": None}], "t": (1, "a"), "m": {"bits": torch.ones(2, 1)}}
    d = checkpoint.digest(base)
    assert checkpoint.digest(dict(base, checksum="anything")) == d          # the checksum itself is not hashed
    assert checkpoint.digest({k: base[k] for k in reversed(base)}) == d    # key order is not content
    changed = [dict(base, w=torch.tensor([0.0, 0.0, 1e-45])), dict(base, w=torch.zeros(3, dtype=torch.float64)),
               dict(base, w=torch.zeros(1, 3)), dict(base, h=[{"acc": 1.0000000000000002, "n": None}]),
               dict(base, t=[1, "a"]), dict(base, m={"bits": torch.ones(2, 1, dtype=torch.uint8)})]
    assert len({checkpoint.digest(c) for c in changed} | {d}) == len(changed) + 1


def test_a_checkpoint_before_checksums_is_used_unverified_with_a_warning(tmp_path):
    d = checkpoint.directory(tmp_path)
    d.mkdir(parents=True)
    torch.save({"format": 1, "round": 3, "complete": True, "x": torch.ones(2)}, d / "round-000003.pt")
    with pytest.warns(UserWarning, match="without a checksum: it is used unverified"):
        path, payload = checkpoint.newest(tmp_path)
    assert path.name == "round-000003.pt" and payload["verified"] is False


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A 1-process oracle run SIGKILLed after round 5 of 8 (checkpoints of rounds 4 and 2)."""
    out = tmp_path_factory.mktemp("killed") / "run"
    killed_run(1, "oracle", out)
    return out


@pytest.mark.integration
def test_a_damaged_newest_checkpoint_is_skipped_and_the_run_ends_as_uninterrupted(killed, tmp_path):
    """Then: the run's record names its compute time over both processes; a finished run is never cut back."""
    out = tmp_path / "run"
    shutil.copytree(killed, out)
    corrupt_weights(checkpoint.path_for(out, 4))
    proc = launch(1, overrides("oracle", out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "round-000004.pt cannot be used" in proc.stderr and "do not match the checksum" in proc.stderr
    assert "from " in proc.stderr and "round-000002.pt (round 2 of 8)" in proc.stderr
    assert_uninterrupted("oracle", out, 1, tmp_path / "whole")

    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(x)["round_seconds"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert summary["starts"] == 2
    assert summary["wall_seconds"] > summary["process_seconds"] > 0
    assert summary["wall_seconds"] >= sum(rounds)        # rounds 1-5 of the killed process are counted
    assert f"8 rounds in {summary['wall_seconds']:.1f}s over 2 processes" in proc.stdout

    before = {f: (out / f).read_bytes() for f in ("summary.json", "config.yaml", "metrics.jsonl")}
    shorter = launch(1, overrides("oracle", out, "rounds=4"))
    assert shorter.returncode == 2
    assert "'rounds' = 4" in shorter.stderr and "finished 8 rounds" in shorter.stderr
    assert "another out=DIR" in shorter.stderr and "overwrite=true" in shorter.stderr
    assert {f: (out / f).read_bytes() for f in before} == before        # the record is untouched


@pytest.mark.integration
def test_with_every_checkpoint_damaged_the_run_names_them_and_touches_nothing(killed, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(killed, out)
    for r in (4, 2):
        corrupt_weights(checkpoint.path_for(out, r), seed=r)
    metrics = (out / "metrics.jsonl").read_bytes()
    proc = launch(1, overrides("oracle", out))
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fedclust: error: no checkpoint under") and "diverged" not in proc.stderr
    assert "round-000004.pt: ValueError: its contents do not match the checksum" in last
    assert "round-000002.pt: ValueError: its contents do not match the checksum" in last
    assert "overwrite=true" in last
    assert (out / "metrics.jsonl").read_bytes() == metrics
    assert [r for r, _ in checkpoint.candidates(out)] == [4, 2]


# ----------------------------------------------------------------------------
# A full disk


def _write_fails_midway(monkeypatch):
    real = torch.save

    def save(obj, f, *args, **kwargs):
        f.write(b"x" * 1000)   # part of the file is on disk when the device fills
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", save)
    return real


def test_a_checkpoint_that_does_not_fit_is_not_begun_and_a_failed_write_leaves_no_file(tmp_path, monkeypatch):
    checkpoint.write(tmp_path, 2, {"x": torch.zeros(1000)})
    Usage = type(shutil.disk_usage(tmp_path))
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(CheckpointError) as e:
        checkpoint.write(tmp_path, 4, {"x": torch.zeros(10**6)})
    text = str(e.value)
    assert f"round-000004.pt in {checkpoint.directory(tmp_path)}" in text and "no space left" in text
    assert "needs about 5.0 MB, 1.0 KB free" in text and "continues from round-000002.pt (round 2)" in text
    assert sorted(p.name for p in checkpoint.directory(tmp_path).iterdir()) == ["round-000002.pt"]

    monkeypatch.undo()
    _write_fails_midway(monkeypatch)
    for attempt in range(3):   # each retry fails the same way and leaves nothing behind
        with pytest.raises(CheckpointError, match="no space left on the device"):
            checkpoint.write(tmp_path, 4, {"x": torch.zeros(10)})
        assert sorted(p.name for p in checkpoint.directory(tmp_path).iterdir()) == ["round-000002.pt"]


def test_stale_partial_files_are_removed_before_a_write(tmp_path):
    d = checkpoint.directory(tmp_path)
    d.mkdir(parents=True)
    (d / "round-000002.pt.tmp123").write_bytes(b"x" * 100)
    (d / "resnet.pt.tmp1").write_bytes(b"a user's")             # not fedclust's: it stays
    checkpoint.write(tmp_path, 3, {"x": torch.zeros(2)})
    assert sorted(p.name for p in d.iterdir()) == ["resnet.pt.tmp1", "round-000003.pt"]


def test_a_full_disk_during_a_run_ends_in_one_line(tmp_path, monkeypatch, capsys):
    _write_fails_midway(monkeypatch)
    out = tmp_path / "r"
    rc = main(["run", *overrides("local", out, "rounds=3")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"fedclust: error: cannot write checkpoint round-000002.pt in {out / 'checkpoints'}")
    assert "it starts again from round 1" in line
    assert not list((out / "checkpoints").glob("*.tmp*"))


def _tmpfs(path: Path, size: str):
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here to fill a disk ({proc.stderr.strip() or 'not root'}); "
                    "the full-disk paths are tested with a failing write above")


@pytest.mark.integration
def test_a_real_full_disk_ends_in_one_line_and_leaves_no_partial_file(tmp_path):
    disk = tmp_path / "disk"
    _tmpfs(disk, "8m")
    try:
        out = disk / "run"
        args = overrides("local", out, "rounds=3", "checkpoint_every=2")
        # fill the disk but for what config.yaml and three metrics lines take: no checkpoint fits
        filler = disk / "filler"
        with open(filler, "wb") as f:
            try:
                f.write(b"\0" * (shutil.disk_usage(disk).free - 40_000))
            except OSError:
                pass
        for _ in range(2):   # the same command again: the same line, nothing left behind
            proc = launch(1, args)
            assert proc.returncode == 2, proc.stderr[-3000:]
            assert "Traceback" not in proc.stderr
            line = proc.stderr.strip().splitlines()[-1]
            assert line.startswith("fedclust: error: cannot write checkpoint round-000002.pt"), line
            assert "no space left on the device (it needs about" in line and "free)" in line
            assert not [p for p in out.rglob("*") if ".tmp" in p.name]
        filler.unlink()
        proc = launch(1, args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 3
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


# ----------------------------------------------------------------------------
# Signals and messages


@pytest.mark.integration
def test_a_failed_requeue_is_said_and_never_called_a_requeue(tmp_path):
    bin_dir, log = fake_scontrol(tmp_path)
    script = bin_dir / "scontrol"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\necho 'Requested operation is presently disabled' >&2\n"
                      "exit 1\n")
    out = tmp_path / "s"
    args = overrides("random", out, "rounds=100000", "checkpoint_every=0")
    proc = subprocess.Popen(command(1, args), cwd=ROOT, env=env(PATH=f"{bin_dir}:{os.environ['PATH']}",
                                                                SLURM_JOB_ID="4242"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for_lines(out / "metrics.jsonl", 3, proc)
    proc.send_signal(signal.SIGUSR1)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_REQUEUE, err[-3000:]
    assert log.read_text().split() == ["requeue", "4242"]
    assert "scontrol requeue 4242 failed (Requested operation is presently disabled)" in err
    assert "requeued" not in err.replace("not requeued", "")
    assert "Slurm job 4242 was not requeued: resubmit it (or run the same command again) to continue" in err


def _signal_at_marker(args, marker: Path, sig=signal.SIGTERM, **extra_env):
    proc = subprocess.Popen(command(1, args), cwd=ROOT, env=env(**extra_env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    end = time.time() + 120
    while not marker.exists():
        assert proc.poll() is None and time.time() < end, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    sent = time.time()
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err, time.time() - sent


@pytest.mark.integration
def test_a_signal_during_start_up_stops_at_once_and_says_so(tmp_path):
    # while the config loads (a plugin's import), before the run begins
    marker = tmp_path / "importing"
    args = overrides("local", tmp_path / "a", f"plugins=[{HOOKS}]")
    rc, _, err, took = _signal_at_marker(args, marker, SLOW_IMPORT_MARKER=str(marker))
    assert rc == EXIT_REQUEUE and took < 20, err[-3000:]
    assert err.strip().splitlines()[-1] == ("fedclust: stopped on SIGTERM during start-up, before round 1; nothing "
                                            "was written (it starts from round 1); run the same command again to "
                                            "continue")
    # while the data loads, inside the run, continuing a run from its checkpoint of round 2
    out = tmp_path / "b"
    args = overrides("local", out, f"plugins=[{HOOKS}]", "data.name=slow_blobs", "rounds=2")
    first = launch(1, args)
    assert first.returncode == 0, first.stderr[-3000:]
    marker = tmp_path / "loading"
    metrics = (out / "metrics.jsonl").read_bytes()
    rc, _, err, took = _signal_at_marker(args[:-1] + ["rounds=4"], marker, SLOW_DATA_MARKER=str(marker))
    assert rc == EXIT_REQUEUE and took < 20, err[-3000:]
    assert err.strip().splitlines()[-1] == (f"fedclust: stopped on SIGTERM during start-up, before round 3; nothing "
                                            f"was written (it continues from {checkpoint.path_for(out, 2)} (round "
                                            "2)); run the same command again to continue")
    assert (out / "metrics.jsonl").read_bytes() == metrics
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 2


@pytest.mark.integration
def test_a_signal_after_the_last_line_changes_nothing(tmp_path):
    marker = tmp_path / "exiting"
    out = tmp_path / "r"
    rc, stdout, err, _ = _signal_at_marker(overrides("local", out, f"plugins=[{HOOKS}]"), marker,
                                           LINGER_MARKER=str(marker))
    assert rc == 0, err[-3000:]
    assert "local: final accuracy" in stdout
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 8


@pytest.mark.integration
def test_workers_stop_with_a_checkpoint_when_torchrun_dies(tmp_path):
    """SIGUSR1 kills torchrun (it does not handle it); its workers then stop as on SIGTERM, after a checkpoint,
    instead of running on without a parent."""
    out = tmp_path / "t"
    proc = subprocess.Popen(command(2, overrides("random", out, "rounds=100000", "checkpoint_every=0")), cwd=ROOT,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for_lines(out / "metrics.jsonl", 3, proc)
    workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(workers) == 2
    proc.send_signal(signal.SIGUSR1)
    try:
        _, err = proc.communicate(timeout=90)   # the pipes close when the workers have exited
    finally:
        for pid in workers:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == -signal.SIGUSR1
    assert err.count("fedclust: stopped on SIGTERM after round") == 2, err[-3000:]
    stopped = [r for r, _ in checkpoint.candidates(out)][0]
    assert stopped == len((out / "metrics.jsonl").read_text().splitlines())


# ----------------------------------------------------------------------------
# Hangs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.integration
def test_a_rank_missing_at_start_up_is_named_after_the_start_up_timeout(tmp_path):
    """Two processes of a 2-process run started by hand (as on two nodes), each without the other: each ends
    after startup_timeout, naming the missing rank, not after collective_timeout."""
    procs = []
    for node in (0, 1):
        extra = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="2", LOCAL_WORLD_SIZE="1",
                     NODE_RANK=str(node), LOCAL_RANK="0")
        args = overrides("random", tmp_path / f"r{node}", "startup_timeout=4", "collective_timeout=300")
        procs.append(subprocess.Popen(command(1, args), cwd=ROOT, env=env(**extra), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True))
    started = time.time()
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert time.time() - started < 60
    assert [p.returncode for p in procs] == [2, 2], errs
    assert errs[0].strip().splitlines()[-1].startswith(
        "fedclust: error: rank 0: rank 1 did not start within startup_timeout = 4 s (1 of 2 processes did)")
    assert "rank 1: rank 0 did not open the run's rendezvous" in errs[1].strip().splitlines()[-1]
    assert "startup_timeout = 4 s" in errs[1]


@pytest.mark.integration
def test_a_collective_inside_an_algorithm_that_stalls_names_the_rank_and_round(tmp_path):
    """IFCA's all-reduce of a restart's objective (round 3) goes through the run's wrapper."""
    args = overrides("stalling_ifca", tmp_path / "i", "plugins=[tests/plugins/stalling_ifca.py]",
                     "stalling_ifca.rank=1", "stalling_ifca.round=3", "collective_timeout=5")
    started = time.time()
    proc = launch(2, args)
    assert time.time() - started < 100
    assert proc.returncode != 0
    assert "fedclust: error: rank 0: a collective in round 3 failed or timed out (collective_timeout = 5 s)" in \
        proc.stderr, proc.stderr[-3000:]
