"""Issue 47: fedclust beside PFLlib (``TsingZ0/PFLlib``) on one GPU, FedAvg with PFLlib's MNIST CNN on one split.

One split of Fashion-MNIST (the four IDX files, read with fedclust's reader; the device has no internet) for N
clients, the same images per client, IID, seeded: client i gets a slice of a permutation of the training and of the
test images.  It is written twice with identical float32 arrays (standardised by the written training images'
mean and standard deviation, so fedclust's own normalisation of ``x_train`` changes them by float rounding only):
in PFLlib's layout (``<pfllib>/dataset/FMNIST_side_<N>/{train,test}/<i>.npz``, a dict ``{'x', 'y'}`` under
``data``, as its ``read_data`` reads it; ``savez_compressed`` as its generators write) and as a fedclust file of
clients (``data.name=npz``: ``x_train, y_train, x_test, y_test, client_train, client_test``).

Both run FedAvg: all clients every round, local epochs, batch size, plain SGD learning rate (PFLlib's optimizer has
no momentum: ``train.momentum=0``, ``train.lr_decay=1``), evaluation every round, and the same model:
:class:`FedAvgCNN` here is PFLlib's ``FedAvgCNN(in_features=1, dim=1024)`` re-written from its architecture (conv
5x5 1->32, ReLU, max-pool 2, conv 5x5 32->64, ReLU, max-pool 2, FC 1024->512, ReLU, FC 512->10), its layers made in
the same order, so under seed 0 both start from the same weights (PFLlib seeds torch with 0 before building it,
fedclust builds a user model under ``seed``).  fedclust's built-in ``cnn`` is another network (3x3, three convs).

Timing.  PFLlib ``-gr R`` runs R + 1 iterations, each: evaluate the global model on every client's test set and
train set (loss), then train every client and aggregate; its printed ``time cost`` of each iteration is its round.
fedclust's round is the wall time between the ends of two rounds (a round-end hook: training, aggregation, the
evaluation, the metrics line), not its ``round_seconds`` (training and aggregation only, also recorded).
R = ``--warmup`` + ``--rounds``; the first ``--warmup`` rounds are dropped, seconds per round is the median of
the next ``--rounds``.  The final accuracies are both after R trainings (PFLlib's evaluation at iteration R).
Differences in the work (:data:`NOTE`, printed under the table and kept in the JSON): PFLlib's evaluation also runs
every training image forward for its train loss and computes an AUC; fedclust reports the local steps' loss.

GPU memory: ``torch.cuda.max_memory_allocated`` of each process (PFLlib's through a driver that runs its
``main.py`` with ``runpy``, unchanged) and the peak of ``nvidia-smi``'s ``memory.used`` above its value before the
run; utilisation: the mean of ``nvidia-smi``'s ``utilization.gpu``, sampled every 0.2 s, over the timed rounds.

Scale rows (``--scale``): fedclust alone at 1,000 and 10,000 clients with the same per-client workload (600/100
images a client, the same model and training) on ``data.name=fmnist`` with ``data.num_clusters=1
data.share_images=true`` (the 60,000 images cannot fill 10,000 clients without sharing), ``--scale-rounds`` timed
after one warm-up.

PFLlib's ``main.py`` imports scikit-learn, h5py, calmsize and cvxpy (FedPAC's) besides torch, torchvision and
matplotlib; any of the four missing from ``--python`` is replaced by a small stand-in on the subprocess's PYTHONPATH
(``<pfllib>/shim``: ``label_binarize`` and a micro-averaged ``roc_auc_score`` with average ranks, a pickle file for
``h5py.File``, a plain number for ``calmsize.size``, an empty ``cvxpy``), and the JSON says which.  The H200 image
has scikit-learn and h5py, not calmsize or cvxpy.

The GPU session (not timed yet: estimated 5-8 minutes, most of it PFLlib at 100 clients; ``--timeout`` caps each
run, and the JSON is written after every run, so a cut-off session keeps what finished; ``runs/`` and ``data/``
are git-ignored, so they are carried)::

    rm -rf runs/pfllib/src/dataset/FMNIST_side_*; mkdir -p data && cp /usr/share/datasets/fashion-mnist/* data/
    # run(carry=["runs/pfllib/src", "data"], timeout_s=590):
    PYTHONUNBUFFERED=1 python3 experiments/pfllib_side_by_side.py --device cuda --idx data \\
        --json $OUT/pfllib_side_by_side_cuda.json --work /tmp/side 2>&1 | tee $OUT/side.log

then copy the JSON to ``docs/bench/pfllib_side_by_side_cuda_<date>.json`` and its table into
``docs/speed-and-scale.md``.  A CPU dry run, both systems end to end in about a minute::

    OMP_NUM_THREADS=1 python3 experiments/pfllib_side_by_side.py --device cpu --clients 4 --rounds 2 --warmup 1 \\
        --train-per-client 60 --test-per-client 20 --scale '' --json runs/side_cpu.json

PFLlib: fetch ``github:TsingZ0/PFLlib`` and export its tree to ``runs/pfllib/src`` (``dataset/MNIST`` and
``docs/`` may be left out; write the commit into ``runs/pfllib/src/COMMIT``, which the JSON quotes).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).resolve()
PFLLIB_SHIMMED = ("sklearn", "h5py", "calmsize", "cvxpy")   # what PFLlib's main.py imports beyond torch, numpy,
#                                                          torchvision, matplotlib
NUM_CLASSES = 10
NOTE = ("A round is the wall time of local training, aggregation and the evaluation of every client, on both sides. "
        "PFLlib's evaluation also runs every training image forward for its train loss, computes a micro AUC, and "
        "re-reads each client's files from disk; fedclust's evaluates the test images only and reports the local "
        "steps' loss. Same split, model, initial weights (seed 0), epochs, batch, lr, plain SGD; other batch orders, "
        "so accuracies agree within noise, not bit for bit.")


class FedAvgCNN(nn.Module):
    """PFLlib's ``FedAvgCNN`` for 1-channel 28x28 inputs (``dim=1024``), as fedclust's ``model=FILE.py:NAME``:
    conv 5x5 -> 32, ReLU, max-pool 2, conv 5x5 -> 64, ReLU, max-pool 2, FC -> 512, ReLU, FC -> classes
    (582,026 parameters).  Layers are made in PFLlib's order, so the same seed gives the same weights."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        ch, h, w = input_shape
        side = lambda s: ((s - 4) // 2 - 4) // 2   # noqa: E731
        self.conv1 = nn.Sequential(nn.Conv2d(ch, 32, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.conv2 = nn.Sequential(nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2))
        self.fc1 = nn.Sequential(nn.Linear(64 * side(h) * side(w), 512), nn.ReLU())
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        return self.fc(self.fc1(torch.flatten(self.conv2(self.conv1(x)), 1)))


# --- the split ---------------------------------------------------------------------------------------------------

def idx_default() -> str:
    """Where fedclust's fmnist data set falls back to: the Debian package's folder (``dpkg -L``), else its usual
    place."""
    from fedclust.data.sources import debian_fmnist_folder

    folder = debian_fmnist_folder()
    return str(folder) if folder is not None else "/usr/share/datasets/fashion-mnist"


def read_fmnist(folder: str | Path):
    """The four IDX files of ``folder`` (fedclust's reader): uint8 images [N, 1, 28, 28] and int64 labels."""
    from fedclust.data.sources import read_idx_folder

    raw = read_idx_folder(Path(folder))
    if raw is None:
        raise SystemExit(f"no Fashion-MNIST IDX files in {folder} (--idx)")
    return raw.train_x.numpy(), raw.train_y.numpy(), raw.test_x.numpy(), raw.test_y.numpy()


def make_split(train_x, train_y, test_x, test_y, clients: int, n_train: int, n_test: int, seed: int = 0):
    """Client i's images: slice i of a seeded permutation of each split (IID, no image on two clients), as float32
    standardised by the mean and standard deviation of all written training images.  Returns
    ``[(x_train, y_train, x_test, y_test)]`` a client."""
    if clients * n_train > len(train_x) or clients * n_test > len(test_x):
        raise ValueError(f"{clients} clients x {n_train}/{n_test} images exceed the {len(train_x)}/{len(test_x)} "
                         "images of the splits")
    rng = np.random.default_rng(seed)
    tr = rng.permutation(len(train_x))[:clients * n_train]
    te = rng.permutation(len(test_x))[:clients * n_test]
    x_tr = train_x[tr].astype(np.float64)
    mean, std = x_tr.mean(), x_tr.std()
    scale = lambda x: ((np.asarray(x, np.float64) - mean) / (std or 1.0)).astype(np.float32)   # noqa: E731
    x_tr, x_te = scale(x_tr), scale(test_x[te])
    y_tr, y_te = np.asarray(train_y)[tr].astype(np.int64), np.asarray(test_y)[te].astype(np.int64)
    return [(x_tr[i * n_train:(i + 1) * n_train], y_tr[i * n_train:(i + 1) * n_train],
             x_te[i * n_test:(i + 1) * n_test], y_te[i * n_test:(i + 1) * n_test]) for i in range(clients)]


def write_pfllib(folder: Path, split) -> Path:
    """PFLlib's layout: ``folder/{train,test}/<i>.npz`` with ``{'x', 'y'}`` under ``data`` and ``config.json``."""
    for part in ("train", "test"):
        (folder / part).mkdir(parents=True, exist_ok=True)
    for i, (xtr, ytr, xte, yte) in enumerate(split):
        np.savez_compressed(folder / "train" / f"{i}.npz", data={"x": xtr, "y": ytr})
        np.savez_compressed(folder / "test" / f"{i}.npz", data={"x": xte, "y": yte})
    config = {"num_clients": len(split), "num_classes": NUM_CLASSES, "non_iid": False, "balance": True,
              "partition": None, "written_by": "experiments/pfllib_side_by_side.py"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def read_pfllib(folder: Path, clients: int):
    """The split back from PFLlib's files, as its ``read_data`` reads them."""
    def one(part, i):
        d = np.load(folder / part / f"{i}.npz", allow_pickle=True)["data"].tolist()
        return d["x"], d["y"]
    return [(*one("train", i), *one("test", i)) for i in range(clients)]


def write_fedclust(path: Path, split) -> Path:
    """fedclust's file of clients (``data.name=npz``): the examples in client order, each one's client id."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = lambda k: np.repeat(np.arange(len(split)), [len(s[k]) for s in split])   # noqa: E731
    np.savez(path, x_train=np.concatenate([s[0] for s in split]), y_train=np.concatenate([s[1] for s in split]),
             x_test=np.concatenate([s[2] for s in split]), y_test=np.concatenate([s[3] for s in split]),
             client_train=ids(1), client_test=ids(3), num_classes=np.int64(NUM_CLASSES))
    return path


def read_fedclust(path: Path):
    """The split back from fedclust's file of clients."""
    f = np.load(path)
    out = []
    for i in range(int(f["client_train"].max()) + 1):
        a, b = f["client_train"] == i, f["client_test"] == i
        out.append((f["x_train"][a], f["y_train"][a], f["x_test"][b], f["y_test"][b]))
    return out


# --- PFLlib's printout ------------------------------------------------------------------------------------------

_COST = re.compile(r"^-+ time cost -+\s+([0-9.eE+-]+)\s*$")
_ACC = re.compile(r"^Averaged Test Accuracy:\s*([0-9.]+)")


def parse_pfllib(lines) -> dict:
    """PFLlib's FedAvg printout: ``round_seconds`` (its ``time cost`` line of every iteration), ``accuracy`` (its
    averaged test accuracy of every evaluation, in [0, 1]; entry t after t trainings) and the indices of the
    ``time cost`` lines among ``lines`` (to find their arrival times)."""
    seconds, acc, at = [], [], []
    for k, line in enumerate(lines):
        line = line.rstrip("\n")
        if m := _COST.match(line):
            seconds.append(float(m.group(1)))
            at.append(k)
        elif m := _ACC.match(line):
            acc.append(float(m.group(1)))
    return {"round_seconds": seconds, "accuracy": acc, "cost_lines": at}


# --- GPU sampling -----------------------------------------------------------------------------------------------

class GpuSampler:
    """``nvidia-smi``'s utilisation and memory every 0.2 s in a thread (``-lms 200``); nothing without it."""

    QUERY = ["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", "--id=0"]

    def __init__(self, enabled: bool):
        self.enabled = enabled and shutil.which("nvidia-smi") is not None
        self.samples: list[tuple[float, float, float]] = []   # (time, util %, memory MiB)
        self.proc = self.thread = None

    @classmethod
    def once(cls) -> float | None:
        """memory.used now (MiB)."""
        if shutil.which("nvidia-smi") is None:
            return None
        out = subprocess.run(["nvidia-smi", *cls.QUERY], capture_output=True, text=True, check=False).stdout
        try:
            return float(out.split(",")[1])
        except (IndexError, ValueError):
            return None

    def __enter__(self):
        if self.enabled:
            self.proc = subprocess.Popen(["nvidia-smi", *self.QUERY, "-lms", "200"], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()
        return self

    def _read(self):
        for line in self.proc.stdout:
            try:
                util, mem = (float(v) for v in line.split(",")[:2])
            except ValueError:
                continue
            self.samples.append((time.time(), util, mem))

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()
            self.thread.join(timeout=5)

    def summary(self, t0: float | None, t1: float | None, baseline: float | None) -> dict:
        window = [s for s in self.samples if t0 is not None and t1 is not None and t0 <= s[0] <= t1]
        peak = max((s[2] for s in self.samples), default=None)
        return {"gpu_util_mean": statistics.fmean(s[1] for s in window) if window else None,
                "gpu_util_samples": len(window),
                "smi_peak_mb": peak, "smi_baseline_mb": baseline,
                "smi_peak_above_baseline_mb": None if peak is None or baseline is None else peak - baseline}


def stream(cmd, cwd, env, log: Path, timeout: float | None):
    """Run ``cmd``, its output line by line into ``log``, each line's arrival time kept; (rc, lines, times)."""
    lines, times, start = [], [], time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        killer = threading.Timer(timeout, proc.kill) if timeout else None
        if killer:
            killer.start()
        for line in proc.stdout:
            times.append(time.time())
            lines.append(line)
            f.write(line)
        rc = proc.wait()
        if killer:
            killer.cancel()
    return rc, lines, times, time.time() - start


# --- the runs ---------------------------------------------------------------------------------------------------

_PFLLIB_DRIVER = r"""
import runpy, sys, torch
system, argv = sys.argv[1], sys.argv[2:]
sys.path.insert(0, system)
sys.argv = ["main.py", *argv]
try:
    runpy.run_path("main.py", run_name="__main__")
finally:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        print("SIDE_BY_SIDE cuda_max_allocated_mb", torch.cuda.max_memory_allocated() / 2**20, flush=True)
"""

_FEDCLUST_DRIVER = r"""
import json, sys, time, torch
from fedclust import runner
from fedclust.cli import main
out, args, ends = sys.argv[1], sys.argv[2:], []
def _end(setup, state, run_dir):
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    ends.append([int(state.round), time.time()])
runner.add_round_end_hook(_end)
rc = main(["run", *args])
cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
json.dump({"rc": rc, "round_ends": ends,
           "cuda_max_allocated_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
           "cuda_max_reserved_mb": torch.cuda.max_memory_reserved() / 2**20 if cuda else None}, open(out, "w"))
sys.exit(rc)
"""

_SHIMS = {
    "sklearn/__init__.py": '"""Stand-in for scikit-learn (experiments/pfllib_side_by_side.py): two calls."""\n',
    "sklearn/preprocessing.py": (
        "import numpy as np\n\n\ndef label_binarize(y, classes):\n"
        "    y, classes = np.asarray(y), np.asarray(classes)\n"
        "    return (y[:, None] == classes[None, :]).astype(int)\n"),
    "sklearn/metrics.py": (
        "import numpy as np\n\n\n"
        "def roc_auc_score(y_true, y_score, average='micro'):\n"
        "    t, s = np.asarray(y_true).ravel(), np.asarray(y_score, dtype=np.float64).ravel()\n"
        "    pos, neg = int(t.sum()), int(t.size - t.sum())\n"
        "    if pos == 0 or neg == 0:\n        return float('nan')\n"
        "    order = np.argsort(s, kind='stable')\n"
        "    _, first, count = np.unique(s[order], return_index=True, return_counts=True)\n"
        "    ranks = np.empty(s.size)\n"
        "    ranks[order] = np.repeat(first + (count + 1) / 2.0, count)   # average ranks of ties, from 1\n"
        "    return float((ranks[t == 1].sum() - pos * (pos + 1) / 2) / (pos * neg))\n"),
    "h5py.py": (
        '"""Stand-in for h5py (experiments/pfllib_side_by_side.py): a pickle file of named arrays."""\n'
        "import pickle\n\n\nclass File(dict):\n"
        "    def __init__(self, path, mode='r'):\n        super().__init__()\n"
        "        self.path, self.mode = path, mode\n"
        "        if mode == 'r':\n            with open(path, 'rb') as f:\n"
        "                self.update(pickle.load(f))\n"
        "    def create_dataset(self, name, data):\n        self[name] = data\n"
        "    def __enter__(self):\n        return self\n"
        "    def __exit__(self, *exc):\n"
        "        if self.mode != 'r':\n            with open(self.path, 'wb') as f:\n"
        "                pickle.dump(dict(self), f)\n"),
    "calmsize.py": '"""Stand-in for calmsize: the number itself."""\n\n\ndef size(n):\n    return float(n)\n',
    "cvxpy.py": '"""Stand-in for cvxpy, which only FedPAC (imported by main.py, not run here) uses."""\n',
}


def missing_modules(python: str) -> list[str]:
    """PFLlib's extra imports that ``python`` lacks."""
    code = "import importlib.util as u; print(' '.join(m for m in %r if u.find_spec(m) is None))" % (PFLLIB_SHIMMED,)
    return subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()


def write_shims(folder: Path, missing: list[str]) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    for rel, text in _SHIMS.items():
        if rel.split("/")[0].removesuffix(".py") in missing:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)


def timed_slice(values, warmup: int, rounds: int):
    got = values[warmup:warmup + rounds]
    return got if len(got) == rounds else None


def run_pfllib(args, clients: int, name: str, work: Path, env: dict) -> dict:
    R = args.warmup + args.rounds
    system = Path(args.pfllib) / "system"
    cmd = [args.python, "-u", "-c", _PFLLIB_DRIVER, str(system),
           "-data", name, "-m", "CNN", "-algo", "FedAvg", "-gr", str(R), "-nc", str(clients), "-jr", "1",
           "-ls", str(args.epochs), "-lbs", str(args.batch), "-lr", str(args.lr), "-eg", "1", "-dev", args.device,
           "-did", "0", "-t", "1", "-go", "side"]
    base = GpuSampler.once() if args.device == "cuda" else None
    with GpuSampler(args.device == "cuda") as smi:
        rc, lines, times, wall = stream(cmd, system, env, work / f"pfllib_{clients}.log", args.timeout or None)
    got = parse_pfllib(lines)
    secs, at = got["round_seconds"], got["cost_lines"]
    timed = timed_slice(secs, args.warmup, args.rounds)
    window = (times[at[args.warmup - 1]] if args.warmup >= 1 and len(at) >= args.warmup else None,
              times[at[R - 1]] if len(at) >= R else None)
    cuda = [float(x.split()[-1]) for x in lines if x.startswith("SIDE_BY_SIDE cuda_max_allocated_mb")]
    acc = got["accuracy"]
    return {"system": "pfllib", "clients": clients, "returncode": rc, "wall_seconds": wall,
            "seconds_per_round": statistics.median(timed) if timed else None,
            "mean_seconds_per_round": statistics.fmean(timed) if timed else None, "rounds_timed": len(timed or []),
            "timed_round_seconds": timed, "all_round_seconds": secs,
            "final_accuracy": 100.0 * acc[R] if len(acc) > R else None,
            "accuracy_by_round": [100.0 * a for a in acc],   # entry t: after t trainings (0: the initial model)
            "cuda_max_allocated_mb": cuda[-1] if cuda else None, **smi.summary(*window, base),
            "command": " ".join(cmd[:3] + ["<driver>"] + cmd[4:]), "log": str(work / f"pfllib_{clients}.log")}


def fedclust_keys(args, clients: int, rounds: int) -> list[str]:
    return [f"clients={clients}", f"rounds={rounds}", "algorithm.name=fedavg", "participation=1", "eval_every=1",
            "stage1_rounds=0", f"model={SCRIPT}:FedAvgCNN", f"train.lr={args.lr}", "train.lr_decay=1",
            "train.momentum=0", f"train.batch_size={args.batch}", f"train.local_epochs={args.epochs}",
            f"seed={args.seed}", f"device={args.device}", "progress=false", "figures=false", "overwrite=true"]


def run_fedclust(args, clients: int, data: list[str], work: Path, env: dict, warmup: int, rounds: int,
                 tag: str) -> dict:
    R = warmup + rounds
    out = work / f"fedclust_{tag}"
    cmd = [args.python, "-u", "-c", _FEDCLUST_DRIVER, str(work / f"fedclust_{tag}.driver.json"),
           *fedclust_keys(args, clients, R), *data, f"out={out}", *args.fedclust_extra]
    base = GpuSampler.once() if args.device == "cuda" else None
    shutil.rmtree(out, ignore_errors=True)   # a finished run there would be continued, not run again
    (work / f"fedclust_{tag}.driver.json").unlink(missing_ok=True)
    with GpuSampler(args.device == "cuda") as smi:
        rc, lines, times, wall = stream(cmd, ROOT, env, work / f"fedclust_{tag}.log", args.timeout or None)
    driver = {}
    if (work / f"fedclust_{tag}.driver.json").is_file():
        driver = json.loads((work / f"fedclust_{tag}.driver.json").read_text())
    ends = dict(driver.get("round_ends", []))
    wall_rounds = [ends[t] - ends[t - 1] for t in range(2, R + 1) if t in ends and t - 1 in ends]
    timed = timed_slice(wall_rounds, warmup - 1, rounds) if warmup >= 1 else None
    metrics = []
    if (out / "metrics.jsonl").is_file():
        metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    own = timed_slice([m["round_seconds"] for m in metrics], warmup, rounds)
    return {"system": "fedclust", "clients": clients, "returncode": rc, "wall_seconds": wall,
            "seconds_per_round": statistics.median(timed) if timed else None,
            "mean_seconds_per_round": statistics.fmean(timed) if timed else None, "rounds_timed": len(timed or []),
            "timed_round_seconds": timed,
            "fedclust_round_seconds_median": statistics.median(own) if own else None,
            "final_accuracy": metrics[-1]["accuracy"] if len(metrics) == R else None,
            "accuracy_by_round": [m["accuracy"] for m in metrics],
            "cuda_max_allocated_mb": driver.get("cuda_max_allocated_mb"),
            "cuda_max_reserved_mb": driver.get("cuda_max_reserved_mb"),
            **smi.summary(ends.get(warmup), ends.get(R), base),
            "command": "fedclust run " + " ".join(cmd[5:]), "log": str(work / f"fedclust_{tag}.log"),
            "error": None if rc == 0 else "".join(lines[-15:])}


def environment(args) -> dict:
    commit = Path(args.pfllib) / "COMMIT"
    try:
        ours = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        ours = None
    on_cuda = args.device == "cuda" and torch.cuda.is_available()
    return {"issue": 47, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": args.device, "device_name": torch.cuda.get_device_name(0) if on_cuda else "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
            "pfllib_commit": args.pfllib_commit or (commit.read_text().strip() if commit.is_file() else None),
            "fedclust_commit": ours, "nproc": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}


def speedups(rows: list[dict]) -> dict:
    out = {}
    for n in sorted({r["clients"] for r in rows}):
        s = {r["system"]: r["seconds_per_round"] for r in rows if r["clients"] == n and not r.get("scale")}
        if s.get("pfllib") and s.get("fedclust"):
            out[str(n)] = s["pfllib"] / s["fedclust"]
    return out


def fmt(v, spec: str, none: str = "–") -> str:
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def table(record: dict) -> str:
    goal = {20: 20, 100: 100}
    lines = ["| clients | system | s/round (median) | speed-up | final accuracy % | torch peak MB | "
             "nvidia-smi MB above idle | GPU util % |", "|---|---|---|---|---|---|---|---|"]
    sp = record.get("speedups", {})
    for r in record["rows"]:
        up = sp.get(str(r["clients"])) if r["system"] == "fedclust" and not r.get("scale") else None
        target = goal.get(r["clients"])
        up_s = "" if up is None else (f"{up:,.0f}x" if up >= 100 else f"{up:.3g}x") + (
            f" (goal {target}x)" if target else "")
        name = r["system"] + (" (scale)" if r.get("scale") else "")
        if r.get("returncode"):
            name += f" (exit {r['returncode']})"
        lines.append(f"| {r['clients']:,} | {name} | {fmt(r['seconds_per_round'], '.4g')} ({r['rounds_timed']}) | "
                     f"{up_s} | {fmt(r['final_accuracy'], '.2f')} | {fmt(r.get('cuda_max_allocated_mb'), ',.0f')} | "
                     f"{fmt(r.get('smi_peak_above_baseline_mb'), ',.0f')} | {fmt(r.get('gpu_util_mean'), '.0f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--clients", default="20,100", help="client counts of the side-by-side rows")
    ap.add_argument("--rounds", type=int, default=10, help="timed rounds")
    ap.add_argument("--warmup", type=int, default=1, help="rounds before the timed ones (>= 1)")
    ap.add_argument("--train-per-client", type=int, default=600)
    ap.add_argument("--test-per-client", type=int, default=100)
    ap.add_argument("--epochs", type=int, default=1, help="local epochs (PFLlib's default)")
    ap.add_argument("--batch", type=int, default=10, help="batch size (PFLlib's default)")
    ap.add_argument("--lr", type=float, default=0.005, help="SGD learning rate (PFLlib's default)")
    ap.add_argument("--seed", type=int, default=0, help="the split's and fedclust's seed (PFLlib's is 0)")
    ap.add_argument("--scale", default="1000,10000", help="fedclust-alone client counts ('' for none)")
    ap.add_argument("--scale-rounds", type=int, default=2, help="timed rounds of a scale row (after 1 warm-up)")
    ap.add_argument("--systems", default="fedclust,pfllib", help="which of the side-by-side rows to run")
    ap.add_argument("--idx", default=None, help="folder of the four Fashion-MNIST IDX files (default: the Debian "
                    "package's, where fedclust's fmnist data set falls back to)")
    ap.add_argument("--pfllib", default=str(ROOT / "runs" / "pfllib" / "src"), help="PFLlib's tree")
    ap.add_argument("--pfllib-commit", default=None, help="default: <pfllib>/COMMIT")
    ap.add_argument("--work", default=str(ROOT / "runs" / "side_by_side"), help="fedclust's files, the logs")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=float, default=0, help="seconds a run may take (0: no limit)")
    ap.add_argument("--json", default=None, help="the record (written after every run)")
    ap.add_argument("--fedclust-extra", nargs="*", default=[], help="more fedclust KEY=VALUE overrides")
    args = ap.parse_args(argv)
    if args.warmup < 1 or args.rounds < 1:
        ap.error("--warmup and --rounds must be >= 1")
    if args.train_per_client % args.batch:
        ap.error("--train-per-client must be a multiple of --batch (PFLlib drops a last short batch, fedclust not)")
    idx = args.idx or idx_default()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    systems = set(args.systems.split(","))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    missing = missing_modules(args.python) if "pfllib" in systems else []
    shim = Path(args.pfllib) / "shim"
    write_shims(shim, missing)
    pfl_env = {**env, "PYTHONPATH": os.pathsep.join([env["PYTHONPATH"], str(shim)])} if missing else env
    record = {**environment(args), "idx": str(idx), "pfllib_shimmed": missing, "note": NOTE,
              "settings": {k: getattr(args, k) for k in ("rounds", "warmup", "train_per_client", "test_per_client",
                                                         "epochs", "batch", "lr", "seed", "scale_rounds")}
              | {"join_ratio": 1.0, "eval_every": 1, "split": "iid, seeded permutation, standardised float32",
                 "model": "PFLlib FedAvgCNN (dim 1024) / experiments/pfllib_side_by_side.py:FedAvgCNN"},
              "rows": []}

    def save():
        record["speedups"] = speedups(record["rows"])
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(record, indent=1) + "\n")

    clients = [int(c) for c in args.clients.split(",") if c.strip()]
    train_x, train_y, test_x, test_y = read_fmnist(idx)
    for n in clients:
        t0 = time.time()
        split = make_split(train_x, train_y, test_x, test_y, n, args.train_per_client, args.test_per_client,
                           args.seed)
        name = f"FMNIST_side_{n}"
        if "pfllib" in systems:
            target = Path(args.pfllib) / "dataset" / name
            shutil.rmtree(target, ignore_errors=True)
            write_pfllib(target, split)
        npz = write_fedclust(work / f"split_{n}.npz", split)
        print(f"split of {n} clients written in {time.time() - t0:.1f} s", flush=True)
        del split
        if "fedclust" in systems:
            record["rows"].append(run_fedclust(args, n, ["data.name=npz", f"data.path={npz}"], work, env,
                                               args.warmup, args.rounds, str(n)))
            save()
            print(json.dumps({k: record["rows"][-1][k] for k in ("system", "clients", "seconds_per_round",
                                                                 "final_accuracy", "returncode")}), flush=True)
        if "pfllib" in systems:
            record["rows"].append(run_pfllib(args, n, name, work, pfl_env))
            save()
            print(json.dumps({k: record["rows"][-1][k] for k in ("system", "clients", "seconds_per_round",
                                                                 "final_accuracy", "returncode")}), flush=True)
    for n in [int(c) for c in args.scale.split(",") if c.strip()]:
        data = ["data.name=fmnist", f"data.root={idx}", "data.num_clusters=1", "data.share_images=true",
                f"data.train_size={args.train_per_client}", f"data.test_size={args.test_per_client}"]
        row = run_fedclust(args, n, data, work, env, 1, args.scale_rounds, f"scale_{n}")
        record["rows"].append(row | {"scale": True})
        save()
        print(json.dumps({k: row[k] for k in ("system", "clients", "seconds_per_round", "returncode")}), flush=True)
    save()
    print(table(record))
    print("\n" + NOTE)
    return 0 if all(r["returncode"] == 0 for r in record["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
