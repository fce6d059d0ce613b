"""A Hugging Face ``datasets`` data set of natural clients: ``data.name=hf
data.path=DIR``, DIR written by ``DatasetDict(train=..., test=...).save_to_disk(DIR)``
(Flower Datasets' FEMNIST partitioned by ``writer_id``, say; docs/own-model-and-data.md).

``data.options`` (:data:`OPTIONS`):

- ``client_column`` (required): the column naming each example's client
  (FEMNIST: ``writer_id``).  The clients are its distinct values that occur in
  both splits (at least ``min_samples`` examples in the two together), in
  sorted order: client i is the i-th smallest value.  Values in one split only
  are dropped, and the config check says how many (one line).
- ``input_column`` (default ``image`` when the splits have it, else ``x``):
  images (``datasets.Image``: read as stored, [channels, H, W] uint8, every
  image of one size and mode) or numbers (a list of numbers an example, or
  one number).
- ``label_column`` (default ``label``): whole numbers ``>= 0``; K is
  ``num_classes`` when given, else a ``ClassLabel``'s class count, else the
  largest label + 1.
- ``shape`` (each example's input shape; default: as read), ``min_samples``,
  ``num_classes``: as ``data.name=leaf``'s.

The examples become the arrays of ``data.name=npz``'s natural form without
a ``cluster`` array (an example's client from ``client_column``, a client's
examples in the split's order) and are checked and loaded exactly as such a
file (:class:`fedclust.data.sets.npz.Npz`): ``clients`` must be the number of
clients, inputs are normalised by the training split's mean and standard
deviation, the true clusters are unknown (neighbour precision, recall and ARI
null; oracle refuses the data).

``datasets`` is imported only here, when the data set is read (``pip install
'fedclust[hf]'``); nothing is downloaded.  Read and checked once per process
(again when a file under DIR changes).
"""

from __future__ import annotations

import functools

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
    shape_option,
    whole_labels,
)
from fedclust.data.sets.npz import Arrays, Npz
from fedclust.data.sources import frozen_options
from fedclust.errors import ConfigError
from fedclust.schema import DataConfig

OPTIONS = {
    "client_column": "the column naming each example's client (required; FEMNIST: writer_id)",
    "input_column": "the inputs' column (default: image when there is one, else x)",
    "label_column": "the labels' column (default: label)",
    "shape": "each example's input shape (default: as read)",
    "min_samples": "drop clients with fewer examples (train + test) (default 0: none)",
    "num_classes": "the class count K (default: a ClassLabel's count, else the largest label + 1)",
}
SPLITS = ("train", "test")
SAVE = ("save a DatasetDict of a train and a test split: DatasetDict(train=..., test=...).save_to_disk(DIR), "
        "each client's examples in both (docs/own-model-and-data.md)")
INSTALL = "pip install 'fedclust[hf]' (or pip install datasets)"


def _datasets():
    try:
        import datasets
    except ImportError as err:
        raise ConfigError("data.name", "hf", f"data.name=hf reads a data set saved by the Hugging Face `datasets` "
                          f"library, which is not installed here ({err}): {INSTALL}") from None
    return datasets


def _column(options: dict, key: str, default: str | None = None) -> str | None:
    value = options.get(key, default)
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"data.options.{key}", value, "give a column's name")
    return value


def _columns(path: str, splits: dict, options: dict) -> dict[str, str]:
    """``{"client": ..., "input": ..., "label": ...}``: the columns read, each in both splits; ConfigError
    naming the option (and the columns there are) otherwise."""
    names = {s: list(splits[s].column_names) for s in SPLITS}
    have = [c for c in names["train"] if c in names["test"]]
    given = _column(options, "input_column")
    out = {"client": str(options["client_column"]), "label": _column(options, "label_column", "label") or "label",
           "input": given or ("image" if "image" in have else "x")}
    for what, column in out.items():
        for split in SPLITS:
            if column not in names[split]:
                key = f"data.options.{what}_column"
                shown = (column if what == "client" or options.get(f"{what}_column") else
                         f"{column} (the default{', as there is no image column' if what == 'input' else ''})")
                raise ConfigError(key, shown, f"the {split} split of {path} has no column '{column}'; its columns: "
                                  f"{', '.join(names[split])}: set {key}=NAME")
    return out


def _read(ds, column: str):
    """One column of a split as numpy (images decoded)."""
    return ds.with_format("numpy", columns=[column])[:][column]


def _inputs(path: str, split: str, ds, column: str, datasets) -> np.ndarray:
    """The inputs of a split: images as [N, channels, H, W] (as stored), numbers as [N, ...]."""
    x = _read(ds, column)
    where = f"column '{column}' of the {split} split"
    if x.dtype == object:
        raise bad(path, f"{where} holds examples of different shapes (or missing ones)", "give every example the "
                  "same shape: images of one size and mode (resize them with ds.map), or lists of one length")
    if isinstance(ds.features[column], datasets.Image):
        if x.ndim == 3:                   # grey [N, H, W]
            return x[:, None]
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if x.ndim == 4 else x
    if x.dtype.kind not in "biuf":
        raise bad(path, f"{where} holds {x.dtype} values", "give images (datasets.Image) or numbers; name the "
                  "inputs' column with data.options.input_column")
    x = x.reshape(len(x), 1) if x.ndim == 1 else x
    if x.dtype.kind == "f":
        finite = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        if not finite.all():
            raise bad(path, f"{where}: row {int(np.argmin(finite))} holds NaN or inf", "replace or drop it")
    return x


