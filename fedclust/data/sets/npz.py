"""Your own arrays: ``data.name=npz data.path=FILE.npz`` (or a torch ``.pt``
of the same named tensors, read with ``torch.load(weights_only=True)``).

Arrays (x as [N, *shape], any numeric dtype; y integer labels 0..K-1):

- pool form: ``x_train, y_train, x_test, y_test``.  Split over the clients
  and transformed per cluster exactly as Fashion-MNIST (``data.clusters``,
  ``data.num_clusters``, ``data.train_size``, ``data.test_size``,
  ``data.share_images``; rotation needs square images [channels, H, W]).
- natural form: plus ``client_train, client_test`` (the client id of every
  example, ids 0..n-1, every client holding at least one training and one
  test example) and optionally ``cluster`` ([n] true cluster of each client,
  0..k-1; then ``data.num_clusters`` must be k).  ``clients`` must be n;
  ``data.train_size``, ``data.test_size`` and the cluster transforms do not
  apply, and ``data.cluster_sizes`` and ``data.rotations`` are refused.  A
  client's examples keep the file's order; rows are padded to the largest
  count over all clients (x = 0, y = 0) and
  ``FederatedData.train_counts``/``test_counts`` say how many are real
  (None when all clients hold the same number).  Without ``cluster`` the
  true clusters are unknown: neighbour precision, recall and ARI are null
  and Oracle refuses the data.

K is ``num_classes`` (an optional scalar) or the largest label + 1 over both
splits.  Inputs are used as float32 after normalisation by the mean and
standard deviation of ``x_train`` (per channel for [channels, H, W] inputs,
one of each otherwise; a standard deviation of 0 counts as 1).

The file is read and checked once per process (the config check reads it,
the loader takes the cached arrays): every problem is a DataError naming
data.path, the array, the bad value and the fix.
"""

from __future__ import annotations

import functools
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from fedclust.data.base import (
    LAYOUT_KEYS,
    FederatedData,
    PoolDataSet,
    RawData,
    check_cluster_kind,
    refuse_layout,
)
from fedclust.data.registry import register
from fedclust.errors import ConfigError, DataError
from fedclust.schema import DataConfig
from fedclust.sizes import host_memory_available

POOL_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
CLIENT_ARRAYS = ("client_train", "client_test")


class Arrays(NamedTuple):
    """A checked file: the splits (x as stored, y int64), the natural form's client ids and clusters."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    client_train: torch.Tensor | None
    client_test: torch.Tensor | None
    cluster: torch.Tensor | None
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str

    @property
    def natural(self) -> bool:
        return self.client_train is not None

    @property
    def num_clients(self) -> int:
        if not self.natural:
            return 0
        client_train, client_test = self.owners()
        return int(max(int(client_train.max()), int(client_test.max()))) + 1

    def owners(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(client_train, client_test)``: the client of every example, of a file in the natural form."""
        if self.client_train is None or self.client_test is None:
            raise ValueError(f"{self.source}: no client_train and client_test arrays (not a file of clients of "
                             "its own), so no example has a client")
        return self.client_train, self.client_test


def by_client(x: torch.Tensor, y: torch.Tensor, owner: torch.Tensor, n: int, ids: torch.Tensor,
              normalize) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(x [C, W, ...], y [C, W], counts [C] | None)``: the examples of clients ``ids`` (of ``n``) in the
    file's order, each row padded with zeros to the widest client's W of all n (``normalize``d inputs); counts
    None where every one of the n clients has W."""
    row_of = torch.full((n,), -1, dtype=torch.int64)
    row_of[ids] = torch.arange(len(ids))
    count = torch.bincount(owner, minlength=n)                      # [n] over all clients
    width = int(count.max())
    order = torch.argsort(owner, stable=True)                       # the file's order within a client
    start = count.cumsum(0) - count
    rank = torch.empty_like(owner)
    rank[order] = torch.arange(len(owner)) - start[owner[order]]
    rows = row_of[owner]
    held = rows >= 0
    xs = torch.zeros(len(ids), width, *x.shape[1:], dtype=torch.float32)
    ys = torch.zeros(len(ids), width, dtype=torch.int64)
    xs[rows[held], rank[held]] = normalize(x[held])
    ys[rows[held], rank[held]] = y[held]
    return xs, ys, None if bool((count == width).all()) else count[ids]


def _bad(path: str, what: str, fix: str, key: str = "data.path") -> DataError:
    return DataError(f"{key} '{path}': {what}; {fix}")


KNOWN_ARRAYS = POOL_ARRAYS + CLIENT_ARRAYS + ("cluster", "num_classes")   # all a file is read for; others stay on disk
MEMORY_FACTOR = 3   # an array's bytes as stored, then as tensors (int64 labels, float32 after normalisation) beside it
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")   # a zip's first bytes (an empty zip: its end record)
SAVEZ = ("write it with numpy.savez(FILE.npz, x_train=..., y_train=..., x_test=..., y_test=...) of numeric arrays "
         "(no objects or strings)")


def _read(path: str) -> dict:
    """The file's arrays that fedclust reads (:data:`KNOWN_ARRAYS`) as numpy arrays; any other is never loaded."""
    if path.endswith(".pt"):
        return _read_pt(path)
    return read_npz(path, KNOWN_ARRAYS)


