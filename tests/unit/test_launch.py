"""launch.grid and launch.submit without Slurm: grid expansion, run
directories, what a resubmission skips, the job callable's exits, --local."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fedclust.errors import FedclustError
from launch import jobs, submit
from launch.grid import Point, dir_name, expand, parse_axes

ROOT = Path(__file__).resolve().parents[2]


def test_expand_is_the_product_in_order_with_named_dirs(tmp_path):
    points = expand(parse_axes(["seed=0,1,2", "algorithm.name=panm_loss,panm_grad"]), tmp_path)
    assert [p.overrides for p in points] == [[f"seed={s}", f"algorithm.name={a}"]
                                             for s in "012" for a in ("panm_loss", "panm_grad")]
    assert points[1].out == tmp_path / "seed=0,algorithm.name=panm_grad"
    assert len({p.out for p in points}) == 6
    assert dir_name((("data.root", "/x y"),)) == "data.root=_x_y"
    assert expand([], tmp_path) == [Point((), tmp_path / "run")]


@pytest.mark.parametrize("spec, words", [
    (["seed"], "KEY=V1,V2"), (["seed=0,,1"], "no empty value"), (["seed=0", "seed=1"], "given twice"),
    (["out=a,b"], "--out"), (["out.x=a"], "--grid out.x=.*--out"), (["seed=1,1"], "repeated"),
])
def test_bad_axes_are_refused_naming_the_fix(spec, words):
    with pytest.raises(FedclustError, match=words):
        parse_axes(spec)


def test_every_point_is_checked_before_anything_runs(tmp_path):
    with pytest.raises(FedclustError, match=r"grid point seed=1,algorithm.name=lcal: .*did you mean 'local'"):
        submit.submit_grid("configs/synthetic_cluster4.yaml", ["seed=1", "algorithm.name=local,lcal"],
                           out=str(tmp_path), local=True, echo=lambda *_: None)
    assert list(tmp_path.iterdir()) == []
    for fixed in ("out=x", " out =x"):
        with pytest.raises(FedclustError, match="named by the grid; set the grid's folder with --out"):
            submit.submit_grid("configs/synthetic_cluster4.yaml", ["seed=1"], [fixed], out=str(tmp_path))
    with pytest.raises(FedclustError, match="--signal-seconds 7200"):
        submit.submit_grid("configs/synthetic_cluster4.yaml", ["seed=1"], out=str(tmp_path),
                           resources=jobs.Resources(time_min=60, signal_seconds=7200))


def test_plan_skips_finished_and_queued_runs(tmp_path, monkeypatch):
    a, b, c = expand(parse_axes(["seed=0,1,2"]), tmp_path)
    a.out.mkdir()
    (a.out / "summary.json").write_text("{}")
    ledger = jobs.Ledger(tmp_path)
    ledger.record([(b, "7_1", "log"), (c, "7_2", "log")])
    monkeypatch.setattr(submit, "job_state", {"7_1": "RUNNING", "7_2": None}.get)
    todo, skipped = submit.plan([a, b, c], ledger)
    assert todo == [c]   # its job left the queue without finishing: submit again (it resumes)
    assert skipped == [(a, "finished"), (b, "job 7_1 is RUNNING")]


def test_job_callable_leaves_by_systemexit_when_requeued(monkeypatch):
    """Exit 75 (checkpointed and requeued): SystemExit, so submitit writes no
    result and the requeued job runs the callable again; other failures raise."""
    import fedclust.cli

    call = jobs.RunPoint("c.yaml", ("seed=1",), "runs/x")
    assert call.argv() == ["run", "c.yaml", "seed=1", "out=runs/x"]
    for rc, expect in ((75, SystemExit), (2, RuntimeError)):
        monkeypatch.setattr(fedclust.cli, "main", lambda argv, rc=rc: rc)
        with pytest.raises(expect):
            call()
    monkeypatch.setattr(fedclust.cli, "main", lambda argv: 0)
    assert call() == "runs/x"


def test_slurm_executor_asks_for_usr1_requeue_and_gres(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs.shutil, "which", lambda name: f"/usr/bin/{name}")
    import submitit.slurm.slurm as ss

    monkeypatch.setattr(ss.SlurmExecutor, "affinity", staticmethod(lambda: 2))   # as if on a Slurm login node
    ex = jobs.slurm_executor(tmp_path, "fedclust-x", jobs.Resources(gpus=4, partition="gpu",
                                                                   time_min=jobs.parse_time("2:00:00")))
    script = ex._executor._make_submission_file_text("python -m x", "uid")
    for line in ("--requeue", "--signal=USR1@180", "--gres=gpu:4", "--ntasks-per-node=4", "--partition=gpu",
                 "--time=120"):
        assert f"#SBATCH {line}" in script
    assert "gpus-per-task" not in script


# ---------------------------------------------------------------------------
# The first ten minutes: help, --time, --dry-run, list values, shipped files


def option_help(parser) -> dict[str, str]:
    """Each option's help as --help prints it, whitespace collapsed."""
    text = parser.format_help()
    blocks: dict[str, str] = {}
    for action in parser._actions:
        if not action.option_strings or action.option_strings[0] == "-h":
            continue
        flag = action.option_strings[0]
        start = text.index(f"\n  {flag}")
        end = min((i for i in (text.find("\n  -", start + 1), text.find("\n\n", start + 1)) if i > 0))
        blocks[flag] = " ".join(text[start:end].split())
    return blocks


