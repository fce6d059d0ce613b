"""Runs that survive: a run killed with SIGKILL (its whole process group)
and resumed ends exactly as an uninterrupted run, on 1 and 2 processes and
across 2 -> 1 and 1 -> 2; SIGUSR1/SIGTERM stop with a checkpoint and a
Slurm requeue; a failing rank ends the others; checkpoint files are atomic,
the newest two kept, torn ones skipped."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fedclust import checkpoint
from fedclust.algorithms import registry
from fedclust.config import load_config
from fedclust.errors import ConfigError, DivergenceError
from fedclust.lists import list_edges
from fedclust.runner import prepare, run
from fedclust.stopping import EXIT_REQUEUE

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from record import GOLDEN_OVERRIDES  # noqa: E402
from run_files import RESUMED_ON_TWO, golden, golden_here, results

PAUSE_PLUGIN = "tests/plugins/pause_after_round.py"   # rank 0 waits after round KILL_AFTER (a round-end hook)
KILL_AFTER = 5          # of 8 rounds; checkpoints every 2: the resume starts from round 4 and redoes round 5


@pytest.fixture(autouse=True)
def one_thread():
    """In-process runs on one thread, as the launched ones (OMP_NUM_THREADS=1): sums over threads round
    differently with their number, and these tests compare runs bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)


def overrides(name, out, *extra):
    return GOLDEN_OVERRIDES + [f"algorithm.name={name}", f"out={out}", "checkpoint_every=2", *extra]


def command(nproc, args):
    if nproc == 1:
        return [sys.executable, "-m", "fedclust", "run", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "fedclust", "run", *args]


def launch(nproc, args, **extra_env):
    """Run fedclust in its own session (process group), as a job would."""
    return subprocess.run(command(nproc, args), cwd=ROOT, env=env(**extra_env), capture_output=True, text=True,
                          timeout=300, start_new_session=True)


def descendants(pid):
    out, todo = [], [pid]
    while todo:
        kids = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True).stdout.split()
        out += [int(k) for k in kids]
        todo += kids
    return out


