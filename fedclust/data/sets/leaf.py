"""LEAF's naturally federated data (FEMNIST, CelebA, ...): ``data.name=leaf
data.path=DIR``, DIR holding ``train/*.json`` and ``test/*.json`` as LEAF's
``preprocess.sh -t sample`` writes them (``leaf/data/femnist/data``).

Each JSON file is an object with ``users`` (a list), ``num_samples`` (each
user's count, checked where given) and ``user_data``
(``{user: {"x": [...], "y": [...]}}``).  An example's ``x`` is a flat list of
numbers (FEMNIST: 784 pixels in [0, 1]), or, as LEAF's CelebA writes it, an
image file name read from ``data.options.images`` (default
``DIR/raw/img_align_celeba``, LEAF's folder), resized to
``data.options.image_size`` (default 84, as LEAF's CelebA model) and read as
RGB ``[3, S, S]`` uint8, as LEAF's CelebA model does.  Labels are whole numbers
``>= 0`` (CelebA's ``0.0``/``1.0`` are read as 0 and 1).  Numeric inputs are
read as float32.

The clients are the LEAF users that are in both ``train/`` and ``test/``
(as LEAF's own models assume, ``-t sample``), hold at least one example in
each, and at least ``data.options.min_samples`` in the two together (LEAF's
``-k``); client i is the i-th of them in sorted order of their names.  Users
in one split only, or with too few examples, are dropped, and the config check
says how many (one line, ``fedclust: note``); none left is an error naming the
fix (``-t user`` puts each user in one split only).  A user given twice in one
split (in two files) is refused.

The users become the arrays of ``data.name=npz``'s natural form without a
``cluster`` array (``x_train, y_train, x_test, y_test, client_train,
client_test``, a user's examples in the file's order) and are checked and
loaded exactly as such a file (:class:`fedclust.data.sets.npz.Npz`): ``clients``
must be the number of users, inputs are normalised by ``x_train``'s mean and
standard deviation, labels must cover ``0..K-1`` (K the largest label + 1, or
``data.options.num_classes``), the true clusters are unknown (neighbour
precision, recall and ARI null; oracle refuses the data).

``data.options`` (:data:`OPTIONS`): ``min_samples``, ``shape`` (each example's
input shape, e.g. ``[1, 28, 28]`` for FEMNIST's CNN; default: as read, a flat
vector), ``num_classes``, ``images``, ``image_size``.  They are checked before
anything is read; any other key is refused.

The JSON files are read and checked once per process (again when one
changes); nothing is downloaded.  The helpers of this module (options, which
clients to keep) serve ``data.name=hf`` too.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import sys
from pathlib import Path

import numpy as np

from fedclust.data.registry import register
from fedclust.data.sets.npz import Arrays, Npz, check_arrays
from fedclust.data.sources import frozen_options
from fedclust.dist import launch_rank
from fedclust.errors import ConfigError, DataError
from fedclust.schema import DataConfig

OPTIONS = {
    "min_samples": "drop users with fewer examples (train + test), as LEAF's -k (default 0: none)",
    "shape": "each example's input shape, e.g. [1, 28, 28] for FEMNIST (default: as read)",
    "num_classes": "the class count K, when some of 0..K-1 occur in no example (default: the largest label + 1)",
    "images": "the folder of CelebA's image files (default: DIR/raw/img_align_celeba)",
    "image_size": "the side images are resized to (default 84, as LEAF's CelebA model)",
}
CLASSES_KEY = "data.options.num_classes"
PREPROCESS = ("run LEAF's preprocess.sh with -t sample (e.g. ./preprocess.sh -s niid --sf 0.05 -k 0 -t sample in "
              "leaf/data/femnist) and give the folder it fills with train/ and test/ (leaf/data/femnist/data)")


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


# ---------------------------------------------------------------- LEAF's JSON files

def _files(root: Path, text: str) -> dict[str, list[Path]]:
    for split in ("train", "test"):
        if not (root / split).is_dir():
            held = ", ".join(sorted(p.name for p in root.iterdir())[:10]) or "nothing"
            raise ConfigError("data.path", text, f"{root} has no {split}/ folder (it holds: {held}); {PREPROCESS}")
    out = {}
    for split in ("train", "test"):
        sub = root / split
        files = sorted(sub.glob("*.json"))
        if not files:
            raise ConfigError("data.path", text, f"{sub} holds no .json file; {PREPROCESS}")
        out[split] = files
    return out


def _rows(path: str, where: str, x: list) -> np.ndarray | list[str]:
    """One user's inputs: float32 rows, or image file names (CelebA)."""
    if x and all(isinstance(v, str) for v in x):
        return list(x)
    try:
        a = np.asarray(x, dtype=np.float32)
    except (ValueError, TypeError) as err:
        raise bad(path, f"{where} is not a list of equally long rows of numbers ({err})",
                  "give each example as a list of numbers (or, as LEAF's CelebA, an image file name)") from None
    if a.ndim < 2:
        raise bad(path, f"{where} has shape {list(a.shape)}",
                  "give each example as a list of numbers (x: [[...], [...], ...])")
    finite = np.isfinite(a.reshape(len(a), -1)).all(axis=1)
    if not finite.all():
        raise bad(path, f"{where}[{int(np.argmin(finite))}] holds NaN or inf", "replace or drop that example")
    return a