def _labels(path: str, split: str, ds, column: str, datasets) -> np.ndarray:
    y = _read(ds, column)
    where = f"column '{column}' of the {split} split"
    if y.dtype.kind in "USO":
        raise bad(path, f"{where} holds {y.dtype} values, not integers", "turn them into classes 0..K-1 before "
                  f"saving: ds = ds.class_encode_column('{column}')")
    return whole_labels(path, where, y.tolist(), " (datasets marks a missing label -1: drop those examples)")


def _clients(path: str, split: str, ds, column: str) -> np.ndarray:
    c = _read(ds, column)
    if c.dtype == object or c.ndim != 1:
        raise bad(path, f"column '{column}' of the {split} split holds missing or non-scalar values",
                  "give every example's client as one string or integer")
    return c


@functools.lru_cache(maxsize=4)
def _cached(path: str, frozen: tuple, stamp: tuple) -> Arrays:
    datasets = _datasets()
    options = dict(frozen)
    try:
        saved = datasets.load_from_disk(path)
    except Exception as err:   # the library's errors come in many types
        raise bad(path, f"datasets.load_from_disk cannot read it ({type(err).__name__}: {err})", SAVE) from None
    if not isinstance(saved, datasets.DatasetDict):
        raise bad(path, f"it holds one {type(saved).__name__}, not a DatasetDict of splits", SAVE)
    missing = [s for s in SPLITS if s not in saved]
    if missing:
        raise bad(path, f"it has no {' and no '.join(missing)} split (its splits: {', '.join(saved) or 'none'})", SAVE)
    splits = {s: saved[s] for s in SPLITS}
    cols = _columns(path, splits, options)
    owners = {s: _clients(path, s, splits[s], cols["client"]) for s in SPLITS}
    counts = {s: dict(zip(*(v.tolist() for v in np.unique(owners[s], return_counts=True)))) for s in SPLITS}
    kept, note = keep_clients(path, counts["train"], counts["test"], options.get("min_samples", 0),
                              "client", ("the train split", "the test split"),
                              "split each client's examples between train and test (e.g. train_test_split of each "
                              "partition) before saving")
    ids = np.asarray(kept)
    out, classes = {}, options.get("num_classes")
    label_feature = splits["train"].features[cols["label"]]
    if classes is None and isinstance(label_feature, datasets.ClassLabel):
        classes = int(label_feature.num_classes)
    for s in SPLITS:
        held = np.isin(owners[s], ids)
        x = _inputs(path, s, splits[s], cols["input"], datasets)[held]
        y = _labels(path, s, splits[s], cols["label"], datasets)[held]
        out[s] = (reshaped(x, shape_option(options), path), y, np.searchsorted(ids, owners[s][held]).astype(np.int64))
    arrays = natural_arrays(path, out, classes)
    say(note)    # once per process: what is read is cached
    return arrays


def read_hf(cfg: DataConfig) -> Arrays:
    """The checked arrays of the saved DatasetDict ``data.path`` under ``data.options``, read once per process
    (again when a file under it changes); the options are checked before anything is read."""
    options = dict(cfg.options or {})
    check_option_keys("hf", options, OPTIONS)
    if options.get("client_column") is None:
        raise ConfigError("data.options", options, "data.name=hf needs data.options.client_column: the column naming "
                          "each example's client, e.g. data.options.client_column=writer_id for FEMNIST")
    for key in ("client_column", "input_column", "label_column"):
        _column(options, key)
    check_shared_options(options, "client")
    root = folder(cfg, "a DatasetDict saved with save_to_disk", "e.g. data.path=femnist_hf")
    if not (root / "dataset_dict.json").is_file():
        what = ("one Dataset (its state.json), not a DatasetDict of a train and a test split"
                if (root / "state.json").is_file() else "no dataset_dict.json, which DatasetDict.save_to_disk writes")
        raise ConfigError("data.path", str(cfg.path), f"{root} holds {what}; {SAVE}")
    files = sorted(p for p in root.rglob("*") if p.is_file())
    stamp = tuple((str(p.relative_to(root)), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    _datasets()   # named before the cache: a missing library is a config error
    return _cached(str(root), frozen_options(options), stamp)


@register
class Hf(Npz):
    name = "hf"
    takes_options = True    # data.options: OPTIONS
    true_clusters_fix = "its clients come with no true cluster"

    def arrays(self, cfg: DataConfig) -> Arrays:
        return read_hf(cfg)

    def own_clients(self, a: Arrays) -> str:
        return "clients of their own (data.options.client_column), which keep their own examples and have no true " \
               "cluster"

    def client_ids(self, a: Arrays) -> str:
        return ("the values of data.options.client_column in both splits with at least data.options.min_samples "
                "examples, in sorted order")
