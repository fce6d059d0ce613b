"""The whole-run tests of tests/unit/test_integrity.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import json
import os
import shutil
import signal
import subprocess
import time

from test_integrity import HOOKS, _free_port, _signal_at_marker, _tmpfs, corrupt_weights, killed  # noqa: E402, F401  (fixtures among them)
from test_resume import ROOT, assert_uninterrupted, command, env, fake_scontrol, launch, overrides, wait_for_lines

from fedclust import checkpoint
from fedclust.stopping import EXIT_REQUEUE


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


def test_a_signal_after_the_last_line_changes_nothing(tmp_path):
    marker = tmp_path / "exiting"
    out = tmp_path / "r"
    rc, stdout, err, _ = _signal_at_marker(overrides("local", out, f"plugins=[{HOOKS}]"), marker,
                                           LINGER_MARKER=str(marker))
    assert rc == 0, err[-3000:]
    assert "local: final accuracy" in stdout
    assert json.loads((out / "summary.json").read_text())["rounds_completed"] == 8


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