def _read_split(path: str, split: str, files: list[Path]) -> dict[str, tuple]:
    """user -> (where, x rows or image names, y int64) of one split's files."""
    out: dict[str, tuple] = {}
    for f in files:
        name = f"{split}/{f.name}"
        try:
            obj = json.loads(f.read_text())
        except (OSError, ValueError) as err:
            raise bad(path, f"cannot read {name} as JSON ({type(err).__name__}: {err})", PREPROCESS) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("users"), list) or \
                not isinstance(obj.get("user_data"), dict):
            raise bad(path, f"{name} is not a LEAF file: it needs 'users' (a list) and 'user_data' ({{user: {{'x': "
                      "[...], 'y': [...]}}}})", PREPROCESS)
        users, data, counts = obj["users"], obj["user_data"], obj.get("num_samples")
        for i, user in enumerate(users):
            user = str(user)
            d = data.get(user)
            where = f"{name}: user '{user}'"
            if not isinstance(d, dict) or not isinstance(d.get("x"), list) or not isinstance(d.get("y"), list):
                raise bad(path, f"{where} has no 'x' and 'y' lists in user_data", PREPROCESS)
            x, y = d["x"], d["y"]
            if len(x) != len(y):
                raise bad(path, f"{where} has {len(x)} inputs (x) but {len(y)} labels (y)", "give one label per input")
            if isinstance(counts, list) and len(counts) == len(users) and counts[i] != len(y):
                raise bad(path, f"{where}: num_samples says {counts[i]}, but the user holds {len(y)} examples",
                          "rewrite the file with LEAF's preprocess.sh")
            if user in out:
                raise bad(path, f"user '{user}' is in both {out[user][0]} and {name}", "give each user once a split "
                          "(delete the folders an earlier preprocess.sh run left, then run it again)")
            labels = whole_labels(path, f"{where}'s y", y)
            rows = _rows(path, f"{where}'s x", x) if len(x) else None
            out[user] = (name, rows, labels)
    return out


def _images(path: str, where: Path, names: list[str], size: int) -> np.ndarray:
    """Image files as RGB [N, 3, size, size] uint8, each resized as LEAF's CelebA model does."""
    from PIL import Image

    out = np.empty((len(names), 3, size, size), dtype=np.uint8)
    for i, name in enumerate(names):
        try:
            with Image.open(where / name) as img:
                out[i] = np.asarray(img.resize((size, size)).convert("RGB")).transpose(2, 0, 1)
        except OSError as err:
            raise bad(path, f"cannot read the image {where / name} ({err})", "give LEAF's image files in "
                      f"{where} (data.options.images names the folder)") from None
    return out


