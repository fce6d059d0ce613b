"""Submit a grid of fedclust runs: one run per grid point, as one Slurm job
array through submitit, or on this machine in sequence (--local).

examples:
  # 2 seeds x 2 algorithms on this machine, one run after another (about a minute on a CPU)
  python -m launch.submit configs/synthetic_cluster4.yaml rounds=20 stage1_rounds=10 --local \\
      --grid seed=0,1 algorithm.name=panm_grad,fedavg
  # 3 seeds x 2 algorithms on Slurm: 6 jobs of one GPU each, 4 hours, in partition gpu
  python -m launch.submit configs/cifar_rotation4.yaml --grid seed=0,1,2 \\
      algorithm.name=panm_loss,panm_grad --gpus 1 --time 4:00:00 --partition gpu
  # what would be submitted, and what each job would ask Slurm for; submits nothing
  python -m launch.submit configs/cifar_rotation4.yaml --grid seed=0,1,2 --gpus 4 --time 1-00:00:00 --dry-run

--gpus is 0 unless given: each Slurm job then gets --tasks CPU tasks and no
GPU, and the runs train on CPU.  A list value is one value of an axis:
--grid 'wandb.tags=[a,b],[c]' is two runs.

Each point runs into OUT/<key=value,...> (OUT: --out, default
runs/<config name>-grid).  Submitting the same grid again skips the runs
that finished (their summary.json exists) and those whose job is still
queued or running; an unfinished run is submitted again and resumes from its
newest checkpoint.  On Slurm, each task gets USR1 --signal-seconds before
its time limit, checkpoints, requeues itself and resumes.  Every point's
config is checked before anything is submitted.

From Python: submit_grid("configs/x.yaml", ["seed=0,1"], resources=Resources(gpus=1)).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from fedclust.errors import FedclustError
from launch.grid import Point, expand, parse_axes, refuse_out
from launch.jobs import (
    ACTIVE_STATES,
    TIME_FORMS,
    Ledger,
    Resources,
    format_time,
    job_state,
    parse_time,
    run_local,
    submit_slurm,
    wait_for,
)


def check_points(config: str | None, fixed: list[str], points: list[Point], slurm_gpus: int | None = None) -> None:
    """Every point's config loads, validates and may use its directory
    (fedclust's own checks: a directory holding another run is refused).
    ``slurm_gpus``: the GPUs each Slurm job asks for (None: not on Slurm);
    0 refuses ``device=cuda``, which would fail on a node given no GPU."""
    from fedclust.config import load_config
    from fedclust.runner import prepare

    for p in points:
        try:
            cfg = load_config(config, [*fixed, *p.overrides, f"out={p.out}"])
            if slurm_gpus == 0 and cfg.device == "cuda":
                raise FedclustError("device=cuda, but --gpus is 0, so each Slurm job asks for no GPU and the run "
                                    "would fail on its node; add --gpus N (N GPUs per node, one task each), or "
                                    "set device=cpu or device=auto")
            prepare(cfg)
        except FedclustError as exc:
            raise FedclustError(f"grid point {p.out.name}: {exc}") from None


def plan(points: list[Point], ledger: Ledger) -> tuple[list[Point], list[tuple[Point, str]]]:
    """(to run, [(skipped, why)])."""
    last = ledger.last_jobs()
    todo, skipped = [], []
    for p in points:
        if p.finished:
            skipped.append((p, "finished"))
            continue
        job = last.get(str(p.out))
        state = job_state(job) if job else None
        if state in ACTIVE_STATES:
            skipped.append((p, f"job {job} is {state}"))
            continue
        todo.append(p)
    return todo, skipped


def submit_grid(config: str | None, grid: list[str], overrides: Sequence[str] = (), out: str | None = None,
                resources: Resources | None = None, local: bool = False, wait: bool = False,
                dry_run: bool = False, echo=print) -> list[Point]:
    """Expand the grid's axes into points under ``out`` and :func:`submit_points` them."""
    root = Path(out or f"runs/{Path(config).stem if config else 'defaults'}-grid")
    points = expand(parse_axes(list(grid)), root)
    return submit_points(config, points, root, overrides, resources, local=local, wait=wait, dry_run=dry_run,
                         echo=echo)


def submit_points(config: str | None, points: list[Point], root: Path, overrides: Sequence[str] = (),
                  resources: Resources | None = None, local: bool = False, wait: bool = False,
                  dry_run: bool = False, echo=print, env: dict | None = None) -> list[Point]:
    """Check every point, then submit (or run) the unfinished ones; returns the
    points.  With ``wait`` (always with ``local``) returns when all have ended,
    raising if any ended without a summary.  ``env``: variables set for the
    runs (e.g. ``WANDB_MODE=offline``)."""
    res = resources or Resources()
    res.check()
    fixed = list(overrides)
    for o in fixed:
        refuse_out(o.partition("=")[0], o, "the grid", "set the grid's folder with --out")
    root = Path(root)
    check_points(config, fixed, points, None if local else res.gpus)
    ledger = Ledger(root)
    todo, skipped = plan(points, ledger)
    for p, why in skipped:
        echo(f"skip   {p.out}  ({why})")
    if dry_run:
        for p in todo:
            echo(f"would run {p.out}  ({' '.join(p.overrides)})")
    if todo and local:
        n = max(1, res.gpus or res.tasks)
        echo(f"on this machine, one run after another, {n} process{'es' if n > 1 else ''} each "
             "(--gpus, or --tasks when --gpus is 0); no Slurm job")
    elif todo:
        echo(f"each Slurm job {'would ask' if dry_run else 'asks'} for:")
        for line in res.describe(len(todo)):
            echo(line)
    if dry_run:
        if not todo:
            echo(f"nothing would be submitted: all {len(points)} runs are finished or queued")
        return points
    failed: list[tuple[Point, str]] = []
    if not todo:
        echo(f"nothing to submit: all {len(points)} runs are finished or queued")
    elif local:
        for i, p in enumerate(todo, 1):
            echo(f"run    {p.out}  ({i}/{len(todo)} on this machine)")
            rc = run_local(p, config, fixed, max(1, res.gpus or res.tasks), env)
            if rc != 0 or not p.finished:
                failed.append((p, f"fedclust run exited with status {rc}"))
    else:
        entries = submit_slurm(todo, config, fixed, root / ".submitit", f"fedclust-{root.name}", res, env)
        ledger.record(entries)
        for p, job, log in entries:
            echo(f"submit {p.out}  (job {job}, log {log})")
        if wait:
            failed = wait_for(entries)
    echo("run directories:")
    for p in points:
        echo(f"  {p.out}")
    echo(f"results table: fedclust report {root}/*")
    if failed:
        raise FedclustError("; ".join(f"{p.out}: {why}" for p, why in failed))
    return points


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description's and epilog's own line breaks, and each option's
    default at the end of its help: ``(default: off)`` for a flag, the value
    otherwise; an option whose default is no value says in its help what
    happens without it, and a required one has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.required or "default" in text or action.default is argparse.SUPPRESS:
            return text
        if action.nargs == 0:
            return f"{text} (default: {'on' if action.default else 'off'})"
        return f"{text} (default: %(default)s)"


def time_option(text: str) -> int:
    """``--time`` for argparse: sbatch's forms, in minutes."""
    try:
        return parse_time(text)
    except FedclustError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--time ")) from None


def add_launch_args(ap: argparse.ArgumentParser, what: str) -> None:
    """The options ``launch.submit`` and ``launch.sweep`` share: where the
    runs go (``--local``, ``--wait``, ``--dry-run``) and the Slurm resources
    (``--partition``, ``--gpus``, ``--time``, ...; read back with
    :func:`resources_from_args`)."""
    ap.add_argument("--local", action="store_true", help=f"run the {what} on this machine, one run after another")
    ap.add_argument("--wait", action="store_true", help="wait for the Slurm jobs and print the results table")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the run directories and what each Slurm job would ask for; submit nothing")
    r = Resources()
    cluster = "(default: none, the cluster's default)"
    g = ap.add_argument_group("resources (Slurm; --gpus/--tasks also set the processes of --local runs)")
    g.add_argument("--partition", help=f"Slurm partition {cluster}")
    g.add_argument("--account", help=f"Slurm account {cluster}")
    g.add_argument("--qos", help=f"Slurm QOS {cluster}")
    g.add_argument("--gpus", type=int, default=r.gpus,
                   help=f"GPUs per node (--gres=gpu:N), one task (process) each (default: {r.gpus}: no GPU, the "
                   "runs train on --tasks CPU tasks; give --gpus N for a GPU run)")
    g.add_argument("--tasks", type=int, default=r.tasks, help="CPU tasks (processes) per node when --gpus is 0")
    g.add_argument("--cpus-per-task", type=int, default=r.cpus_per_task,
                   help="CPUs of each task (OMP_NUM_THREADS of each process)")
    g.add_argument("--nodes", type=int, default=r.nodes, help="nodes of each run")
    g.add_argument("--mem", help=f"Slurm --mem per node, e.g. 64G {cluster}")
    g.add_argument("--time", type=time_option, default=r.time_min, metavar="TIME",
                   help=f"time limit of each job: {TIME_FORMS}; seconds round up to a minute "
                   f"(default: {format_time(r.time_min)}, {r.time_min} minutes)")
    g.add_argument("--signal-seconds", type=int, default=r.signal_seconds,
                   help="USR1 this many seconds before the limit: checkpoint, requeue, resume")
    g.add_argument("--parallel", type=int, default=r.parallel, help="array tasks running at once")


def resources_from_args(args: argparse.Namespace) -> Resources:
    """:class:`Resources` from the options :func:`add_launch_args` added."""
    return Resources(partition=args.partition, account=args.account, qos=args.qos, gpus=args.gpus, tasks=args.tasks,
                     cpus_per_task=args.cpus_per_task, nodes=args.nodes, time_min=args.time,
                     signal_seconds=args.signal_seconds, parallel=args.parallel, mem=args.mem)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m launch.submit", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=HelpFormatter)
    ap.add_argument("config", help="YAML config, e.g. configs/cifar_rotation4.yaml")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="overrides for every run")
    ap.add_argument("--grid", nargs="+", required=True, metavar="KEY=V1,V2",
                    help="the grid's axes; every combination is one run; a bracketed list is one value "
                    "('wandb.tags=[a,b],[c]': two values)")
    ap.add_argument("--out", help="folder of the grid's run directories (default: runs/<config name>-grid)")
    add_launch_args(ap, "grid")
    return ap


def launched(prog: str, args: argparse.Namespace, launch) -> int:
    """Exit status of a launcher's ``main``: ``launch()`` returns the points;
    an error is printed under ``prog``; after ``--local`` or ``--wait`` the
    results table of the finished runs is printed."""
    try:
        points = launch()
    except FedclustError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    if (args.local or args.wait) and not args.dry_run:
        from fedclust import report

        done = [str(p.out) for p in points if p.finished]
        if done:
            report.main(done)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)   # overrides may stand between options
    return launched("launch.submit", args, lambda: submit_grid(
        args.config, args.grid, args.overrides, args.out, resources_from_args(args), local=args.local,
        wait=args.wait, dry_run=args.dry_run))


if __name__ == "__main__":
    sys.exit(main())
