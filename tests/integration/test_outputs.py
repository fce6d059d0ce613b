"""Nothing lost, nothing silent: the run directory is never replaced unless
asked, metrics.jsonl is rebuilt from the checkpoint, bad output folders and
W&B without credentials are refused before any data is read, the data folder
actually read is recorded, undefined metrics are null."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedclust import checkpoint
from fedclust.cli import main
from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.outputs import metrics_line, sync_metrics
from fedclust.runner import prepare, run

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["data.name=synthetic", "data.train_size=40", "data.test_size=20", "clients=8", "rounds=4",
         "stage1_rounds=2", "algorithm.k=2", "algorithm.l=3", "progress=false", "figures=false", "seed=5"]


def small_run(out, *extra):
    cfg = load_config(None, SMALL + [f"out={out}", *extra])
    return run(cfg, prepare(cfg))


def records(d: Path) -> list[dict]:
    """metrics.jsonl without wall times."""
    return [{k: v for k, v in json.loads(x).items() if k != "round_seconds"}
            for x in (d / "metrics.jsonl").read_text().splitlines()]


def files(d: Path) -> dict:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------
# The run directory is never replaced unless asked


def test_a_run_without_checkpoint_is_not_replaced_by_another_config(tmp_path):
    small_run(tmp_path / "done", "algorithm.name=random")
    killed = tmp_path / "killed"      # a job killed before its first checkpoint: config and metrics only
    killed.mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        shutil.copy(tmp_path / "done" / name, killed / name)
    before = files(killed)
    with pytest.raises(ConfigError) as e:
        small_run(killed, "algorithm.name=local")
    msg = str(e.value)
    assert e.value.field == "out" and "config.yaml, metrics.jsonl" in msg and "algorithm.name" in msg
    assert "overwrite=true" in msg and "another out=DIR" in msg
    assert files(killed) == before     # nothing written


def test_overwrite_true_replaces_and_the_same_config_restarts(tmp_path, capsys):
    small_run(tmp_path / "done", "algorithm.name=random")
    killed = tmp_path / "killed"
    killed.mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        shutil.copy(tmp_path / "done" / name, killed / name)
    (killed / "metrics.jsonl").write_text((killed / "metrics.jsonl").read_text().splitlines()[0] + "\n")
    # The same config that never checkpointed runs again from round 1, ending as the uninterrupted run.
    small_run(killed, "algorithm.name=random")
    assert "removed the earlier run's config.yaml, metrics.jsonl" in capsys.readouterr().err
    assert records(killed) == records(tmp_path / "done")
    # Another config replaces it only when asked, and none of the old run's files stay behind.
    summary = small_run(killed, "algorithm.name=local", "overwrite=true")
    assert summary["algorithm"] == "local"
    assert load_config(killed / "config.yaml").algorithm.name == "local"
    assert [c.name for _, c in checkpoint.candidates(killed)] == ["round-000004.pt"]
    assert checkpoint.read(checkpoint.path_for(killed, 4))["config"]["algorithm"]["name"] == "local"


def test_a_finished_run_without_checkpoints_is_refused(tmp_path):
    out = tmp_path / "r"
    small_run(out, "algorithm.name=local")
    shutil.rmtree(out / "checkpoints")
    with pytest.raises(ConfigError, match="finished run without checkpoints"):
        small_run(out, "algorithm.name=local")


# ----------------------------------------------------------------------------
# metrics.jsonl agrees with the checkpoint


def test_sync_metrics_keeps_rebuilds_and_cuts(tmp_path):
    history = [{"round": 1, "accuracy": 50.0, "loss": float("nan")}, {"round": 2, "accuracy": 60.5, "loss": 1.0}]
    lines = [json.dumps({"round": 1, "accuracy": 50.0, "loss": None}) + "\n",
             json.dumps({"round": 2, "accuracy": 60.5, "loss": 1.0}) + "\n"]
    assert [metrics_line(r) for r in history] == lines
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(lines) + '{"round": 3, "accuracy": 1.0}\n{"rou')   # rounds after the checkpoint
    assert sync_metrics(path, history) is None and path.read_text() == "".join(lines)
    path.write_text(lines[0] + "garbage}}}\n" + '{"round": 3}\n')
    said = sync_metrics(path, history)
    assert "line 2 differed" in said and "2 records" in said and path.read_text() == "".join(lines)
    path.write_text(lines[0][:10])                                         # cut inside the first line
    assert "line 1 differed" in sync_metrics(path, history) and path.read_text() == "".join(lines)
    path.write_text(lines[0])                                              # a line short
    assert "it had 1 of its lines" in sync_metrics(path, history) and path.read_text() == "".join(lines)


def test_corrupted_metrics_line_is_rebuilt_on_resume(tmp_path, capsys):
    out, whole = tmp_path / "r", tmp_path / "whole"
    small_run(out, "algorithm.name=random", "checkpoint_every=2")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    lines[1] = "garbage}}}"
    (out / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    small_run(out, "algorithm.name=random", "checkpoint_every=2", "rounds=6", "figures=true")
    err = capsys.readouterr().err
    assert f"{out / 'metrics.jsonl'} disagreed with the checkpoint (line 2 differed" in err
    small_run(whole, "algorithm.name=random", "checkpoint_every=2", "rounds=6")
    assert records(out) == records(whole)
    assert (out / "figures" / "accuracy.png").stat().st_size > 1000


# ----------------------------------------------------------------------------
# Refused before any data is read or any directory is made


def test_out_below_a_plain_file_is_refused_up_front(tmp_path, capsys):
    (tmp_path / "plain").write_text("x")
    out = tmp_path / "plain" / "run"
    cfg = load_config(None, SMALL + [f"out={out}"])
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    assert e.value.field == "out" and "is a file, not a folder" in str(e.value)
    assert main(["run", *SMALL, f"out={out}"]) == 2
    assert "config field 'out'" in capsys.readouterr().err


def wandb_env(tmp_path, **extra):
    keep = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    return dict(keep, HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1", **extra)


def test_wandb_online_without_credentials_is_refused_before_anything(tmp_path):
    (tmp_path / "home").mkdir()
    out = tmp_path / "w"
    proc = subprocess.run([sys.executable, "-m", "fedclust", "run", *SMALL, f"out={out}", "wandb.enabled=true"],
                          cwd=ROOT, env=wandb_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "wandb login" in proc.stderr and "wandb.mode=offline" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_wandb_credentials_found_in_env_or_netrc(tmp_path):
    from fedclust.tracking import check_credentials

    cfg = load_config(None, SMALL + ["wandb.enabled=true"])
    (tmp_path / "home").mkdir()
    with pytest.raises(ConfigError):
        check_credentials(cfg, env=wandb_env(tmp_path))
    check_credentials(cfg, env=wandb_env(tmp_path, WANDB_API_KEY="x" * 40))
    check_credentials(cfg, env=wandb_env(tmp_path, WANDB_MODE="offline"))
    (tmp_path / "home" / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    check_credentials(cfg, env=wandb_env(tmp_path))
    with pytest.raises(ConfigError, match="example.org"):   # another server: its own entry is needed
        check_credentials(cfg, env=wandb_env(tmp_path, WANDB_BASE_URL="https://example.org"))
    check_credentials(load_config(None, SMALL + ["wandb.enabled=true", "wandb.mode=offline"]),
                      env=wandb_env(tmp_path, WANDB_BASE_URL="https://example.org"))


# ----------------------------------------------------------------------------
# What the run records


def test_data_folder_read_is_recorded_with_its_fallback(tmp_path, capsys):
    from fedclust.data import sources

    deb = sources.debian_fmnist_folder()
    if deb is None:
        pytest.skip(f"the Debian package {sources.DEBIAN_PACKAGE} is not installed: no fallback folder to test")
    cfg = load_config(None, ["data.name=fmnist", f"data.root={tmp_path / 'nowhere'}", "data.download=false",
                             "data.train_size=20", "data.test_size=10", "clients=4", "rounds=1", "stage1_rounds=1",
                             "algorithm.k=1", "algorithm.l=2", "progress=false", "figures=false",
                             f"out={tmp_path / 'r'}"])
    summary = run(cfg, prepare(cfg))
    assert summary["data_source"] == str(deb)
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["data_source"] == str(deb)
    err = capsys.readouterr().err
    first = next(line for line in err.splitlines() if line.startswith("fedclust:"))
    assert first == (f"fedclust: run directory {tmp_path / 'r'}; data fmnist from {deb} (fallback: data.root "
                     f"{str(tmp_path / 'nowhere')!r} does not exist)")


def test_undefined_is_null_and_the_share_of_all_same_cluster_lists(tmp_path):
    local = small_run(tmp_path / "local", "algorithm.name=local")
    assert local["neighbor_precision"] is None and local["neighbor_recall"] is None
    assert local["data_clusters"] is None and local["data_source"] is None    # synthetic: generated
    assert local["model"] == "logreg" and local["train_size"] == 40 and local["rounds"] == 4
    oracle = small_run(tmp_path / "oracle", "algorithm.name=oracle")
    for line in (tmp_path / "oracle" / "metrics.jsonl").read_text().splitlines():
        assert json.loads(line)["neighbor_all_same_share"] == 1.0
    small_run(tmp_path / "random", "algorithm.name=random")
    import numpy as np

    lists = np.load(tmp_path / "random" / "neighbors.npz")["final_lists"]
    clusters = np.load(tmp_path / "random" / "neighbors.npz")["clusters"]
    by_hand = np.mean([all(clusters[j] == clusters[i] for j in lists[i][lists[i] >= 0]) for i in range(8)])
    last = json.loads((tmp_path / "random" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["neighbor_all_same_share"] == pytest.approx(by_hand, abs=1e-12)
    assert oracle["neighbor_precision"] == 1.0
    # docs/running.md ("What a run writes") lists every field the two files hold.
    guide = (ROOT / "docs" / "running.md").read_text()
    section = guide[guide.index("## What a run writes"):]
    section = section[:section.index("\n## ")]
    fields = set(json.loads((tmp_path / "oracle" / "metrics.jsonl").read_text().splitlines()[-1])) | set(oracle)
    assert {"num_clusters", "ari", "neighbor_all_same_share", "data_source"} <= fields
    assert [f for f in sorted(fields) if f"`{f}`" not in section] == []


def test_default_checkpoints_by_the_clock_at_the_end(tmp_path):
    assert load_config(None, []).checkpoint_every == 0
    small_run(tmp_path / "r", "algorithm.name=local", "rounds=12")
    assert [r for r, _ in checkpoint.candidates(tmp_path / "r")] == [12]


def test_thread_count_changes_sums_only_to_rounding(tmp_path):
    """docs/what-it-does.md's claim: with another number of threads the random draws (here: Random's peers, so
    its neighbour precision and recall) are identical and the trained numbers agree to rounding."""
    import torch

    threads = torch.get_num_threads()
    got = {}
    for n in (1, 2):
        torch.set_num_threads(n)
        try:
            small_run(tmp_path / f"t{n}", "algorithm.name=random", "model=mlp")
        finally:
            torch.set_num_threads(threads)
        got[n] = records(tmp_path / f"t{n}")
    for a, b in zip(got[1], got[2]):
        assert (a["neighbor_precision"], a["neighbor_recall"]) == (b["neighbor_precision"], b["neighbor_recall"])
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=0.5)   # one test sample of 160 is 0.625
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)


# ----------------------------------------------------------------------------
# One run writes a directory at a time


def _try_lock_in_child(d, hold_seconds=0.0):
    """A child process that takes the run lock of ``d`` (and holds it for ``hold_seconds``)."""
    code = ("import sys, time\nfrom fedclust.outputs import RunLock\nfrom fedclust.errors import ConfigError\n"
            f"try:\n    lock = RunLock({str(d)!r})\nexcept ConfigError as e:\n    print(e); sys.exit(3)\n"
            f"print('locked', flush=True)\ntime.sleep({hold_seconds})\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_second_process_is_refused_while_a_run_holds_its_directory(tmp_path):
    from fedclust.outputs import LOCK_NAME, RunLock

    lock = RunLock(tmp_path / "run")
    child = _try_lock_in_child(tmp_path / "run")
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 3
    assert "config field 'out'" in out and "in use by another fedclust run" in out and f"pid {os.getpid()} " in out
    lock.release()
    child = _try_lock_in_child(tmp_path / "run")
    assert child.communicate(timeout=60)[0].strip() == "locked" and child.returncode == 0
    assert (tmp_path / "run" / LOCK_NAME).exists()   # the file stays; only the kernel's lock is the claim


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    from fedclust.outputs import RunLock

    child = _try_lock_in_child(tmp_path / "run", hold_seconds=600)
    assert child.stdout.readline().strip() == "locked"
    with pytest.raises(ConfigError, match=f"pid {child.pid} "):
        RunLock(tmp_path / "run")
    child.kill()
    child.wait(timeout=60)
    RunLock(tmp_path / "run").release()


def test_a_run_on_a_directory_in_use_is_refused_and_writes_nothing(tmp_path):
    from fedclust.outputs import LOCK_NAME, MARKER_NAME, RunLock

    out = tmp_path / "run"
    with RunLock(out):                          # the holder marked the directory, then locked it
        before = files(out)
        with pytest.raises(ConfigError) as e:
            small_run(out)
        assert e.value.field == "out" and "in use" in str(e.value)
        assert sorted(files(out)) == sorted([MARKER_NAME, LOCK_NAME]) and files(out) == before
    summary = small_run(out)                    # released: the run goes ahead, then releases the lock itself
    assert summary["rounds_completed"] == 4
    RunLock(out).release()


def test_launch_rank_and_only_rank_zero_locks(tmp_path, monkeypatch):
    from fedclust.dist import launch_rank
    from fedclust.outputs import RunLock

    for k in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE",
              "SLURM_NNODES", "SLURM_JOB_NAME"):
        monkeypatch.delenv(k, raising=False)
    assert launch_rank() == 0
    monkeypatch.setenv("SLURM_PROCID", "2")
    assert launch_rank() == 0                   # a one-task Slurm job is one process
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_NAME", "fmnist")
    assert launch_rank() == 2
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launch_rank() == 1                   # torchrun's RANK comes first
    with RunLock.for_rank(tmp_path / "other", 1):
        assert not (tmp_path / "other").exists()   # ranks other than 0 take no lock and make nothing


def test_a_file_system_without_locks_warns_and_runs(tmp_path, monkeypatch, capsys):
    import errno

    from fedclust import outputs

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(outputs.fcntl, "flock", no_locks)
    with outputs.RunLock(tmp_path / "run") as lock:
        assert f"pid {os.getpid()} " in lock.path.read_text()
    assert "cannot lock" in capsys.readouterr().err