@functools.lru_cache(maxsize=4)
def _cached(path: str, frozen: tuple, stamp: tuple) -> Arrays:
    options = dict(frozen)
    root = Path(path)
    files = {split: sorted(root / split / name for s, name, *_ in stamp if s == split) for split in ("train", "test")}
    users = {split: _read_split(path, split, files[split]) for split in ("train", "test")}
    train, test = ({u: len(v[2]) for u, v in users[s].items()} for s in ("train", "test"))
    kept, note = keep_clients(path, train, test, options.get("min_samples", 0), "user", ("train/", "test/"),
                              f"LEAF's -t user split gives each user to one split only: {PREPROCESS}")
    named = [isinstance(users[s][u][1], list) for s in ("train", "test") for u in kept]
    if any(named) and not all(named):
        raise bad(path, "some users' x are image file names, others' numbers", "give every example the same way")
    images = None
    if all(named):
        given = options.get("images")
        images = Path(given).expanduser() if given else root / "raw" / "img_align_celeba"
        if not images.is_dir():
            raise ConfigError("data.options.images", given, f"no folder {images.resolve()}: the x of {path} are image "
                              "file names (LEAF's CelebA), read from DIR/raw/img_align_celeba (LEAF's folder) unless "
                              "data.options.images names another")
    splits = {}
    shape = None if "shape" not in options else tuple(options["shape"])
    first = None
    for split in ("train", "test"):
        xs, ys, owner = [], [], []
        for i, user in enumerate(kept):
            where, rows, labels = users[split][user]
            if images is not None:
                rows = _images(path, images, rows, options.get("image_size", 84))
            if first is None:
                first = (where, rows.shape[1:])
            elif rows.shape[1:] != first[1]:
                raise bad(path, f"{where}'s examples have shape {list(rows.shape[1:])} but {first[0]}'s "
                          f"{list(first[1])}", "give every example the same number of values")
            xs.append(rows)
            ys.append(labels)
            owner.append(np.full(len(labels), i, dtype=np.int64))
        x = reshaped(np.concatenate(xs), shape, path)
        splits[split] = (x, np.concatenate(ys), np.concatenate(owner))
    arrays = natural_arrays(path, splits, options.get("num_classes"))
    say(note)    # once per process: what is read is cached
    return arrays


def read_leaf(cfg: DataConfig) -> Arrays:
    """The checked arrays of the LEAF folder ``data.path`` under ``data.options``, read once per process (again
    when a JSON file changes); options are checked before anything is read."""
    options = dict(cfg.options or {})
    check_option_keys("leaf", options, OPTIONS)
    whole_option(options, "min_samples", 0, 0, " (0: keep every user with an example in each split)")
    shape_option(options)
    classes_option(options)
    whole_option(options, "image_size", 84, 1, " (LEAF's CelebA model: 84)")
    if not isinstance(options.get("images", ""), str):
        raise ConfigError("data.options.images", options["images"], "give the folder of the image files as a path")
    root = folder(cfg, "LEAF's train/ and test/ JSON files", "e.g. data.path=leaf/data/femnist/data")
    files = _files(root, str(cfg.path))
    stamp = tuple((split, f.name, f.stat().st_mtime_ns, f.stat().st_size) for split in files for f in files[split])
    return _cached(str(root), frozen_options(options), stamp)


@register
class Leaf(Npz):
    name = "leaf"
    takes_options = True    # data.options: OPTIONS
    true_clusters_fix = "LEAF's users come with no true cluster"

    def arrays(self, cfg: DataConfig) -> Arrays:
        return read_leaf(cfg)

    def own_clients(self, a: Arrays) -> str:
        return "LEAF's users as its clients, which keep their own examples and have no true cluster"

    def client_ids(self, a: Arrays) -> str:
        return ("the users in both train/ and test/ with an example in each and at least data.options.min_samples "
                "in all, in sorted order")
