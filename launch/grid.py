"""Grids of runs: ``KEY=v1,v2`` axes expanded to points, each point's run
directory named from its values (the same grid gives the same directories,
so a grid submitted again finds the runs it already has)."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from fedclust.errors import FedclustError


def refuse_out(key: str, where: str, named_by: str, fix: str) -> None:
    """The launchers name every run's directory themselves, so a key ``out``
    (or ``out.*``) given to them is refused: ``where`` it was written,
    ``named_by`` whom the directory is named by instead, ``fix`` what to do."""
    key = key.strip()
    if key == "out" or key.startswith("out."):
        raise FedclustError(f"{where}: each point's run directory is named by {named_by}; {fix}")


@dataclass(frozen=True)
class Point:
    """One run of a grid: its overrides (the grid's values) and directory."""

    values: tuple[tuple[str, str], ...]
    out: Path

    @property
    def overrides(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.values]

    @property
    def finished(self) -> bool:
        return (self.out / "summary.json").is_file()


def split_values(spec: str, values: str) -> list[str]:
    """``V1,V2,...`` split at the commas outside brackets and quotes, so that
    a YAML flow list or mapping (``[a,b]``, ``{x: 1}``) or a quoted string
    stays one value: ``[a,b],[c]`` -> ``["[a,b]", "[c]"]``."""
    items, depth, quote, start = [], 0, None, 0
    for i, ch in enumerate(values):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"" and not values[start:i].strip():   # a quote opens a value, as in YAML
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
            if depth < 0:
                raise FedclustError(f"--grid {spec!r}: {ch!r} closes no bracket; a list value is written "
                                    "KEY=[a,b] and several of them KEY=[a,b],[c]")
        elif ch == "," and depth == 0:
            items.append(values[start:i].strip())
            start = i + 1
    if quote:
        raise FedclustError(f"--grid {spec!r}: the quote {quote} is not closed; a quoted value is one value "
                            f"(KEY={quote}a,b{quote},c: two values)")
    if depth:
        raise FedclustError(f"--grid {spec!r}: a bracket is not closed; a list value is written KEY=[a,b] and "
                            "several of them KEY=[a,b],[c] (quote the whole option for the shell: "
                            "--grid 'KEY=[a,b],[c]')")
    return items + [values[start:].strip()]


def parse_axes(specs: list[str]) -> list[tuple[str, list[str]]]:
    """``["seed=0,1", "algorithm.name=a,b"]`` -> ``[("seed", ["0", "1"]), ...]``;
    a bracketed value is one value (``wandb.tags=[a,b],[c]``: two)."""
    axes: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        key = key.strip()
        items = split_values(spec, values)
        if not sep or not key or not all(items):
            raise FedclustError(f"--grid {spec!r}: write each axis as KEY=V1,V2,... (e.g. seed=0,1,2), with no "
                                "empty value")
        if key in {k for k, _ in axes}:
            raise FedclustError(f"--grid: key {key!r} is given twice; put all its values in one axis ({key}=V1,V2)")
        refuse_out(key, f"--grid {key}=...", "the grid", "set the grid's folder with --out instead")
        if len(set(items)) != len(items):
            raise FedclustError(f"--grid {spec!r}: a value is repeated; give each value once")
        axes.append((key, items))
    return axes


def dir_name(values: tuple[tuple[str, str], ...]) -> str:
    """``algorithm.name=panm_grad,seed=0``: the point's values in the grid's
    order; characters that do not belong in a file name become ``_``."""
    if not values:
        return "run"
    return ",".join(re.sub(r"[^A-Za-z0-9._=+-]", "_", f"{k}={v}") for k, v in values)


def expand(axes: list[tuple[str, list[str]]], root: str | Path) -> list[Point]:
    """Every combination of the axes' values (the last axis varies fastest)."""
    keys = [k for k, _ in axes]
    points: list[Point] = []
    seen: dict[Path, Point] = {}
    for combo in itertools.product(*[vals for _, vals in axes]):
        values = tuple(zip(keys, combo))
        point = Point(values, Path(root) / dir_name(values))
        if point.out in seen:   # two runs in one directory: the second would resume or refuse the first
            raise FedclustError(f"--grid: points {' '.join(seen[point.out].overrides)} and "
                                f"{' '.join(point.overrides)} both get the run directory {point.out.name} "
                                "(characters other than letters, digits and ._=+- become _ in a directory "
                                "name); give values that differ in those characters")
        seen[point.out] = point
        points.append(point)
    return points
