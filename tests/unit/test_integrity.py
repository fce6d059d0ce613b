"""A checkpoint that is not what was written is never used, and every message
is true (issue 32's fault list): checksums verified on load, a run never cut
back, its compute time over every process, a failed requeue said, a full disk
in one line with no partial file, signals at start-up and after the end, a
torchrun that dies, a rank missing at start-up, a stalled collective inside an
algorithm."""

import errno
import shutil
import signal
import socket
import struct
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
import torch
from test_resume import (
    ROOT,
    command,
    env,
    killed_run,
    overrides,
)

from fedclust import checkpoint
from fedclust.cli import main
from fedclust.errors import CheckpointError

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


# ----------------------------------------------------------------------------
# Signals and messages


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


# ----------------------------------------------------------------------------
# Hangs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


