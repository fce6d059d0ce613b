"""``fedclust bench``: time one round of local training (docs/algorithms.md).

One round = 200 training images per client, 3 epochs, batch 128 (128 + 72),
SGD lr 0.08 momentum 0.9, on random tensors of the real shapes: MLP on
28x28x1, CNN on 32x32x3.  Each row is the vectorized engine
(:func:`fedclust.engine.train.train_round`) or the plain per-client loop
(:func:`fedclust.bench.reference.reference_train_round`); both start from
the same weights and batch orders.  Every row is timed as reported: one
warm-up round, then the median of up to ``--repeats`` timed rounds (fewer
when a round is slow).  ``--quick`` times fewer rows and clients, each row
saying so in its ``note``; nothing is extrapolated.

Peak memory: on a GPU ``torch.cuda.max_memory_allocated`` over the timed
rounds (data, weights and all temporaries); on a CPU the growth of the
process's peak resident set (VmHWM, reset through /proc/self/clear_refs
before the row allocates its data) over its resident set at that moment;
``mem_method`` names which.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import resource
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from fedclust import rng
from fedclust.bench.reference import reference_train_round
from fedclust.engine.layout import ParamLayout
from fedclust.engine.module_net import ModuleNet
from fedclust.engine.precision import apply_precision
from fedclust.engine.train import TrainSettings, train_round
from fedclust.models import build_model, builtin, is_user_model
from fedclust.schema import PRECISIONS

SHAPES = {"mlp": (1, 28, 28), "cnn": (3, 32, 32)}
TRAIN_SIZE, EPOCHS, BATCH, LR, CLASSES = 200, 3, 128, 0.08, 10


@dataclass
class Case:
    model: str
    clients: int
    path: str  # vectorized | reference; a user model: batched | loop | reference
    note: str = ""


@dataclass
class Record:
    model: str
    clients: int
    path: str
    ms_per_round: float
    ms_per_client: float
    peak_mem_mb: float
    device: str
    mem_method: str
    repeats: int
    note: str = ""
    extra: dict = field(default_factory=dict)


def plan(quick: bool, device: torch.device) -> list[Case]:
    """The rows to time (see the module docstring)."""
    if not quick:
        return [Case(m, c, p) for m in ("mlp", "cnn")
                for c, p in ((100, "vectorized"), (100, "reference"), (1000, "vectorized"))]
    if device.type == "cuda":
        return [Case(m, 100, p) for m in ("mlp", "cnn") for p in ("vectorized", "reference")]
    few = "quick: 10 clients instead of 100 (not extrapolated); no 1000-client row"
    return [Case("mlp", 100, "vectorized", "quick: no 1000-client row"),
            Case("mlp", 100, "reference", "quick"),
            Case("cnn", 10, "vectorized", few),
            Case("cnn", 10, "reference", few)]


USER_PATHS = ("batched", "loop", "reference")
USER_SHAPE = (1, 28, 28)   # a user model is timed on Fashion-MNIST-shaped inputs


def user_plan(specs: list[str], quick: bool) -> list[Case]:
    """A user model's rows: the batched engine (torch.func.vmap), the
    engine's per-client loop, and the plain per-client nn.Module + SGD loop."""
    clients, note = (20, "quick: 20 clients instead of 100 (not extrapolated)") if quick else (100, "")
    return [Case(spec, clients, p, note) for spec in specs for p in USER_PATHS]


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench: --device cuda asked for, but torch sees no CUDA device; use --device cpu")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
        cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    return f"cpu:{cpu} ({torch.get_num_threads()} threads)"


def _rss_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            m = re.search(rf"{key}:\s+(\d+)", f.read())
        return int(m.group(1)) if m else None
    except OSError:
        return None


