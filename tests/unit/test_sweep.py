"""W&B sweep files (configs/sweeps/), launch.sweep (their points expanded
without W&B's server) and slurm/sweep_agents.sh, without W&B's server or Slurm."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from fedclust.config import load_config
from fedclust.errors import FedclustError
from launch import submit, sweep
from launch.grid import dir_name

ROOT = Path(__file__).resolve().parents[2]
SWEEP_FILES = sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))


@pytest.fixture
def plenty_of_memory(monkeypatch):
    """FPFC refuses a run whose pairwise state does not fit in this machine's
    free memory; the sweep files are checked for their configs, not for the
    memory of the machine the tests run on."""
    monkeypatch.setattr("fedclust.config.available_memory", lambda device: (1 << 40, "test"))


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def command(config="configs/synthetic_cluster4.yaml", *extra):
    return ["python", "-m", "fedclust", "run", config, *extra, "${args_no_hyphens}"]


def sweep_file(tmp_path, parameters: dict, method="random", name="s.yaml", **top) -> Path:
    body = {"method": method, "parameters": parameters, "command": command(), **top}
    return write(tmp_path, yaml.safe_dump(body, sort_keys=False), name)


# ---------------------------------------------------------------------------
# The sweep files in configs/sweeps/


def test_there_are_sweep_files_for_one_process_torchrun_and_srun():
    names = {p.name for p in SWEEP_FILES}
    assert {"fmnist_table2.yaml", "cifar_panm_k_l.yaml"} <= names
    launchers = {yaml.safe_load(p.read_text())["command"][0] for p in SWEEP_FILES}
    assert {"python", "torchrun", "srun"} <= launchers


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: p.name)
def test_sweep_file_is_a_wandb_sweep_whose_points_fedclust_accepts(path, plenty_of_memory):
    text = path.read_text()
    raw = yaml.safe_load(text)
    assert set(raw) <= sweep.SWEEP_KEYS
    assert raw["metric"] == {"name": "final_accuracy", "goal": "maximize"}
    words = [str(w) for w in raw["command"]]
    assert "${args_no_hyphens}" in words and "wandb.enabled=true" in words
    assert not any(w.startswith("out=") for w in words)   # the agent's runs go to runs/sweeps/<sweep id>/<run id>
    header = "\n".join(line for line in text.splitlines()[:40] if line.startswith("#"))
    assert f"wandb sweep configs/sweeps/{path.name}" in header and "wandb agent" in header
    s = sweep.load_sweep(path)
    assert Path(ROOT / s.config).is_file() and "wandb.enabled=true" in s.fixed
    points = sweep.sweep_points(s, "/nonexistent/root", count=5 if s.method == "random" else None)
    assert points and len({p.out for p in points}) == len(points)
    for p in points:   # what `fedclust check` does; CIFAR-10 need not be on disk for it
        load_config(ROOT / s.config, [*sweep.offline_overrides(s), *p.overrides, "data.root=/nonexistent"])


def test_sweep_variants_run_the_same_points_as_their_base():
    for path in SWEEP_FILES:
        stem = path.stem
        for suffix in ("_srun", "_torchrun"):
            if stem.endswith(suffix):
                base, variant = (sweep.load_sweep(path.with_name(stem[: -len(suffix)] + ".yaml")),
                                 sweep.load_sweep(path))
                assert (variant.method, variant.config, variant.fixed, variant.parameters) == \
                       (base.method, base.config, base.fixed, base.parameters), path.name


def test_fmnist_table2_is_every_algorithm_by_three_seeds():
    s = sweep.load_sweep(ROOT / "configs/sweeps/fmnist_table2.yaml")
    points = sweep.sweep_points(s, "r")
    names = ["local", "random", "fixtopology", "oracle", "pens", "panm_loss", "panm_grad", "fedavg", "ifca", "cfl",
             "fedgroup", "fpfc"]
    assert [p.overrides for p in points] == [[f"algorithm.name={a}", f"seed={i}"] for a in names for i in range(3)]
    assert s.config == "configs/fmnist_rotation2.yaml"


def test_cifar_k_l_grid_has_l_at_least_k():
    s = sweep.load_sweep(ROOT / "configs/sweeps/cifar_panm_k_l.yaml")
    values = [dict(p.values) for p in sweep.sweep_points(s, "r")]
    assert len(values) == 9 and all(int(v["algorithm.l"]) >= int(v["algorithm.k"]) for v in values)
    assert "algorithm.name=panm_grad" in s.fixed and s.config == "configs/cifar_rotation4.yaml"


# ---------------------------------------------------------------------------
# Expansion


def test_grid_is_the_product_of_the_values_last_fastest(tmp_path):
    path = sweep_file(tmp_path, {"seed": {"values": [0, 1]}, "rounds": {"value": 3},
                                 "algorithm.k": {"min": 2, "max": 4}, "train.lr": {"values": [0.1, 0.01]},
                                 "data.clusters": {"distribution": "categorical",
                                                   "values": ["rotation", "label_swap"]}},
                      method="grid")
    expected = []
    for seed in (0, 1):
        for k in (2, 3, 4):
            for lr in (0.1, 0.01):
                for c in ("rotation", "label_swap"):
                    expected.append([f"seed={seed}", "rounds=3", f"algorithm.k={k}", f"train.lr={lr}",
                                     f"data.clusters={c}"])
    points = sweep.sweep_points(sweep.load_sweep(path), tmp_path)
    assert [p.overrides for p in points] == expected
    # names from the searched values (a single `value` is left out), as launch.grid names them
    assert points[0].out == tmp_path / "seed=0,algorithm.k=2,train.lr=0.1,data.clusters=rotation"
    assert points[-1].out == tmp_path / dir_name((("seed", "1"), ("algorithm.k", "4"), ("train.lr", "0.01"),
                                                  ("data.clusters", "label_swap")))
    assert [p.overrides for p in sweep.sweep_points(sweep.load_sweep(path), tmp_path, count=3)] == expected[:3]


def test_grid_q_uniform_is_wandbs_arange(tmp_path):
    path = sweep_file(tmp_path, {"train.local_epochs": {"distribution": "q_uniform", "min": 1, "max": 7, "q": 2}},
                      method="grid")
    assert [p.overrides for p in sweep.sweep_points(sweep.load_sweep(path), tmp_path)] == \
           [["train.local_epochs=1"], ["train.local_epochs=3"], ["train.local_epochs=5"]]


RANDOM = {
    "algorithm.name": {"values": ["panm_grad", "panm_loss", "random"]},
    "algorithm.k": {"distribution": "int_uniform", "min": 2, "max": 6},
    "algorithm.l": {"min": 8, "max": 12},                                       # ints: int_uniform
    "panm.alpha": {"min": 0.0, "max": 1.0},                                     # floats: uniform
    "train.lr": {"distribution": "log_uniform_values", "min": 0.001, "max": 0.1},
    "train.lr_decay": {"distribution": "log_uniform", "min": -0.1, "max": 0.0},
    "train.local_epochs": {"distribution": "q_uniform", "min": 1, "max": 5, "q": 1},
    "train.momentum": {"distribution": "q_uniform", "min": 0.0, "max": 0.9, "q": 0.3},
    "data.clusters": {"distribution": "categorical", "values": ["rotation", "label_swap"]},
    "rounds": {"value": 4},
    "stage1_rounds": {"value": 2},
}


def test_random_draws_are_deterministic_in_range_and_typed(tmp_path):
    s = sweep.load_sweep(sweep_file(tmp_path, RANDOM))
    kinds = {p.name: p.distribution for p in s.parameters}
    assert kinds["algorithm.l"] == "int_uniform" and kinds["panm.alpha"] == "uniform"
    draws = sweep.random_values(s, 200, seed=3)
    assert draws == sweep.random_values(s, 200, seed=3)
    assert draws != sweep.random_values(s, 200, seed=4)
    assert sweep.random_values(s, 20, seed=3) == draws[:20]   # more points keep the first ones
    for point in draws:
        v = dict(point)
        assert v["algorithm.name"] in ("panm_grad", "panm_loss", "random")
        assert type(v["algorithm.k"]) is int and 2 <= v["algorithm.k"] <= 6
        assert type(v["algorithm.l"]) is int and 8 <= v["algorithm.l"] <= 12
        assert type(v["panm.alpha"]) is float and 0.0 <= v["panm.alpha"] <= 1.0
        assert type(v["train.lr"]) is float and 0.001 <= v["train.lr"] <= 0.1
        assert type(v["train.lr_decay"]) is float and math.exp(-0.1) <= v["train.lr_decay"] <= 1.0
        assert type(v["train.local_epochs"]) is int and 1 <= v["train.local_epochs"] <= 5
        assert type(v["train.momentum"]) is float and any(abs(v["train.momentum"] - m) < 1e-9 for m in (0, .3, .6, .9))
        assert v["rounds"] == 4 and v["stage1_rounds"] == 2
    # every value of a small range comes up; log_uniform_values spreads over the decades
    assert {dict(p)["algorithm.k"] for p in draws} == {2, 3, 4, 5, 6}
    lrs = [dict(p)["train.lr"] for p in draws]
    assert min(lrs) < 0.003 and max(lrs) > 0.03 and 0.004 < math.exp(sum(map(math.log, lrs)) / len(lrs)) < 0.025


def test_random_points_are_named_by_seed_index_and_rounded_values_and_fedclust_accepts_them(tmp_path):
    s = sweep.load_sweep(sweep_file(tmp_path, RANDOM))
    points = sweep.sweep_points(s, tmp_path, count=4, seed=7)
    assert [p.out.name[:7] for p in points] == ["s7-000-", "s7-001-", "s7-002-", "s7-003-"]
    name = points[0].out.name
    assert "rounds=" not in name and "stage1_rounds" not in name   # single values are not in the name
    lr = dict(points[0].values)["train.lr"]
    assert f"train.lr={float(lr):.4g}," in name and len(name) < 200
    assert points == sweep.sweep_points(s, tmp_path, count=4, seed=7)
    for p in points:
        load_config(ROOT / s.config, [*s.fixed, *p.overrides])


def test_random_needs_a_count_or_run_cap(tmp_path):
    with pytest.raises(FedclustError, match="--count N"):
        sweep.sweep_points(sweep.load_sweep(sweep_file(tmp_path, {"seed": {"values": [0, 1]}})), tmp_path)
    s = sweep.load_sweep(sweep_file(tmp_path, {"seed": {"values": [0, 1]}}, run_cap=3))
    assert len(sweep.sweep_points(s, tmp_path)) == 3


# ---------------------------------------------------------------------------
# What is refused, and how


def test_bayes_is_refused_naming_the_fix(tmp_path):
    with pytest.raises(FedclustError, match=r"method 'bayes' .*W&B's server.*'method: random'.*wandb agent"):
        sweep.load_sweep(sweep_file(tmp_path, {"train.lr": {"min": 0.01, "max": 0.1}}, method="bayes"))


@pytest.mark.parametrize("parameters, words", [
    ({"train.lr": {"distribution": "normal", "mu": 0.05, "sigma": 0.01}},
     r"parameter 'train.lr': distribution 'normal' is not supported .*int_uniform.*'values: \[...\]'"),
    ({"train.lr": {"distribution": "log_uniform_values", "min": 0, "max": 0.1}}, "'train.lr'.*min > 0"),
    ({"algorithm.k": {"distribution": "int_uniform", "min": 1.5, "max": 4}}, "'algorithm.k'.*integer min and max"),
    ({"train.lr": {"min": 0.1, "max": 0.01}}, "'train.lr'.*min <= max"),
    ({"train.lr": {"values": []}}, "'train.lr'.*non-empty list"),
    ({"seed": {"values": [1, 1]}}, "'seed'.*repeated"),
    ({"algorithm": {"parameters": {"k": {"values": [3, 5]}}}}, "'algorithm'.*one dotted name .*algorithm.k"),
    ({"out": {"values": ["a", "b"]}}, "'out'.*remove 'out'"),
    ({"out.x": {"value": "a"}}, "'out.x'.*named by launch.sweep.*remove 'out'"),
    ({"seed": 3}, "'seed'.*mapping"),
    ({"train.lr": {"distribution": "uniform", "min": 0.1, "max": 0.2, "q": 2}}, "uniform takes max, min, not q"),
])
def test_bad_parameters_are_refused_naming_the_parameter_and_the_fix(tmp_path, parameters, words):
    with pytest.raises(FedclustError, match=words):
        sweep.load_sweep(sweep_file(tmp_path, parameters))


def test_grid_refuses_a_continuous_distribution(tmp_path):
    s = sweep.load_sweep(sweep_file(tmp_path, {"train.lr": {"min": 0.01, "max": 0.1}}, method="grid"))
    words = r"'train.lr' has distribution 'uniform'.*'values: \[...\]'.*method: random"
    with pytest.raises(FedclustError, match=words):
        sweep.sweep_points(s, tmp_path)


@pytest.mark.parametrize("words, message", [
    (["python", "-m", "fedclust", "run", "c.yaml", "${args}"], r"\$\{args_no_hyphens\}.*--key=value"),
    (["python", "train.py", "${args_no_hyphens}"], "runs no 'fedclust run'"),
    (["python", "-m", "fedclust", "run", "c.yaml", "out=x", "${args_no_hyphens}"], "out=x.*remove out="),
    (["python", "-m", "fedclust", "run", "c.yaml", "out.x=y", "${args_no_hyphens}"], "out.x=y.*remove out="),
    (["python", "-m", "fedclust", "run", "c.yaml", "--verbose", "${args_no_hyphens}"], "'--verbose'.*KEY=VALUE"),
])
def test_bad_commands_are_refused(tmp_path, words, message):
    body = {"method": "grid", "parameters": {"seed": {"values": [0]}}, "command": words}
    path = write(tmp_path, yaml.safe_dump(body))
    with pytest.raises(FedclustError, match=message):
        sweep.load_sweep(path)


def test_command_words_after_fedclust_run_are_the_config_and_fixed_overrides(tmp_path):
    for words in (["torchrun", "--standalone", "--nproc_per_node=4", "-m", "fedclust", "run", "c.yaml",
                   "rounds=3", "wandb.enabled=true", "${args_no_hyphens}"],
                  ["${env}", "srun", "--kill-on-bad-exit=1", "/opt/venv/bin/fedclust", "run", "c.yaml", "rounds=3",
                   "wandb.enabled=true", "${args_no_hyphens}"]):
        assert sweep.fedclust_words(words, "f") == ("c.yaml", ["rounds=3", "wandb.enabled=true"])
    assert sweep.fedclust_words(["fedclust", "run", "seed=1", "${args_no_hyphens}"], "f") == (None, ["seed=1"])


def test_a_typo_in_the_top_level_keys_or_a_bad_value_is_refused(tmp_path, plenty_of_memory):
    with pytest.raises(FedclustError, match="unknown top-level key.*paramters"):
        sweep.load_sweep(write(tmp_path, "method: grid\nparamters: {seed: {values: [0]}}\ncommand: [fedclust, run]\n"))
    path = sweep_file(tmp_path, {"algorithm.name": {"values": ["local", "lcal"]}}, method="grid")
    with pytest.raises(FedclustError, match=r"grid point algorithm.name=lcal: .*did you mean 'local'"):
        sweep.run_sweep(path, out=str(tmp_path / "runs"), local=True, echo=lambda *_: None)
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------
# The command lines


def test_both_launchers_share_the_resource_options():
    argv = ["--gpus", "2", "--time", "30", "--partition", "p", "--mem", "8G", "--signal-seconds", "60"]
    a = submit.build_parser().parse_intermixed_args(["c.yaml", "--grid", "seed=0,1", *argv])
    b = sweep.build_parser().parse_args(["s.yaml", *argv])
    assert submit.resources_from_args(a) == sweep.resources_from_args(b) == submit.Resources(
        partition="p", gpus=2, time_min=30, mem="8G", signal_seconds=60)
    b = sweep.build_parser().parse_args(["s.yaml", "--time", "1-02:30:00"])
    assert sweep.resources_from_args(b).time_min == (24 + 2) * 60 + 30


def test_sweep_dry_run_shows_what_each_slurm_job_asks_for(tmp_path):
    path = sweep_file(tmp_path, {"seed": {"values": [0, 1, 2]}, "algorithm.name": {"value": "local"}}, method="grid")
    lines: list[str] = []
    sweep.run_sweep(path, out=str(tmp_path / "runs"), dry_run=True, echo=lines.append,
                    resources=submit.Resources(time_min=90, cpus_per_task=4))
    assert lines[-11:] == [
        "  partition:      (not set: the cluster's default; --partition to choose)",
        "  account:        (not set: the cluster's default; --account to choose)",
        "  qos:            (not set: the cluster's default; --qos to choose)",
        "  nodes:          1",
        "  tasks per node: 1 (CPU tasks, --tasks)",
        "  gpus:           0: CPU tasks only, no GPU; --gpus N asks for N GPUs per node, one task each",
        "  cpus per task:  4",
        "  mem:            (not set: the cluster's default; --mem to choose)",
        "  time:           01:30:00 (90 min)",
        "  signal:         USR1 180 s before the time limit: checkpoint, requeue, resume",
        "  array size:     3 jobs, at most 3 running at once (--parallel)",
    ]
    assert lines[-12] == "each Slurm job would ask for:"
    assert not (tmp_path / "runs").exists()


def run_sweep_cli(*args, cwd=ROOT):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    return subprocess.run([sys.executable, "-m", "launch.sweep", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def test_cli_reports_a_bad_sweep_file_with_status_2(tmp_path):
    proc = run_sweep_cli(sweep_file(tmp_path, {"seed": {"values": [0]}}, method="bayes"), "--dry-run")
    assert proc.returncode == 2 and "launch.sweep: error:" in proc.stderr and "bayes" in proc.stderr


# ---------------------------------------------------------------------------
# slurm/sweep_agents.sh


def test_sweep_agents_script_runs_one_agent_for_one_run(tmp_path):
    script = ROOT / "slurm" / "sweep_agents.sh"
    text = script.read_text()
    for line in ("#SBATCH --signal=USR1@180", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "#SBATCH --gres=gpu:1"):
        assert line in text.splitlines()
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    fake = tmp_path / "wandb"
    fake.write_text('#!/bin/sh\necho "fake wandb $*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "FEDCLUST_WANDB": str(fake), "SLURM_JOB_ID": "12", "SLURM_ARRAY_JOB_ID": "11",
           "SLURM_ARRAY_TASK_ID": "1", "SLURM_CPUS_PER_TASK": "4"}
    proc = subprocess.run(["bash", str(script), "me/fedclust/abc123"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "fake wandb agent --count 1 me/fedclust/abc123" in proc.stdout and "job 11_1" in proc.stdout
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "ENTITY/PROJECT/SWEEP_ID" in proc.stderr
