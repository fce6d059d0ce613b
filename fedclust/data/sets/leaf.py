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
changes); nothing is downloaded.  The helpers it shares with ``data.name=hf``
(options, which clients to keep) are in :mod:`fedclust.data.sets.natural`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from fedclust.data.registry import register
from fedclust.data.sets.natural import (
    bad,
    check_option_keys,
    check_shared_options,
    folder,
    keep_clients,
    natural_arrays,
    reshaped,
    say,
    whole_labels,
    whole_option,
)
from fedclust.data.sets.npz import Arrays, Npz
from fedclust.data.sources import frozen_options
from fedclust.errors import ConfigError
from fedclust.schema import DataConfig

OPTIONS = {
    "min_samples": "drop users with fewer examples (train + test), as LEAF's -k (default 0: none)",
    "shape": "each example's input shape, e.g. [1, 28, 28] for FEMNIST (default: as read)",
    "num_classes": "the class count K, when some of 0..K-1 occur in no example (default: the largest label + 1)",
    "images": "the folder of CelebA's image files (default: DIR/raw/img_align_celeba)",
    "image_size": "the side images are resized to (default 84, as LEAF's CelebA model)",
}
PREPROCESS = ("run LEAF's preprocess.sh with -t sample (e.g. ./preprocess.sh -s niid --sf 0.05 -k 0 -t sample in "
              "leaf/data/femnist) and give the folder it fills with train/ and test/ (leaf/data/femnist/data)")


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
    check_shared_options(options, "user")
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