@pytest.mark.parametrize("parser", [submit.build_parser(), __import__("launch.sweep").sweep.build_parser()],
                         ids=["submit", "sweep"])
def test_help_shows_every_default(parser):
    shown = option_help(parser)
    expected = {"--local": "off", "--wait": "off", "--dry-run": "off", "--partition": "none, the cluster's default",
                "--account": "none, the cluster's default", "--qos": "none, the cluster's default",
                "--gpus": "0: no GPU, the runs train on --tasks CPU tasks", "--tasks": "1", "--cpus-per-task": "1",
                "--nodes": "1", "--mem": "none, the cluster's default", "--time": "01:00:00, 60 minutes",
                "--signal-seconds": "180", "--parallel": "256", "--out": "runs/"}
    for flag, default in expected.items():
        assert f"(default: {default}" in shown[flag], (flag, shown[flag])
    required = {"--grid"}
    for flag, text in shown.items():
        assert flag in required or "(default: " in text, (flag, text)


def epilog_commands(parser) -> list[list[str]]:
    """The commands of the help's examples, continuation lines joined."""
    import shlex

    joined = parser.epilog.replace("\\\n", " ")
    return [shlex.split(line.strip()) for line in joined.splitlines() if line.strip().startswith("python -m ")]


def test_help_examples_are_a_local_grid_a_slurm_gpu_grid_and_a_dry_run_that_all_parse_and_check(tmp_path, capsys):
    parser = submit.build_parser()
    assert "examples:" in parser.format_help()
    commands = epilog_commands(parser)
    assert len(commands) == 3 and all(c[:3] == ["python", "-m", "launch.submit"] for c in commands)
    local, slurm, dry = commands
    assert "--local" in local and "--gpus" in slurm and "--dry-run" in dry
    for i, argv in enumerate(commands):
        args = argv[3:] + ["--out", str(tmp_path / str(i))] + ([] if "--dry-run" in argv else ["--dry-run"])
        assert submit.main(args) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "gpus:           1 per node (--gres=gpu:1), one task each" in out   # the Slurm GPU grid
    assert "time:           04:00:00 (240 min)" in out and "time:           1-00:00:00 (1440 min)" in out
    assert list(tmp_path.iterdir()) == []


def test_time_takes_sbatchs_forms_in_minutes_seconds_rounded_up():
    for text, minutes in [("90", 90), ("1:30", 2), ("0:59", 1), ("2:00:00", 120), ("48:00:00", 2880),
                          ("1:00:01", 61), ("1-12", 2160), ("1-12:30", 2190), ("1-00:00:01", 1441), ("2-0", 2880),
                          (" 45 ", 45)]:
        args = submit.build_parser().parse_intermixed_args(["c.yaml", "--grid", "seed=0", "--time", text])
        assert submit.resources_from_args(args).time_min == minutes, text


