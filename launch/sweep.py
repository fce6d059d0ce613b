"""Run a W&B sweep file without W&B's server: for clusters whose nodes have
no internet.  The sweep's points are expanded here, run through
:func:`launch.submit.submit_points` (a Slurm job array through submitit, or
this machine in turn with ``--local``) with ``WANDB_MODE=offline``, and
uploaded afterwards with ``wandb sync``.

examples:
  # what would run, on this machine, and where; runs nothing
  python -m launch.sweep configs/sweeps/cifar_panm_k_l.yaml --local --dry-run
  # the 36 runs of the PANM paper's Table 2 on Slurm: one GPU and 2 hours each, in partition gpu
  python -m launch.sweep configs/sweeps/fmnist_table2.yaml --gpus 1 --time 2:00:00 --partition gpu
  # 20 points drawn from a sweep file of yours with method: random
  python -m launch.sweep my_random_sweep.yaml --count 20 --seed 0 --gpus 1

--gpus is 0 unless given: each Slurm job then gets --tasks CPU tasks and no
GPU, and the runs train on CPU; --dry-run shows what each job asks for.

What is read from the sweep file (the format of ``wandb sweep FILE``):

- ``command``: the words after ``fedclust run`` give the fedclust config and
  the fixed ``KEY=VALUE`` overrides (``${...}`` macros dropped); the launcher
  in front (``python -m``, ``torchrun``, ``srun``) is not used: ``--gpus`` /
  ``--tasks`` say how many processes a run gets.  It must pass the points
  with ``${args_no_hyphens}`` (``key=value``, fedclust's override syntax).
- ``method: grid``: every combination of the parameters' ``values`` (a
  ``value`` is one value; ``int_uniform`` is every integer of [min, max] and
  ``q_uniform`` ``min, min+q, ...`` below max, as W&B's grid); the last
  parameter varies fastest.  ``--count N`` runs the first N points.
- ``method: random``: ``--count`` points (default: the file's ``run_cap``)
  drawn with a generator seeded by ``--seed``: ``values`` uniformly, and the
  distributions ``uniform``, ``int_uniform``, ``q_uniform``, ``log_uniform``,
  ``log_uniform_values``, ``categorical``, ``constant`` as W&B defines them.
  The same seed and count give the same points; a larger count keeps the
  first ones.
- ``method: bayes`` needs W&B's server (each point follows from the results
  so far) and is refused, as are other distributions (the error names the
  parameter and the fix).

Each point runs into ``ROOT/<name>`` (ROOT: ``--out``, default
``runs/sweeps/<sweep file name>``): grid points are named by their values
(``algorithm.name=pens,seed=0``), random ones ``s<seed>-<index>-<values>``
(floats to 4 significant digits in the name, exact in the run); parameters
with a single ``value`` are left out of the names.  Running the same sweep
again skips the finished runs and resumes the others from their checkpoints.
Runs with ``wandb.enabled=true`` keep their offline W&B run under
``<run dir>/wandb/offline-run-*``; upload them with
``wandb sync ROOT/*/wandb/offline-run-*``.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedclust.errors import FedclustError
from launch.grid import Point, dir_name, refuse_out
from launch.submit import HelpFormatter, add_launch_args, launched, resources_from_args, submit_points

# The top-level keys of a W&B sweep file (W&B refuses others).
SWEEP_KEYS = {"program", "command", "method", "metric", "parameters", "name", "description", "project", "entity",
              "early_terminate", "run_cap", "controller", "apiVersion", "kind", "job", "image_uri", "scheduler",
              "metrics"}
MACRO = "${args_no_hyphens}"
RANDOM_DISTRIBUTIONS = ("categorical", "constant", "int_uniform", "uniform", "q_uniform", "log_uniform",
                        "log_uniform_values")
GRID_DISTRIBUTIONS = ("categorical", "constant", "int_uniform", "q_uniform")


@dataclass(frozen=True)
class Parameter:
    """One entry of ``parameters:``: its name (a fedclust key) and its
    distribution's settings, W&B's defaults filled in."""

    name: str
    distribution: str
    spec: dict

    @property
    def constant(self) -> bool:
        return self.distribution == "constant"

    def grid_values(self) -> list:
        """Its values in a grid (W&B's grid: categorical, constant, int_uniform, q_uniform)."""
        d, s = self.distribution, self.spec
        if d == "categorical":
            return list(s["values"])
        if d == "constant":
            return [s["value"]]
        if d == "int_uniform":
            return list(range(s["min"], s["max"] + 1))
        if d == "q_uniform":   # W&B's grid: numpy.arange(min, max, q), max excluded
            q = s["q"]
            return [s["min"] + i * q for i in range(max(0, math.ceil((s["max"] - s["min"]) / q)))]
        raise FedclustError(f"parameter {self.name!r}: distribution {d!r} has no grid; give it 'values: [...]' "
                            "(or int_uniform/q_uniform bounds), or use 'method: random' with --count N")

    def draw(self, rng: random.Random) -> Any:
        """One value drawn as W&B's random search does."""
        d, s = self.distribution, self.spec
        if d == "categorical":
            return s["values"][rng.randrange(len(s["values"]))]
        if d == "constant":
            return s["value"]
        if d == "int_uniform":
            return rng.randint(s["min"], s["max"])
        if d == "uniform":
            return rng.uniform(s["min"], s["max"])
        if d == "q_uniform":   # round(X / q) * q, an int when q is one
            v = round(rng.uniform(s["min"], s["max"]) / s["q"]) * s["q"]
            return int(v) if isinstance(s["q"], int) else float(v)
        if d == "log_uniform":   # bounds are natural logs
            return math.exp(rng.uniform(s["min"], s["max"]))
        if d == "log_uniform_values":   # bounds are the values themselves (clamped: exp(log(x)) may round past x)
            return min(max(math.exp(rng.uniform(math.log(s["min"]), math.log(s["max"]))), s["min"]), s["max"])
        raise AssertionError(d)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_parameter(name: str, spec: Any) -> Parameter:
    """A parameter's spec as W&B reads it: ``values`` (categorical),
    ``value`` (constant), ``min``/``max`` (int_uniform when both are integers,
    else uniform), or an explicit ``distribution``."""
    where = f"parameter {name!r}"
    refuse_out(name, where, "launch.sweep (W&B's agent: by the sweep and run id)", "remove 'out' from the parameters")
    if not isinstance(spec, dict):
        raise FedclustError(f"{where}: write it as a mapping, e.g. 'values: [1, 2]' or 'value: 1'")
    if "parameters" in spec:
        raise FedclustError(f"{where}: nested parameters are not passed as fedclust keys by ${{args_no_hyphens}}; "
                            f"write each as one dotted name at the top of 'parameters:' (e.g. {name}.k)")
    spec = dict(spec)
    dist = spec.pop("distribution", None)
    if dist is None:
        if "values" in spec:
            dist = "categorical"
        elif "value" in spec:
            dist = "constant"
        elif "min" in spec and "max" in spec:
            dist = "int_uniform" if _int(spec["min"]) and _int(spec["max"]) else "uniform"
        else:
            raise FedclustError(f"{where}: give 'values: [...]', 'value: V', or 'min'/'max' (with a 'distribution')")
    if dist not in RANDOM_DISTRIBUTIONS:
        raise FedclustError(f"{where}: distribution {dist!r} is not supported by launch.sweep (it draws "
                            f"{', '.join(RANDOM_DISTRIBUTIONS)}); use one of these, or list the values to try "
                            "with 'values: [...]'")
    allowed = {"categorical": {"values"}, "constant": {"value"}, "q_uniform": {"min", "max", "q"}}.get(
        dist, {"min", "max"})
    extra = set(spec) - allowed
    if extra:
        raise FedclustError(f"{where}: {dist} takes {', '.join(sorted(allowed))}, not {', '.join(sorted(extra))}")
    missing = allowed - set(spec) - {"q"}
    if missing:
        raise FedclustError(f"{where}: {dist} needs {', '.join(sorted(missing))}")
    if dist == "categorical":
        values = spec["values"]
        if not isinstance(values, list) or not values:
            raise FedclustError(f"{where}: 'values' must be a non-empty list, e.g. values: [1, 2, 3]")
        if len({yaml.safe_dump(v) for v in values}) != len(values):
            raise FedclustError(f"{where}: a value is repeated in {values}; give each value once")
        return Parameter(name, dist, spec)
    if dist == "constant":
        return Parameter(name, dist, spec)
    lo, hi = spec["min"], spec["max"]
    if not (_number(lo) and _number(hi) and math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
        raise FedclustError(f"{where}: min and max must be finite numbers with min <= max, got {lo!r} and {hi!r}")
    if dist == "int_uniform" and not (_int(lo) and _int(hi)):
        raise FedclustError(f"{where}: int_uniform needs integer min and max, got {lo!r} and {hi!r}")
    if dist == "log_uniform_values" and lo <= 0:
        raise FedclustError(f"{where}: log_uniform_values needs min > 0 (the values themselves), got {lo!r}; "
                            "log_uniform takes natural logs as bounds")
    if dist == "q_uniform":
        spec.setdefault("q", 1.0)   # W&B's default
        if not (_number(spec["q"]) and spec["q"] > 0):
            raise FedclustError(f"{where}: q must be a number > 0, got {spec['q']!r}")
    return Parameter(name, dist, spec)


@dataclass
class Sweep:
    """A sweep file: what to run (config, fixed overrides) and how to pick points."""

    path: Path
    method: str
    config: str | None
    fixed: list[str]
    parameters: list[Parameter]
    run_cap: int | None
    ignored: list[str]

    @property
    def tracked(self) -> bool:
        """Some run has ``wandb.enabled=true`` (from the command or a parameter)."""
        from fedclust.configfile import parse_override

        words = list(self.fixed) + [f"{p.name}={v}" for p in self.parameters if p.distribution in GRID_DISTRIBUTIONS
                                    for v in p.grid_values()]
        return any(k == "wandb.enabled" and v is True for k, v in map(parse_override, words))


def fedclust_words(command: Any, path) -> tuple[str | None, list[str]]:
    """(config, fixed overrides): the words after ``fedclust run`` in the
    sweep's ``command``, ``${...}`` macros dropped."""
    if not isinstance(command, list) or not all(isinstance(c, (str, int, float)) for c in command):
        raise FedclustError(f"{path}: 'command' must be a list of words, e.g. [python, -m, fedclust, run, "
                            f"configs/x.yaml, wandb.enabled=true, {MACRO}]")
    words = [str(c) for c in command]
    if MACRO not in words:
        raise FedclustError(f"{path}: 'command' must pass the points with {MACRO} (key=value, fedclust's override "
                            "syntax); ${args} would give --key=value, which fedclust does not take")
    start = next((i + 2 for i in range(len(words) - 1)
                  if (words[i] == "fedclust" or words[i].endswith("/fedclust")) and words[i + 1] == "run"), None)
    if start is None:
        raise FedclustError(f"{path}: 'command' runs no 'fedclust run' (e.g. [python, -m, fedclust, run, CONFIG, "
                            f"{MACRO}])")
    rest = [w for w in words[start:] if not (w.startswith("${") and w.endswith("}"))]
    config = None
    if rest and "=" not in rest[0]:
        config, rest = rest[0], rest[1:]
    for w in rest:
        if "=" not in w or w.startswith("-"):
            raise FedclustError(f"{path}: command word {w!r} after 'fedclust run CONFIG' is not a KEY=VALUE override")
        refuse_out(w.split("=", 1)[0], f"{path}: {w}", "launch.sweep (W&B's agent: runs/sweeps/<sweep id>/<run id>)",
                   "remove out= from the command")
    return config, rest


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file (FedclustError naming the file, the key and the fix)."""
    path = Path(path)
    if not path.is_file():
        raise FedclustError(f"{path}: no such sweep file (see configs/sweeps/)")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise FedclustError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise FedclustError(f"{path}: a sweep file is a mapping with method, parameters and command")
    unknown = sorted(set(raw) - SWEEP_KEYS)
    if unknown:
        raise FedclustError(f"{path}: unknown top-level key(s) {', '.join(unknown)}; a W&B sweep file takes "
                            f"{', '.join(sorted(SWEEP_KEYS))}")
    method = raw.get("method")
    if method == "bayes":
        raise FedclustError(f"{path}: method 'bayes' picks each point from the results so far on W&B's server, "
                            "which launch.sweep cannot do offline; use 'method: random' with the same parameters "
                            "(and --count N), or run it with 'wandb agent' where there is internet")
    if method not in ("grid", "random"):
        raise FedclustError(f"{path}: method {method!r}: launch.sweep runs 'grid' or 'random'")
    if "command" not in raw:
        raise FedclustError(f"{path}: no 'command'; W&B's default passes --key=value, which fedclust does not take: "
                            f"write command: [python, -m, fedclust, run, CONFIG, wandb.enabled=true, {MACRO}]")
    config, fixed = fedclust_words(raw["command"], path)
    params = raw.get("parameters")
    if not isinstance(params, dict) or not params:
        raise FedclustError(f"{path}: 'parameters' must map fedclust keys to their values, e.g. "
                            "seed: {values: [0, 1, 2]}")
    try:
        parameters = [parse_parameter(str(k), v) for k, v in params.items()]
    except FedclustError as exc:
        raise FedclustError(f"{path}: {exc}") from None
    run_cap = raw.get("run_cap")
    if run_cap is not None and not (_int(run_cap) and run_cap > 0):
        raise FedclustError(f"{path}: run_cap must be a positive integer, got {run_cap!r}")
    ignored = [k for k in ("early_terminate",) if k in raw]
    return Sweep(path, method, config, fixed, parameters, run_cap, ignored)


def word(value: Any) -> str:
    """A value as ``${args_no_hyphens}`` writes it (``str``; fedclust reads it as YAML)."""
    return str(value)


def short(value: Any) -> str:
    """A value in a directory name: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def grid_values(sweep: Sweep) -> list[list[tuple[str, Any]]]:
    """Every combination of the parameters' grid values, the last fastest."""
    for p in sweep.parameters:
        if p.distribution not in GRID_DISTRIBUTIONS:
            raise FedclustError(f"{sweep.path}: method grid: parameter {p.name!r} has distribution "
                                f"{p.distribution!r}, which has no grid; give it 'values: [...]', or use "
                                "'method: random' with --count N")
    names = [p.name for p in sweep.parameters]
    return [list(zip(names, combo)) for combo in itertools.product(*[p.grid_values() for p in sweep.parameters])]


def random_values(sweep: Sweep, count: int, seed: int) -> list[list[tuple[str, Any]]]:
    """``count`` points, each parameter drawn in the file's order from one
    generator seeded with ``seed`` (point i does not depend on count)."""
    rng = random.Random(seed)
    return [[(p.name, p.draw(rng)) for p in sweep.parameters] for _ in range(count)]


def sweep_points(sweep: Sweep, root: str | Path, count: int | None = None, seed: int = 0) -> list[Point]:
    """The sweep's points as :class:`launch.grid.Point` under ``root``."""
    root = Path(root)
    searched = {p.name for p in sweep.parameters if not p.constant}
    if count is not None and count < 1:
        raise FedclustError(f"--count {count}: must be at least 1")
    points = []
    if sweep.method == "grid":
        combos = grid_values(sweep)
        for combo in combos[:count] if count else combos:
            name = dir_name(tuple((k, word(v)) for k, v in combo if k in searched))
            points.append(Point(tuple((k, word(v)) for k, v in combo), root / name))
        return points
    count = count or sweep.run_cap
    if not count:
        raise FedclustError(f"{sweep.path}: method random: say how many points to draw with --count N "
                            "(or run_cap: N in the sweep file)")
    for i, combo in enumerate(random_values(sweep, count, seed)):
        shown = dir_name(tuple((k, short(v)) for k, v in combo if k in searched))
        points.append(Point(tuple((k, word(v)) for k, v in combo), root / f"s{seed}-{i:03d}-{shown}"))
    return points


def offline_overrides(sweep: Sweep) -> list[str]:
    """The command's overrides plus ``wandb.mode=offline`` when runs are
    tracked (besides WANDB_MODE=offline in their environment), so that no
    run tries W&B's server from a node without internet."""
    return sweep.fixed + (["wandb.mode=offline"] if sweep.tracked else [])


def run_sweep(path: str | Path, out: str | None = None, count: int | None = None, seed: int = 0, resources=None,
              local: bool = False, wait: bool = False, dry_run: bool = False, echo=print) -> list[Point]:
    """Expand the sweep file's points and :func:`launch.submit.submit_points` them."""
    sweep = load_sweep(path)
    for key in sweep.ignored:
        echo(f"note: {key} is read by W&B's server only; launch.sweep runs every point to its end")
    root = Path(out or f"runs/sweeps/{Path(path).stem}")
    points = sweep_points(sweep, root, count, seed)
    fixed = offline_overrides(sweep)
    how = f"seed {seed}" if sweep.method == "random" else "grid"
    echo(f"{sweep.path}: {len(points)} points ({how}) of fedclust run {sweep.config or '(defaults)'} "
         f"{' '.join(fixed)} into {root}")
    submit_points(sweep.config, points, root, fixed, resources, local=local, wait=wait,
                  dry_run=dry_run, echo=echo, env={"WANDB_MODE": "offline"})
    if sweep.tracked and not dry_run:
        ended = "" if (local or wait) else "when the runs have ended, "
        echo(f"upload to W&B ({ended}from a machine with internet): wandb sync {root}/*/wandb/offline-run-*")
    return points


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m launch.sweep", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=HelpFormatter)
    ap.add_argument("sweep", help="W&B sweep file, e.g. configs/sweeps/fmnist_table2.yaml")
    ap.add_argument("--count", type=int, help="points to draw (method random; default: the file's run_cap); "
                    "grid: run the first N points (default: all)")
    ap.add_argument("--seed", type=int, default=0, help="seed of method random's draws")
    ap.add_argument("--out", help="folder of the run directories (default: runs/sweeps/<sweep file name>)")
    add_launch_args(ap, "points")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return launched("launch.sweep", args, lambda: run_sweep(
        args.sweep, args.out, args.count, args.seed, resources_from_args(args), local=args.local, wait=args.wait,
        dry_run=args.dry_run))


if __name__ == "__main__":
    sys.exit(main())
