"""What the readers of naturally federated data (``data.name=leaf``, ``data.name=hf``) share: their options
(``data.options``: ``min_samples``, ``shape``, ``num_classes``), the folder ``data.path``, which clients are kept,
and the arrays of npz's natural form they build (:class:`fedclust.data.sets.npz.Npz` then checks and loads them).
It registers no data set."""

from __future__ import annotations

import difflib
import math
import sys
from pathlib import Path

import numpy as np

from fedclust.data.sets.npz import Arrays, check_arrays
from fedclust.dist import launch_rank
from fedclust.errors import ConfigError, DataError
from fedclust.schema import DataConfig

CLASSES_KEY = "data.options.num_classes"


def bad(path: str, what: str, fix: str) -> DataError:
    """A DataError naming data.path (the folder read), what is wrong and the fix."""
    return DataError(f"data.path '{path}': {what}; {fix}")


# ---------------------------------------------------------------- options (leaf and hf)

def check_option_keys(name: str, options: dict, known: dict[str, str]) -> None:
    """Refuse a key of ``data.options`` that ``data.name=name`` does not read, naming the closest and all."""
    for key in options:
        if key not in known:
            close = ([k for k in known if k.startswith(str(key))]
                     or difflib.get_close_matches(str(key), list(known), n=1))
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError("data.options", options, f"data.name={name} takes no option '{key}'{hint}; it takes "
                              + "; ".join(f"{k}: {what}" for k, what in known.items()))


def whole_option(options: dict, key: str, default: int, least: int, fix: str = "") -> int:
    """``data.options.<key>``: a whole number ``>= least`` (``default`` when left out)."""
    value = options.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ConfigError(f"data.options.{key}", value, f"use a whole number >= {least}{fix}")
    return value


def shape_option(options: dict) -> tuple[int, ...] | None:
    """``data.options.shape``: a list of whole numbers >= 1 (None when left out)."""
    value = options.get("shape")
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in value)):
        raise ConfigError("data.options.shape", value, "give each example's input shape as a list of whole numbers "
                          ">= 1, e.g. data.options.shape=[1,28,28] for FEMNIST's 784 values (left out: as read)")
    return tuple(value)


def classes_option(options: dict) -> int | None:
    """``data.options.num_classes``: a whole number >= 2 (None when left out)."""
    if "num_classes" not in options:
        return None
    return whole_option(options, "num_classes", 0, 2, " (the classes of the model's output)")


def check_shared_options(options: dict, unit: str) -> None:
    """The options both readers take: ``min_samples`` (a whole number >= 0), ``shape``, ``num_classes``;
    ``unit`` names a client in the message (a LEAF user, a client)."""
    whole_option(options, "min_samples", 0, 0, f" (0: keep every {unit} with an example in each split)")
    shape_option(options)
    classes_option(options)


def reshaped(x: np.ndarray, shape: tuple[int, ...] | None, source: str) -> np.ndarray:
    """``x`` [N, ...] as [N, *shape]; ConfigError naming data.options.shape when the sizes differ."""
    if shape is None:
        return x
    per = math.prod(x.shape[1:])
    if math.prod(shape) != per:
        raise ConfigError("data.options.shape", list(shape), f"{source}'s examples hold {per} values each (shape "
                          f"{list(x.shape[1:])}) but {list(shape)} holds {math.prod(shape)}: give a shape of {per} "
                          "values (e.g. [1, 28, 28] for 784), or leave it out")
    return x.reshape(len(x), *shape)


def folder(cfg: DataConfig, what: str, example: str) -> Path:
    """``data.path`` as an existing folder; ConfigError naming it otherwise."""
    text = str(cfg.path or "")
    if not text:
        raise ConfigError("data.path", text, f"data.name={cfg.name} reads {what}: set data.path=DIR ({example})")
    p = Path(text).expanduser()
    if not p.is_dir():
        why = "a file, not a folder" if p.is_file() else f"no such folder ({p.resolve()})"
        raise ConfigError("data.path", text, f"{why}; give the folder of {what} ({example}; relative to where you "
                          "run fedclust, or absolute)")
    return p.resolve()