def _read_pt(path: str) -> dict:
    fix = "save a dict of tensors with torch.save({'x_train': ..., ...}, FILE.pt)"
    try:   # mmap: a tensor's pages are read when it is used, so entries fedclust does not read cost no memory
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:   # pickle and zip errors come in many types
        raise _bad(path, f"cannot read it with torch.load(weights_only=True) ({type(err).__name__}: {err})",
                   fix) from err
    if not isinstance(obj, dict):
        raise _bad(path, f"holds a {type(obj).__name__}, not a dict of named tensors", fix)
    out = {}
    for k, v in obj.items():
        if str(k) not in KNOWN_ARRAYS:
            continue
        if isinstance(v, (int, float)):
            v = np.asarray(v)
        elif isinstance(v, torch.Tensor):
            v = v.detach().cpu().numpy()
        elif not isinstance(v, np.ndarray):
            raise _bad(path, f"entry '{k}' is a {type(v).__name__}, not a tensor", "store tensors only")
        out[str(k)] = v
    return out


def _header(z: zipfile.ZipFile, member: str) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of one ``.npy`` member of an archive, from its header alone."""
    with z.open(member) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
        else:   # 3.0: utf-8 field names; numpy's reader of every version
            shape, _, dtype = getattr(np.lib.format, "_read_array_header")(f, version)
    return tuple(shape), dtype


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def read_npz(path: str, wanted: tuple[str, ...], key: str = "data.path") -> dict:
    """The arrays of ``wanted`` that the ``.npz`` at ``path`` holds, and nothing else: each one's shape and dtype
    read from its header first, so that a file that is no zip archive, an array of Python objects, or arrays
    larger than the memory free here are refused (a DataError naming ``key``) before anything is loaded."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise _bad(path, f"cannot read it as .npz ({err.strerror or err})", SAVEZ, key) from err
    if head not in ZIP_MAGIC:
        shown = head.hex(" ") or "nothing: the file is empty"
        raise _bad(path, f"cannot read it as .npz: it is not a zip archive, as numpy.savez writes (its first bytes: "
                   f"{shown})", SAVEZ, key)
    try:
        with zipfile.ZipFile(path) as z:
            members = {m[:-4]: m for m in z.namelist() if m.endswith(".npy")}
            headers = {k: _header(z, members[k]) for k in wanted if k in members}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:
        raise _bad(path, f"cannot read it as .npz ({type(err).__name__}: {err})", SAVEZ, key) from err
    need = 0
    for name, (shape, dtype) in headers.items():
        if dtype.hasobject:
            raise _bad(path, f"array '{name}' holds Python objects (dtype {dtype}), which fedclust never unpickles",
                       "store numbers (integers or floats)", key)
        need += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    free = host_memory_available()
    if free and need * MEMORY_FACTOR > free:
        sizes = ", ".join(f"{k} {list(s)} {d}" for k, (s, d) in headers.items())
        raise _bad(path, f"its arrays take {_human(need)} as stored ({sizes}), and about {MEMORY_FACTOR}x that while "
                   f"read, more than the {_human(free)} of memory free here", "use a machine with more memory, or "
                   "fewer or smaller examples", key)
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in headers}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:
        raise _bad(path, f"cannot read it as .npz ({type(err).__name__}: {err})", SAVEZ, key) from err


def _numeric(path: str, name: str, a: np.ndarray, key: str = "data.path") -> None:
    if a.dtype.kind not in "biuf":
        raise _bad(path, f"array '{name}' has dtype {a.dtype}", "store real numbers (integers or floats)", key)