class PeakMemory:
    """Peak memory of what runs between ``start`` and ``peak_mb`` (see module docstring)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.method = "cuda.max_memory_allocated"
        self.base = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current resident set
            self.method = "cpu: growth of peak RSS (VmHWM) over RSS at row start"
            self.base = _rss_kb("VmRSS") or 0
        except OSError:  # not Linux: lifetime peak, only grows
            self.method = "cpu: growth of getrusage ru_maxrss (lifetime peak; 0 if an earlier row peaked higher)"
            self.base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def peak_mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        if self.method.startswith("cpu: growth of peak RSS"):
            return max(0, (_rss_kb("VmHWM") or 0) - self.base) / 1024
        return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - self.base) / 1024


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_case(case: Case, device: torch.device, repeats: int, compile_: bool, budget_s: float) -> Record:
    """Time one row: warm-up round, then up to ``repeats`` rounds (stopping
    early once ``budget_s`` seconds were spent timing)."""
    shape = USER_SHAPE if is_user_model(case.model) else SHAPES[case.model]
    torch.manual_seed(0)
    module = build_model(case.model, shape, CLASSES)
    layout = ParamLayout.from_module(module)
    w0 = layout.flatten(module).to(device)
    mem = PeakMemory(device)
    mem.start()
    g = torch.Generator(device="cpu").manual_seed(1)
    x = torch.randn(case.clients, TRAIN_SIZE, *shape, generator=g).to(device)
    y = torch.randint(0, CLASSES, (case.clients, TRAIN_SIZE), generator=g).to(device)
    orders = rng.batch_orders(0, 1, torch.arange(case.clients), EPOCHS, TRAIN_SIZE).to(device)
    settings = TrainSettings(lr=LR, momentum=0.9, batch_size=BATCH, epochs=EPOCHS, compile=compile_)
    flat = w0.expand(case.clients, -1).clone()
    net = ModuleNet(module, case.path, name=case.model) if case.path in ("batched", "loop") else None

    def one_round() -> float:
        flat.copy_(w0.expand_as(flat))
        _sync(device)
        t0 = time.perf_counter()
        if case.path == "vectorized":
            train_round(flat, layout, builtin(case.model), x, y, orders, settings)
        elif case.path in ("batched", "loop"):
            train_round(flat, layout, net, x, y, orders, settings)
        else:
            reference_train_round(flat, layout, case.model, x, y, orders, settings, shape, CLASSES)
        _sync(device)
        return time.perf_counter() - t0

    one_round()  # warm-up
    times: list[float] = []
    while len(times) < repeats and (not times or sum(times) < budget_s):
        times.append(one_round())
    ms = statistics.median(times) * 1000
    note = case.note
    if case.path == "vectorized" and compile_:
        note = (note + "; " if note else "") + "torch.compile"
    return Record(case.model, case.clients, case.path, round(ms, 2), round(ms / case.clients, 3),
                  round(mem.peak_mb(), 1), device_name(device), mem.method, len(times), note)


def format_table(records: list[Record]) -> str:
    """Readable table plus the vectorized/reference speed-ups at equal client counts."""
    width = max([5] + [len(r.model) for r in records])
    lines = [f"fedclust bench: one round = {TRAIN_SIZE} images/client, {EPOCHS} epochs, batch {BATCH}",
             f"device: {records[0].device if records else '?'}",
             f"{'model':<{width}} {'path':<10} {'clients':>7} {'ms/round':>11} {'ms/client':>10} {'peak MB':>9} "
             f"{'n':>2}  note"]
    for r in records:
        lines.append(f"{r.model:<{width}} {r.path:<10} {r.clients:>7} {r.ms_per_round:>11.1f} "
                     f"{r.ms_per_client:>10.2f} {r.peak_mem_mb:>9.1f} {r.repeats:>2}  {r.note}")
    for r in records:
        if r.path not in ("vectorized", "batched", "loop"):
            continue
        for ref in records:
            if ref.path == "reference" and (ref.model, ref.clients) == (r.model, r.clients):
                lines.append(f"speed-up {r.model} {r.path} at {r.clients} clients: "
                             f"{ref.ms_per_round / r.ms_per_round:.2f}x (reference / {r.path})")
    if records:
        lines.append(f"peak memory: {records[0].mem_method}; n = timed rounds (median shown)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedclust bench",
        description="Time one round of local training (docs/algorithms.md): vectorized engine vs the plain per-client "
                    "loop, MLP and CNN, 100 and 1,000 clients (the full table takes about 15 minutes on a "
                    "2-core CPU; use --quick there).")
    parser.add_argument("--quick", action="store_true", help="fewer rows and clients (under a minute on a CPU)")
    parser.add_argument("--json", action="store_true", help="print a JSON list of records instead of a table")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the vectorized torch.func step (meant for GPUs; the MLP then uses the "
                             "torch.func path instead of its hand-written backward)")
    parser.add_argument("--precision", choices=PRECISIONS, default="default",
                        help="the GPU arithmetic of products and convolutions, as the precision key of a run")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per row at most (median reported)")
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated subset of mlp,cnn; empty: none")
    parser.add_argument("--user-models", default="", metavar="SPEC,SPEC",
                        help="your models (FILE.py:NAME or package.module:NAME, comma-separated) on 28x28x1 inputs: "
                             "the batched engine, its per-client loop and the plain nn.Module + SGD loop")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats = {args.repeats}: use at least 1")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in models:
        if m not in SHAPES:
            parser.error(f"--models contains {m!r}: use a subset of mlp,cnn")
    device = pick_device(args.device)
    apply_precision(args.precision, device.type)
    budget_s = 15.0 if args.quick else 60.0
    records = []
    specs = [m.strip() for m in args.user_models.split(",") if m.strip()]
    for case in [c for c in plan(args.quick, device) if c.model in models] + user_plan(specs, args.quick):
        records.append(run_case(case, device, args.repeats, args.compile, budget_s))
        if args.precision != "default" and device.type == "cuda":
            records[-1].note = "; ".join(x for x in (records[-1].note, f"precision {args.precision}") if x)
        if not args.json:
            print(f"  timed {case.model} {case.path} x{case.clients}: {records[-1].ms_per_round:.1f} ms", flush=True)
    if args.json:
        print(json.dumps([asdict(r) for r in records], indent=1))
    else:
        print(format_table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