# ---------------------------------------------------------------- which clients (leaf and hf)

def keep_clients(path: str, train: dict, test: dict, min_samples: int, what: str, splits: tuple[str, str],
                 fix: str) -> tuple[list, str | None]:
    """``(kept, note)``: the clients (keys of ``train`` and ``test``, each a count of examples) in both splits
    with at least one example in each and ``min_samples`` in all, sorted; ``note`` says how many were dropped
    and why (None: none).  None kept: DataError naming data.path and ``fix`` (no client in both splits), or
    ConfigError naming data.options.min_samples (too high)."""
    both = set(train) & set(test)
    if not both:
        raise bad(path, f"no {what} is in both {splits[0]} ({len(train)} {what}s) and {splits[1]} ({len(test)})", fix)
    held = [u for u in both if train[u] > 0 and test[u] > 0]
    kept = sorted(u for u in held if train[u] + test[u] >= min_samples)
    if not kept:
        if held:
            most = max(train[u] + test[u] for u in held)
            raise ConfigError("data.options.min_samples", min_samples, f"no {what} holds {min_samples} examples (train "
                              f"+ test): the most any holds is {most}; use at most {most}")
        raise bad(path, f"no {what} of both {splits[0]} and {splits[1]} holds an example in each", fix)
    parts = [f"{len(set(train) - both)} in {splits[0]} only" if set(train) - both else "",
             f"{len(set(test) - both)} in {splits[1]} only" if set(test) - both else "",
             f"{len(both) - len(held)} without an example in each" if len(held) < len(both) else "",
             f"{len(held) - len(kept)} with fewer than data.options.min_samples={min_samples} examples"
             if len(kept) < len(held) else ""]
    dropped = "; ".join(p for p in parts if p)
    note = (f"data.path '{path}': {len(kept)} {what}s kept as the clients (sorted); dropped {dropped}"
            if dropped else None)
    return kept, note


def say(note: str | None) -> None:
    """One line at start-up about the clients dropped, from one process only (as fedclust.config.note)."""
    if note and launch_rank() == 0:
        print(f"fedclust: note: {note}", file=sys.stderr, flush=True)


def natural_arrays(path: str, splits: dict, num_classes: int | None) -> Arrays:
    """The arrays of npz's natural form (``splits``: {"train": (x, y, owner), "test": ...}), checked as a file
    of your own clients is (:func:`fedclust.data.sets.npz.check_arrays`)."""
    arrays = {}
    for split, (x, y, owner) in splits.items():
        arrays.update({f"x_{split}": x, f"y_{split}": y, f"client_{split}": owner})
    if num_classes is not None:
        arrays["num_classes"] = np.asarray(num_classes, dtype=np.int64)
    return check_arrays(path, arrays, CLASSES_KEY)


def whole_labels(path: str, where: str, y, fix: str = "") -> np.ndarray:
    """``y`` as int64, each a whole number >= 0 (``1.0`` is 1); DataError naming ``where`` otherwise."""
    try:
        a = np.asarray(y, dtype=np.float64)
    except (ValueError, TypeError):
        first = next((v for v in y if not isinstance(v, (int, float))), None)
        raise bad(path, f"{where} holds {first!r}, not a number", f"labels must be whole numbers 0..K-1{fix}") from None
    if a.ndim != 1:
        raise bad(path, f"{where} has shape {list(a.shape)}", "give one label per example")
    wrong = ~np.isfinite(a) | (a != np.round(a)) | (a < 0)
    if wrong.any():
        i = int(np.argmax(wrong))
        raise bad(path, f"{where}[{i}] is {y[i]!r}", f"labels must be whole numbers 0..K-1{fix}")
    return a.astype(np.int64)