def _ids(path: str, name: str, a: np.ndarray, length: int, of: str, key: str = "data.path") -> torch.Tensor:
    """A 1-D integer array of ``length`` non-negative values."""
    if a.dtype.kind not in "iu":
        raise _bad(path, f"array '{name}' has dtype {a.dtype}, not integers",
                   f"store {of} as integers (e.g. {name}.astype(numpy.int64))", key)
    if a.ndim != 1 or len(a) != length:
        raise _bad(path, f"array '{name}' has shape {list(a.shape)}", f"it needs one entry per {of}: shape [{length}]",
                   key)
    t = torch.from_numpy(a.astype(np.int64))
    if len(t) and int(t.min()) < 0:
        i = int(torch.nonzero(t < 0)[0])
        raise _bad(path, f"array '{name}' holds {int(t[i])} at index {i}", f"{of} must be >= 0", key)
    return t


def check_split(path: str, split: str, x: np.ndarray, y: np.ndarray,
                key: str = "data.path") -> tuple[torch.Tensor, torch.Tensor]:
    """``x_{split}`` and ``y_{split}`` checked (numbers, finite, one example a row; integer labels >= 0, one a
    row), as tensors (x as stored, y int64)."""
    _numeric(path, f"x_{split}", x, key)
    if x.ndim < 2 or len(x) == 0:
        raise _bad(path, f"array 'x_{split}' has shape {list(x.shape)}",
                   "it needs one example per row and at least one row: [N, *input_shape]", key)
    if y.dtype.kind not in "iu":
        fix = ("labels must be integers 0..K-1: renumber them with y_train, y_test = numpy.unique("
               "numpy.concatenate([y_train, y_test]), return_inverse=True)[1] split back at len(y_train)"
               if y.dtype.kind in "USOb" else
               f"labels must be integers 0..K-1 (y_{split}.astype(numpy.int64) if they are whole numbers)")
        raise _bad(path, f"array 'y_{split}' has dtype {y.dtype}, not integers", fix, key)
    if y.ndim != 1 or len(y) != len(x):
        raise _bad(path, f"array 'y_{split}' has shape {list(y.shape)} but x_{split} has {len(x)} rows",
                   f"give one label per example: y_{split} of shape [{len(x)}]", key)
    if x.dtype.kind == "f" and not np.isfinite(x).all():
        bad = np.argwhere(~np.isfinite(x.reshape(len(x), -1)).all(axis=1)).ravel()
        raise _bad(path, f"array 'x_{split}' holds NaN or inf values in {len(bad)} example(s), the first at "
                         f"row {int(bad[0])}", "replace or drop them", key)
    yt = torch.from_numpy(y.astype(np.int64))
    if len(yt) and int(yt.min()) < 0:
        i = int(torch.nonzero(yt < 0)[0])
        raise _bad(path, f"array 'y_{split}' holds label {int(yt[i])} at index {i}", "labels must be 0..K-1", key)
    return torch.from_numpy(np.ascontiguousarray(x)), yt


TEST_ARRAYS = ("x_test", "y_test", "client_test")


def _test_arrays(path: str, shape: tuple[int, ...], key: str, whose: str) -> tuple[torch.Tensor, ...]:
    """``(x, y, client ids as given)`` of a natural-form file of test examples, with the training file's checks
    (:func:`read_npz`, :func:`check_split`, :func:`_ids`) and the run's example ``shape``; ``whose``: what the
    file's ``client_test`` gives, for the message."""
    arrays = (_read_pt(path) if path.endswith(".pt") else read_npz(path, TEST_ARRAYS, key))
    missing = [k for k in TEST_ARRAYS if k not in arrays]
    if missing:
        raise _bad(path, f"no {', '.join(missing)} (it holds: {', '.join(sorted(arrays)) or 'none of them'})",
                   f"give {whose}", key)
    x, y = check_split(path, "test", arrays["x_test"], arrays["y_test"], key)
    owner = _ids(path, "client_test", arrays["client_test"], len(y), "test example's client", key)
    if tuple(x.shape[1:]) != tuple(shape):
        raise _bad(path, f"x_test's examples have shape {list(x.shape[1:])}, the run's model takes {list(shape)}",
                   f"give examples of shape {list(shape)}", key)
    return x, y, owner