@pytest.mark.parametrize("text, why", [
    ("90m", "not a time limit"), ("1:75", "seconds must be 0-59 there, got 75"),
    ("1:60:00", "minutes must be 0-59 there, got 60"), ("1-24", "hours must be 0-23 there, got 24"),
    ("0", "must be at least 1 minute"), ("0:00:00", "must be at least 1 minute"), ("1:2:3:4", "not a time limit"),
    ("-5", "not a time limit"), ("UNLIMITED", "not a time limit"), ("", "not a time limit"),
])
def test_bad_time_is_refused_naming_option_value_and_forms(text, why, capsys):
    with pytest.raises(SystemExit) as exc:
        submit.main(["configs/synthetic_cluster4.yaml", "--grid", "seed=0", "--time", text, "--dry-run"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert f"argument --time: {text!r}: {why}" in err, err
    assert "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS" in err


def test_time_limits_are_written_as_sbatch_writes_them():
    assert [jobs.format_time(m) for m in (1, 60, 61, 1439, 1440, 1501, 4320)] == [
        "00:01:00", "01:00:00", "01:01:00", "23:59:00", "1-00:00:00", "1-01:01:00", "3-00:00:00"]


def test_dry_run_shows_what_each_slurm_job_asks_for(tmp_path, capsys):
    grid = ["configs/synthetic_cluster4.yaml", "--grid", "seed=0,1,2", "--out", str(tmp_path), "--dry-run"]
    assert submit.main([*grid, "--partition", "gpu", "--account", "lab", "--gpus", "4", "--cpus-per-task", "8",
                        "--mem", "64G", "--time", "1-12:30", "--signal-seconds", "300", "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("would run")] == [
        f"would run {tmp_path}/seed={s}  (seed={s})" for s in range(3)]
    assert out.split("each Slurm job would ask for:\n")[1].splitlines() == [
        "  partition:      gpu",
        "  account:        lab",
        "  qos:            (not set: the cluster's default; --qos to choose)",
        "  nodes:          1",
        "  tasks per node: 4 (one per GPU)",
        "  gpus:           4 per node (--gres=gpu:4), one task each",
        "  cpus per task:  8",
        "  mem:            64G per node",
        "  time:           1-12:30:00 (2190 min)",
        "  signal:         USR1 300 s before the time limit: checkpoint, requeue, resume",
        "  array size:     3 jobs, at most 2 running at once (--parallel)",
    ]
    # Without --gpus: no GPU, said plainly.
    assert submit.main([*grid, "--tasks", "2"]) == 0
    out = capsys.readouterr().out
    assert "  tasks per node: 2 (CPU tasks, --tasks)\n" in out
    assert "  gpus:           0: CPU tasks only, no GPU; --gpus N asks for N GPUs per node, one task each\n" in out
    assert "  partition:      (not set: the cluster's default; --partition to choose)\n" in out
    assert "  time:           01:00:00 (60 min)\n" in out
    # --local: this machine's processes instead.
    assert submit.main([*grid, "--local", "--tasks", "2"]) == 0
    out = capsys.readouterr().out
    assert "on this machine, one run after another, 2 processes each" in out and "Slurm job would" not in out
    assert list(tmp_path.iterdir()) == []


def test_no_gpu_jobs_refuse_device_cuda(tmp_path, monkeypatch):
    """--gpus 0 asks Slurm for no GPU, so a device=cuda run would fail on its
    node; checked as if the submitting machine had CUDA."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    args = dict(out=str(tmp_path), dry_run=True, echo=lambda *_: None)
    cuda = ["device=cuda", "algorithm.name=local"]
    with pytest.raises(FedclustError, match=r"grid point seed=0: device=cuda, but --gpus is 0.*add --gpus N"):
        submit.submit_grid("configs/synthetic_cluster4.yaml", ["seed=0"], cuda, **args)
    submit.submit_grid("configs/synthetic_cluster4.yaml", ["seed=0"], cuda, resources=jobs.Resources(gpus=1), **args)
    submit.submit_grid("configs/synthetic_cluster4.yaml", ["seed=0"], cuda, local=True, **args)


def test_a_list_value_is_one_value_of_an_axis(tmp_path):
    assert parse_axes(["wandb.tags=[a,b]"]) == [("wandb.tags", ["[a,b]"])]
    assert parse_axes(["wandb.tags=[a,b],[c]", "seed=0,1"]) == [("wandb.tags", ["[a,b]", "[c]"]),
                                                                ("seed", ["0", "1"])]
    assert parse_axes(["x=[[1, 2], [3]],{a: 1, b: 2},'p,q',it's"]) == [
        ("x", ["[[1, 2], [3]]", "{a: 1, b: 2}", "'p,q'", "it's"])]
    from fedclust.config import load_config

    points = expand(parse_axes(["wandb.tags=[a,b],[c]"]), tmp_path)
    assert [load_config("configs/synthetic_cluster4.yaml", p.overrides).wandb.tags for p in points] == [
        ["a", "b"], ["c"]]
    assert len({p.out for p in points}) == 2


@pytest.mark.parametrize("spec, words", [
    ("wandb.tags=[a,b", "a bracket is not closed; a list value is written KEY=[a,b] and several of them KEY=[a,b],[c]"),
    ("wandb.tags=a]", "']' closes no bracket"),
    ("data.root='a,b", "the quote ' is not closed"),
])
def test_unclosed_lists_and_quotes_are_refused(spec, words):
    import re

    with pytest.raises(FedclustError, match=re.escape(f"--grid {spec!r}: {words}")):
        parse_axes([spec])


def test_two_points_in_one_directory_are_refused(tmp_path):
    with pytest.raises(FedclustError, match="points data.root=a/b and data.root=a_b both get the run directory "
                                            "data.root=a_b"):
        expand(parse_axes(["data.root=a/b,a_b"]), tmp_path)


SHIPPED = sorted([*ROOT.glob("configs/*.yaml"), *ROOT.glob("configs/sweeps/*.yaml"), *ROOT.glob("launch/*.py"),
                  *ROOT.glob("slurm/*.sh")])


def test_shipped_files_cite_only_what_the_repository_holds():
    """No shipped config, launcher or job script points to files that are not
    in the repository (papers/..., SPEC); the docs/algorithms.md sections they
    cite exist, and the paper titles they quote are those of its Papers table."""
    import re

    docs = (ROOT / "docs" / "algorithms.md").read_text()
    headings = {line[3:].strip() for line in docs.splitlines() if line.startswith("## ")}
    cited, titles = set(), set()
    for path in SHIPPED:
        text = path.read_text()
        assert not re.search(r"papers/|\bSPEC\b", text), f"{path.relative_to(ROOT)} cites papers/ or SPEC"
        flat = " ".join(re.sub(r"\n\s*#+", " ", text).split())   # comments joined across lines
        cited |= set(re.findall(r'docs/algorithms\.md, section "([^"]+)"', flat))
        if path.suffix == ".yaml":
            titles |= set(re.findall(r'"([A-Z][^"]{20,})"', flat))
    assert {"Papers", "FPFC: `fpfc`"} <= cited and cited <= headings, cited - headings
    papers = docs.split("\n## Papers")[1].split("\n## ")[0]
    assert {"Federated Optimization in Heterogeneous Networks",
            "Clustered Federated Learning for Heterogeneous Data (Student Abstract)"} <= titles
    for title in titles:
        assert f'"{title}"' in papers, title


JOB_SCRIPTS = sorted(p for p in ROOT.glob("slurm/*.sh") if "#SBATCH" in p.read_text())


def sbatch_directives(text: str) -> list[str]:
    """The options sbatch reads from a script: '#SBATCH' lines before its first command."""
    found = []
    for line in text.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            found.append(line.split()[1])
    return found


@pytest.mark.parametrize("script", JOB_SCRIPTS, ids=lambda p: p.name)
def test_job_script_has_commented_cluster_settings_and_environment(script):
    text = script.read_text()
    read = sbatch_directives(text)
    assert "--requeue" in read and not [d for d in read if d.startswith(("--partition", "--account", "--mem"))]
    uncommented = sbatch_directives(text.replace("\n##SBATCH", "\n#SBATCH"))
    assert [d.split("=")[0] for d in uncommented if d.startswith(("--partition", "--account", "--mem"))] == [
        "--partition", "--account", "--mem"]   # one '#' less and sbatch reads them
    head = text.split("\nset -euo pipefail")[0]   # activation comes before set -u
    for line in ("# module load ", '# source "$HOME/venvs/fedclust/bin/activate"', "conda activate fedclust"):
        assert line in head, line
    assert "FEDCLUST_PYTHON" in head


@pytest.mark.parametrize("script", [p for p in JOB_SCRIPTS if "fedclust_srun" in p.read_text()], ids=lambda p: p.name)
def test_fedclust_python_names_the_interpreter_srun_starts(script, tmp_path):
    """As the script's comment says: FEDCLUST_PYTHON=... sbatch <script> runs that interpreter on every task."""
    assert f"FEDCLUST_PYTHON=$HOME/venvs/fedclust/bin/python sbatch slurm/{script.name}" in script.read_text()
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "srun $*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "FEDCLUST_PYTHON": "/opt/env/bin/python",
           "SLURM_JOB_ID": "5", "SLURM_ARRAY_JOB_ID": "4", "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "6",
           "SLURM_ARRAY_TASK_MIN": "0", "SLURM_SUBMIT_DIR": str(ROOT), "OUT": str(tmp_path / "run")}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "srun --kill-on-bad-exit=1 /opt/env/bin/python -m fedclust run " in proc.stdout