def killed_run(nproc, name, out, *extra):
    """Launch the run, wait until rank 0 has finished round KILL_AFTER, then SIGKILL the job's whole
    process group (and every process it started), as a node failure or the scheduler would."""
    proc = subprocess.Popen(command(nproc, overrides(name, out, *extra, f"plugins=[{PAUSE_PLUGIN}]")), cwd=ROOT,
                            env=env(PAUSE_AFTER_ROUND=str(KILL_AFTER)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    marker = Path(out) / ".paused"
    end = time.time() + 240
    while not marker.exists():
        assert proc.poll() is None and time.time() < end, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    victims = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert_killed(out)


def in_process(name, out, *extra):
    cfg = load_config(None, overrides(name, out, *extra))
    return run(cfg, prepare(cfg))


def sub_run(name, out, *extra):
    """The run as a job runs it (a fresh process): runs compared bit for bit must not depend on what else
    this test process did before."""
    proc = launch(1, overrides(name, out, *extra))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((Path(out) / "summary.json").read_text())


def assert_same_run(a, b):
    la, sa = results(a)
    lb, sb = results(b)
    assert [r["round"] for r in lb] == list(range(1, len(lb) + 1))   # no line lost or duplicated
    assert la == lb
    assert sa == sb


def assert_uninterrupted(name, out, nproc, reference):
    """``out`` ended exactly as an uninterrupted run of its config: the golden files where they were recorded
    with this torch and CPU (an uninterrupted run equals them bit for bit on 1 and 2 processes:
    tests/integration/test_golden_runs.py, tests/unit/test_plugins.py), else a run launched into ``reference``."""
    if golden_here():
        want, got = golden(name), results(out)
        assert [r["round"] for r in got[0]] == list(range(1, len(got[0]) + 1))   # no line lost or duplicated
        assert got == want
        return
    if not (Path(reference) / "summary.json").exists():   # else already run (a batch of references)
        whole = launch(nproc, overrides(name, reference))
        assert whole.returncode == 0, whole.stderr[-3000:]
    assert_same_run(reference, out)


def assert_killed(out) -> None:
    """``out`` as a run SIGKILLed after round KILL_AFTER leaves it: every record up to that round, the two
    checkpoints before it, no summary."""
    lines = (Path(out) / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == KILL_AFTER                       # round 5 was written, its checkpoint was not due
    assert [r for r, _ in checkpoint.candidates(out)] == [4, 2]
    assert not (Path(out) / "summary.json").exists()


@pytest.fixture(scope="session")
def killed_on_one(tmp_path_factory):
    """Every built-in algorithm's run killed with SIGKILL after round KILL_AFTER on one process (each in its own
    process, forked from one that imported fedclust once: tests/run_many.py --kill-after), then each continued
    by the same command, all in one job (as many commands run one after another), with the uninterrupted runs
    to compare them with where no golden files were recorded on a machine like this one: the folder holding
    each under its algorithm's name (the uninterrupted ones under whole/)."""
    from batch import killed_many, launch_many

    root = tmp_path_factory.mktemp("killed_on_one")
    names = registry.builtin_names()
    dirs = {name: root / name for name in names}   # the killed runs
    runs = [overrides(name, dirs[name], f"plugins=[{PAUSE_PLUGIN}]") for name in names]
    proc = killed_many(runs, KILL_AFTER, root / "killed.json", env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in names:
        assert_killed(dirs[name])
    runs = [overrides(name, dirs[name]) for name in names]
    if not golden_here():   # the uninterrupted runs to compare with, in the same job
        runs += [overrides(name, root / "whole" / name) for name in names]
    again = launch_many(1, runs, root / "again.json", env())
    assert again.returncode == 0, again.stderr[-3000:]
    return root


@pytest.mark.xdist_group("killed_on_one")   # one worker kills and continues them all
@pytest.mark.parametrize("name", registry.builtin_names())
def test_killed_run_resumes_exactly_on_one_process(killed_on_one, name):
    assert_uninterrupted(name, killed_on_one / name, 1, killed_on_one / "whole" / name)
    assert [r for r, _ in checkpoint.candidates(killed_on_one / name)] == [8, 6]


@pytest.mark.xdist_group("killed_on_two")   # one worker kills and continues them all
@pytest.mark.parametrize("name", RESUMED_ON_TWO)
def test_killed_run_resumes_exactly_on_two_processes_and_on_one(killed_on_two, name):
    assert_uninterrupted(name, killed_on_two / "killed" / name, 2, killed_on_two / "whole" / name)
    assert_uninterrupted(name, killed_on_two / "killed_to_one" / name, 1, killed_on_two / "whole_one" / name)


def test_one_to_two_processes(tmp_path):
    killed_run(1, "panm_grad", tmp_path / "killed")
    proc = launch(2, overrides("panm_grad", tmp_path / "killed"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_uninterrupted("panm_grad", tmp_path / "killed", 2, tmp_path / "whole")


# ----------------------------------------------------------------------------
# Resume rules


def test_resume_modes_and_config_differences(tmp_path):
    out = tmp_path / "r"
    in_process("random", out, "rounds=4")
    with pytest.raises(ConfigError) as e:
        in_process("random", out, "rounds=4", "resume=never")
    assert e.value.field == "out" and "resume=never" in str(e.value)
    with pytest.raises(ConfigError) as e:
        in_process("random", out, "rounds=6", "train.lr=0.05")
    assert e.value.field == "train.lr" and "train.lr (0.08 -> 0.05)" in str(e.value)
    with pytest.raises(ConfigError) as e:
        in_process("random", tmp_path / "none", "resume=require")
    assert e.value.field == "resume"
    before = (out / "metrics.jsonl").read_text()
    # A checkpoint written before the neighbour lists were index lists holds a bool [n, n] table: still resumed.
    path, payload = checkpoint.newest(out)
    rows, cols = list_edges(payload["final_lists"].numpy())
    assert len(rows) == 8 * 2   # random: algorithm.k = 2 peers each
    dense = torch.zeros(8, 8, dtype=torch.bool)
    dense[torch.from_numpy(rows), torch.from_numpy(cols)] = True
    old = {k: v for k, v in payload.items() if k not in ("format", "round", "complete")}
    checkpoint.write(out, int(payload["round"]), dict(old, final_lists=dense))
    summary = in_process("random", out, "rounds=6", "label=longer")    # run length and outputs may change
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert (out / "metrics.jsonl").read_text().startswith(before) and len(lines) == 6
    assert summary["rounds_completed"] == 6
    whole = in_process("random", tmp_path / "six", "rounds=6")
    assert [json.loads(x)["accuracy"] for x in lines] == [r["accuracy"] for r in
                                                          map(json.loads, (tmp_path / "six" / "metrics.jsonl")
                                                              .read_text().splitlines())]
    assert whole["final_accuracy"] == summary["final_accuracy"]


def test_a_checkpoint_from_before_a_key_existed_resumes_as_that_keys_default(tmp_path):
    """A run checkpointed by an earlier fedclust has no entry for a key added since (here FPFC's
    reset_theta, engine and exchange_mb): it ran as the key's default does, so it continues, to the same
    result as the uninterrupted run; setting the new key to another value is still refused, naming it."""
    in_process("fpfc", tmp_path / "whole", "rounds=6")
    out = tmp_path / "old"
    in_process("fpfc", out, "rounds=4")
    path, payload = checkpoint.newest(out)
    config = payload["config"]
    for key in ("engine", "exchange_mb"):
        del config[key]
    del config["fpfc"]["reset_theta"]
    checkpoint.write(out, int(payload["round"]), {k: v for k, v in payload.items()
                                                 if k not in ("format", "round", "complete")})
    with pytest.raises(ConfigError) as e:
        in_process("fpfc", out, "rounds=6", "fpfc.reset_theta=true")
    assert e.value.field == "fpfc.reset_theta" and "fpfc.reset_theta (False -> True)" in str(e.value)
    summary = in_process("fpfc", out, "rounds=6")
    assert summary["rounds_completed"] == 6
    assert results(out) == results(tmp_path / "whole")


@pytest.mark.parametrize("name", ["pens", "panm_grad"])
def test_a_checkpoint_with_the_earlier_n_by_n_state_resumes_exactly(tmp_path, name):
    """Checkpoints written before the stage-one counts were lists hold them as [n, n] tables (the runner's
    int32, PENS's int64), PANM's and PENS's last similarities as [n, n] float32 and masks as bool tables
    (not packed bits): such a checkpoint from the middle of stage one resumes to exactly the uninterrupted run."""
    import numpy as np

    from fedclust.algorithms.peer_counts import counts_matrix

    extra = ("stage1_rounds=6",)
    in_process(name, tmp_path / "whole", *extra)
    shutil.copytree(tmp_path / "whole", tmp_path / "old")
    old = tmp_path / "old"
    checkpoint.path_for(old, 8).unlink()
    (old / "summary.json").unlink()
    path, payload = checkpoint.newest(old)
    assert int(payload["round"]) == 6
    n = 8
    table = counts_matrix(payload.pop("stage1_peers"), payload["stage1_counts"], n).to(torch.int32)
    assert table.sum() == 6 * n * 2   # rounds 1-6, k = 2 peers each
    payload["stage1_counts"] = table
    clients = payload["algorithm"]["clients"]
    if name == "pens":
        clients["counts"] = counts_matrix(clients.pop("count_peers"), clients["counts"], n)
    clients["last_similarity"] = torch.full((n, n), float("nan"))
    for field_name, value in list(clients.items()):   # masks were saved as bool tables, not packed bits
        if isinstance(value, dict):
            clients[field_name] = checkpoint.unpack_bits(value["bits"], value["width"])
    checkpoint.write(old, 6, {k: v for k, v in payload.items() if k not in ("format", "round", "complete")})
    in_process(name, old, *extra)
    assert results(old) == results(tmp_path / "whole")
    a, b = (np.load(d / "neighbors.npz") for d in (old, tmp_path / "whole"))
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)


def test_only_the_run_algorithms_sections_are_compared():
    saved = {"clients": 8, "train": {"lr": 0.08}, "pens": {"count": "reference"}}
    now = {"clients": 8, "train": {"lr": 0.08}, "pens": {"count": "selected"}, "my_plugin": {"x": 1}}
    assert checkpoint.config_differences(saved, now, ("my_plugin",)) == ["my_plugin.x"]
    assert checkpoint.config_differences(saved, now, ("pens",)) == ["pens.count"]
    assert checkpoint.config_differences(saved, dict(now, rounds=9, train={"lr": 0.1}), ()) == ["train.lr"]


def test_a_key_an_old_config_lacks_reads_as_runs_behaved_before_it():
    """A key absent from a saved config reads as its default, unless its section says runs behaved otherwise
    before it existed: CFL carved no validation split before cfl.validation (default 0.2)."""
    from fedclust.schema import to_dict

    def config(*extra):
        return to_dict(load_config(None, ["algorithm.name=cfl", *extra]))

    saved = config()
    del saved["cfl"]["validation"], saved["exchange_mb"]
    assert checkpoint.config_differences(saved, config(), ("cfl",)) == ["cfl.validation"]
    assert checkpoint.config_differences(saved, config("cfl.validation=0"), ("cfl",)) == []
    assert checkpoint.config_differences(saved, config("cfl.validation=0", "seed=3"), ("cfl",)) == ["seed"]
    del saved["seed"]   # a core key absent reads as its default too
    assert checkpoint.config_differences(saved, config("cfl.validation=0"), ("cfl",)) == []


def test_checkpoints_are_atomic_and_two_are_kept(tmp_path):
    for r in (1, 2, 3):
        checkpoint.write(tmp_path, r, {"config": {}, "x": torch.arange(r)})
    assert [r for r, _ in checkpoint.candidates(tmp_path)] == [3, 2]
    assert not list(checkpoint.directory(tmp_path).glob("*.tmp*"))
    newest = checkpoint.path_for(tmp_path, 3)
    newest.write_bytes(newest.read_bytes()[:100])            # torn
    with pytest.warns(UserWarning, match="round-000003.pt"):
        path, payload = checkpoint.newest(tmp_path)
    assert path.name == "round-000002.pt" and payload["round"] == 2 and payload["x"].tolist() == [0, 1]


def test_torn_newest_checkpoint_resumes_from_the_older(tmp_path):
    out = tmp_path / "t"
    killed_run(1, "oracle", out)
    newest = checkpoint.path_for(out, 4)
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    proc = launch(1, overrides("oracle", out))
    assert proc.returncode == 0 and "round-000004.pt" in proc.stderr and "cannot be used" in proc.stderr
    assert_uninterrupted("oracle", out, 1, tmp_path / "whole")


def test_divergence_keeps_the_last_good_checkpoint_and_metrics(tmp_path, monkeypatch):
    from fedclust import round as runner   # where the round step calls the engine

    train_round, calls = runner.train_round, []

    def nan_in_round_4(*args, **kwargs):   # client 1's loss turns NaN in the 4th round
        loss = train_round(*args, **kwargs)
        calls.append(1)
        return loss.index_fill(0, torch.tensor([1], device=loss.device), float("nan")) if len(calls) == 4 else loss

    monkeypatch.setattr(runner, "train_round", nan_in_round_4)
    out = tmp_path / "d"
    with pytest.raises(DivergenceError) as e:
        in_process("local", out, "checkpoint_every=1", "rounds=6")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert e.value.round == 4 and e.value.clients == [1] and len(lines) == 3
    rounds = [r for r, _ in checkpoint.candidates(out)]
    assert rounds == [r for r in (e.value.round - 1, e.value.round - 2) if r >= 1]


# ----------------------------------------------------------------------------
# Signals


def fake_scontrol(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "scontrol.log"
    script = bin_dir / "scontrol"
    script.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    script.chmod(0o755)
    return bin_dir, log


def wait_for_lines(path, count, proc, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        if path.exists() and len(path.read_text().splitlines()) >= count:
            return
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {count} lines")


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_signal_checkpoints_requeues_and_exits(tmp_path, sig):
    bin_dir, log = fake_scontrol(tmp_path)
    out = tmp_path / "s"
    args = overrides("panm_loss", out, "rounds=100", "checkpoint_every=0")   # stopped after round 3 or soon after
    extra = dict(PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_ARRAY_JOB_ID="4240",
                 SLURM_ARRAY_TASK_ID="2")
    proc = subprocess.Popen(command(1, args), cwd=ROOT, env=env(**extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for_lines(out / "metrics.jsonl", 3, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_REQUEUE, err[-3000:]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    stopped = [r for r, _ in checkpoint.candidates(out)][0]
    assert stopped == len(lines) < 100 and f"after round {stopped}" in err
    assert log.read_text().split() == ["requeue", "4240_2"]     # the array task, not the array's job id
    cfg = load_config(None, args[:-1] + ["checkpoint_every=0", "rounds=100"])
    summary = run(cfg, prepare(cfg))                          # the requeued job continues
    assert summary["rounds_completed"] == 100
    rounds = [json.loads(x)["round"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert rounds == list(range(1, 101))


def test_ranks_agree_to_stop_when_one_is_signalled(tmp_path):
    out = tmp_path / "s2"
    args = overrides("random", out, "rounds=400", "checkpoint_every=0")
    proc = subprocess.Popen(command(2, args), cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    wait_for_lines(out / "metrics.jsonl", 3, proc)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert len(children) == 2
    os.kill(int(max(children, key=int)), signal.SIGUSR1)    # one worker only
    _, err = proc.communicate(timeout=120)
    # what plain torchrun makes of it (docs/running.md, "Runs that survive"): each worker exits 75, torchrun
    # reports failure
    assert proc.returncode == 1 and "ChildFailedError" in err and "exitcode  : 75" in err, err[-3000:]
    assert err.count("fedclust: stopped on") == 2, err[-3000:]   # both ranks stopped at the same boundary
    stopped = [r for r, _ in checkpoint.candidates(out)][0]
    assert stopped == len((out / "metrics.jsonl").read_text().splitlines())
    assert err.count(f"after round {stopped}") == 2


# ----------------------------------------------------------------------------
# A failing rank


def test_a_rank_that_fails_ends_the_others_within_the_timeout(tmp_path):
    plugin = str(ROOT / "tests" / "plugins" / "failing_gossip.py")
    args = overrides("failing_gossip", tmp_path / "f", f"plugins=[{plugin}]", "failing_gossip.rank=1",
                     "failing_gossip.round=3", "collective_timeout=30")
    started = time.time()
    proc = launch(2, args)
    assert proc.returncode != 0
    assert time.time() - started < 30 + 60        # start-up and tear-down aside, within the timeout
    assert "rank 1 fails in round 3" in proc.stderr