def _labels_within(path: str, y: torch.Tensor, classes: int, key: str) -> None:
    if int(y.max()) >= classes:
        i = int(torch.nonzero(y >= classes)[0])
        raise _bad(path, f"y_test holds label {int(y[i])} at index {i}, outside the run's classes 0..{classes - 1}",
                   "give labels of the run's classes", key)


def read_test_clients(path: str, n: int, shape: tuple[int, ...], classes: int,
                      key: str = "--data") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, owner)`` of a file of new test examples in the natural form (``x_test``, ``y_test``,
    ``client_test``) for a run of ``n`` clients whose model takes ``shape`` and ``classes``: only those arrays read,
    with the training file's checks (:func:`read_npz`, :func:`check_split`, :func:`_ids`) and every client of the
    run holding at least one example; a DataError naming ``key`` and the file otherwise."""
    x, y, owner = _test_arrays(path, shape, key, "a file of test examples in the natural form: x_test, y_test and "
                               "client_test (the run's client id of every example)")
    if int(owner.max()) >= n:
        i = int(torch.nonzero(owner >= n)[0])
        raise _bad(path, f"client_test holds client {int(owner[i])} at index {i}, outside the run's clients "
                   f"0..{n - 1}", "give the run's client ids", key)
    _labels_within(path, y, classes, key)
    count = torch.bincount(owner, minlength=n)
    if bool((count == 0).any()):
        raise _bad(path, f"clients {(count == 0).nonzero().flatten().tolist()[:10]} have no test example",
                   "give every client of the run at least one", key)
    return x, y, owner


def read_new_clients(path: str, shape: tuple[int, ...], classes: int,
                     key: str = "--data") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x, y, owner, ids)`` of a file of clients a run never saw (``fedclust evaluate --unseen``), in the natural
    form's test arrays (``x_test``, ``y_test``, ``client_test``, any non-negative client ids): checked as
    :func:`read_test_clients` checks them, ``owner`` each example's client as ``0..m-1`` in the order of ``ids``
    (``[m]``, the file's ids sorted); each client must hold at least 2 examples (a half to choose, a half to
    score); a DataError naming ``key`` and the file otherwise."""
    x, y, raw = _test_arrays(path, shape, key, "the new clients' examples in the natural form: x_test, y_test and "
                             "client_test (each example's client, any ids)")
    _labels_within(path, y, classes, key)
    ids, owner = torch.unique(raw, sorted=True, return_inverse=True)
    few = ids[torch.bincount(owner, minlength=len(ids)) < 2]
    if len(few):
        raise _bad(path, f"clients {few.tolist()[:10]} hold fewer than 2 examples", "give each new client at least "
                   "2 (the first half chooses its model, the rest scores it)", key)
    return x, y, owner, ids


def _stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (dim 1 of [N, ch, H, W]) or overall mean and std of x_train, std 0 -> 1."""
    x = x.to(torch.float64)
    dims = [0, 2, 3] if x.ndim == 4 else list(range(x.ndim))
    mean = x.mean(dim=dims).reshape(-1)
    std = x.std(dim=dims, unbiased=False).reshape(-1)
    std = torch.where(std > 0, std, torch.ones_like(std))
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def _classes(path: str, arrays: dict, ys: dict, given: str = "num_classes") -> int:
    """K: the file's ``num_classes``, checked against its labels, or the largest label + 1 with every label
    0..K-1 occurring in some split; ``given`` names where a class count is given, in messages."""
    top = max(int(ys["train"].max()), int(ys["test"].max()))
    if "num_classes" in arrays:
        k = arrays["num_classes"]
        if k.ndim != 0 or k.dtype.kind not in "iu" or int(k) < 2:
            raise _bad(path, f"'num_classes' is {k.tolist()!r}", "give one integer >= 2 (or leave it out: the "
                       "largest label + 1)")
        k = int(k)
        if top >= k:
            split = "train" if int(ys["train"].max()) >= k else "test"
            i = int(torch.nonzero(ys[split] >= k)[0])
            raise _bad(path, f"array 'y_{split}' holds label {int(ys[split][i])} at index {i} but {given} is {k}",
                       f"labels must be 0..{k - 1}, or raise {given}")
    else:
        k = top + 1
        if k < 2:
            raise _bad(path, "every label is 0", "a classifier needs at least 2 classes")
        seen = torch.zeros(k, dtype=torch.bool)
        seen[ys["train"]] = True
        seen[ys["test"]] = True
        if not bool(seen.all()):   # labels from 1, or with gaps: outputs no example has
            missing = (~seen).nonzero().flatten().tolist()
            raise _bad(path, f"labels {missing[:10]}{' ...' if len(missing) > 10 else ''} of 0..{k - 1} occur in "
                       f"neither split, so the model would get {len(missing)} output(s) that no example has",
                       "renumber the labels 0..K-1 (numpy.unique(labels, return_inverse=True)[1]), or give "
                       f"{given} (an integer >= {k}) to keep them on purpose")
    return k


def _clients(path: str, arrays: dict, ys: dict):
    """``(client_train, client_test, cluster)`` of a file of clients of its own (each None for a pool),
    checked: both id arrays or neither, ids 0..n-1 each holding a training and a test example, a cluster a
    client."""
    client_train = client_test = cluster = None
    given = [a for a in CLIENT_ARRAYS if a in arrays]
    if given and len(given) < 2:
        other = [a for a in CLIENT_ARRAYS if a not in arrays][0]
        raise _bad(path, f"it holds '{given[0]}' but not '{other}'", "give both (the client of every training and "
                   "every test example), or neither (a pool split over clients)")
    if given:
        client_train = _ids(path, "client_train", arrays["client_train"], len(ys["train"]), "training example's client")
        client_test = _ids(path, "client_test", arrays["client_test"], len(ys["test"]), "test example's client")
        n = max(int(client_train.max()), int(client_test.max())) + 1
        for name, ids, what in (("client_train", client_train, "training"), ("client_test", client_test, "test")):
            counts = torch.bincount(ids, minlength=n)
            if bool((counts == 0).any()):
                c = int(torch.nonzero(counts == 0)[0])
                raise _bad(path, f"client {c} has no {what} example in '{name}' (ids run 0..{n - 1})",
                           "number the clients 0..n-1 with every client holding at least one training and one test "
                           "example")
        if "cluster" in arrays:
            cluster = _ids(path, "cluster", arrays["cluster"], n, "client's cluster")
    elif "cluster" in arrays:
        raise _bad(path, "it holds 'cluster' but no 'client_train'/'client_test'",
                   "a pool's clusters come from data.clusters and data.num_clusters: drop 'cluster', or give the "
                   "client of every example")
    return client_train, client_test, cluster


def check_arrays(path: str, arrays: dict, given: str = "num_classes") -> Arrays:
    """Every check of the file's arrays (see the module docstring), then the arrays as tensors; ``given`` names
    where a class count is given (the file's ``num_classes``; a data set building these arrays from its own
    layout names its option), in messages."""
    missing = [k for k in POOL_ARRAYS if k not in arrays]
    if missing:
        raise _bad(path, f"missing array(s) {', '.join(missing)} (it holds: {', '.join(sorted(arrays)) or 'nothing'})",
                   "store x_train, y_train, x_test, y_test (and client_train, client_test for clients of your own)")
    xs, ys = {}, {}
    for split in ("train", "test"):
        xs[split], ys[split] = check_split(path, split, arrays[f"x_{split}"], arrays[f"y_{split}"])
    if xs["train"].shape[1:] != xs["test"].shape[1:]:
        raise _bad(path, f"x_train's examples have shape {list(xs['train'].shape[1:])} but x_test's "
                         f"{list(xs['test'].shape[1:])}", "give both splits the same input shape")
    k = _classes(path, arrays, ys, given)
    client_train, client_test, cluster = _clients(path, arrays, ys)
    mean, std = _stats(xs["train"])
    return Arrays(xs["train"], ys["train"], xs["test"], ys["test"], client_train, client_test, cluster, k, mean,
                  std, path)


@functools.lru_cache(maxsize=4)
def _cached(path: str, mtime_ns: int, size: int) -> Arrays:
    return check_arrays(path, _read(path))


def read_arrays(cfg: DataConfig) -> Arrays:
    """The checked arrays of ``data.path``, read once per process (again when the file changes)."""
    text = str(cfg.path or "")
    if not text:
        raise ConfigError("data.path", text, "data.name=npz reads your arrays from a file: set data.path=FILE.npz "
                          "(or FILE.pt)")
    if not (text.endswith(".npz") or text.endswith(".pt")):
        raise ConfigError("data.path", text, "give a .npz file (numpy.savez) or a .pt file (torch.save of a dict)")
    p = Path(text).expanduser()
    if not p.is_file():
        raise ConfigError("data.path", text, f"no such file ({p.resolve()}); give the path of your .npz or .pt file "
                          "(relative to where you run fedclust, or absolute)")
    st = p.stat()
    return _cached(str(p.resolve()), st.st_mtime_ns, st.st_size)


@register
class Npz(PoolDataSet):
    """``data.name=npz``; a data set that builds the same arrays from a layout of its own (``leaf``, ``hf``)
    subclasses it and overrides :meth:`arrays` (and the words of :meth:`own_clients`, :meth:`client_ids`), so
    that its clients are checked and loaded exactly as a file of your own clients."""

    name = "npz"
    default_model = "mlp"
    scale = None        # inputs as stored, normalized by x_train's statistics
    # oracle's fix when the data gives no true cluster (has_true_clusters is false)
    true_clusters_fix = ("add a `cluster` array (the true cluster of every client, [clients] integers) to the "
                         "file")

    def arrays(self, cfg: DataConfig) -> Arrays:
        """The checked arrays of the data (read once per process)."""
        return read_arrays(cfg)

    def own_clients(self, a: Arrays) -> str:
        """What the data's clients are, in messages."""
        return ("your own clients (client_train, client_test), which keep their own examples and clusters (the "
                "file's 'cluster' array, if any)")

    def client_ids(self, a: Arrays) -> str:
        """Where the client count comes from, in messages."""
        return f"ids 0..{a.num_clients - 1} in client_train and client_test"

    def kind_of(self, cfg: DataConfig) -> str:
        return "client" if self.arrays(cfg).natural else "pool"

    def raw(self, cfg: DataConfig) -> RawData:
        a = self.arrays(cfg)
        return RawData(a.train_x, a.train_y, a.test_x, a.test_y, a.source)

    def input_shape(self, cfg: DataConfig) -> tuple[int, ...]:
        return tuple(self.arrays(cfg).train_x.shape[1:])

    def num_classes(self, cfg: DataConfig) -> int:
        return self.arrays(cfg).num_classes

    def normalization(self, cfg: DataConfig):
        a = self.arrays(cfg)
        return a.mean, a.std

    def has_true_clusters(self, cfg: DataConfig) -> bool:
        try:
            a = self.arrays(cfg)
        except (ConfigError, DataError):
            return True          # the data check names the problem
        return not a.natural or a.cluster is not None

    def check(self, cfg: DataConfig, num_clients: int) -> None:
        a = self.arrays(cfg)
        if not a.natural:
            super().check(cfg, num_clients)
            return
        check_cluster_kind(cfg)
        refuse_layout(cfg, LAYOUT_KEYS, f"{a.source} holds {self.own_clients(a)} and take no transform")
        n = a.num_clients
        if num_clients != n:
            raise ConfigError("clients", num_clients, f"{a.source} holds {n} clients ({self.client_ids(a)}): "
                              f"set clients={n}")
        if a.cluster is not None:   # the file says how many: read from it, unless a different count is given
            k = int(a.cluster.max()) + 1
            if cfg.num_clusters not in (k, DataConfig.num_clusters):
                raise ConfigError("data.num_clusters", cfg.num_clusters,
                                  f"{a.source}'s 'cluster' array gives clusters 0..{k - 1}: set data.num_clusters={k} "
                                  "or leave it out (it is read from the file)")
            cfg.num_clusters = k

    def load(self, cfg: DataConfig, num_clients: int, seed: int, ids: torch.Tensor,
             device: torch.device, held: torch.Tensor | None = None) -> FederatedData:
        a = self.arrays(cfg)
        if not a.natural:   # a pool: under the clusters held where given (drift)
            return super().load(cfg, num_clients, seed, ids, device, held=held)
        if held is not None:
            raise ValueError(f"{a.source} gives its own clients: no cluster transform to give one another cluster's")
        owner_train, owner_test = a.owners()
        out, counts = [], []
        for x, y, owner in ((a.train_x, a.train_y, owner_train), (a.test_x, a.test_y, owner_test)):
            xs, ys, count = by_client(x, y, owner, a.num_clients, ids, lambda v: self.normalize(cfg, v))
            out += [xs.to(device), ys.to(device)]
            counts.append(None if count is None else count.to(device))
        train_x, train_y, test_x, test_y = out
        return FederatedData(
            train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y,
            clusters=None if a.cluster is None else a.cluster.to(device), client_ids=ids.to(device),
            input_shape=tuple(a.train_x.shape[1:]), num_classes=a.num_classes, source=a.source,
            train_counts=counts[0], test_counts=counts[1],
        )
