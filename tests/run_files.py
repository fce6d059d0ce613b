"""A run directory's metrics and summary without their wall-clock fields, for
tests that compare runs bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

WALL = ("round_seconds", "wall_seconds", "mean_round_seconds", "process_seconds", "starts")


def without_wall(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in WALL}


def metrics(out) -> list[dict]:
    return [without_wall(json.loads(x)) for x in (Path(out) / "metrics.jsonl").read_text().splitlines() if x.strip()]


def summary(out) -> dict:
    return without_wall(json.loads((Path(out) / "summary.json").read_text()))


def results(out) -> tuple[list[dict], dict]:
    return metrics(out), summary(out)


ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"


def experiment(name: str):
    """The script ``experiments/<name>.py`` as a module (experiments/ is no package): its functions, for the tests of
    the tables and data it makes."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
# Algorithms whose killed and resumed 2-process runs tests/integration/test_resume.py compares with their golden files
# (so tests/unit/test_plugins.py need not launch them on 2 processes again): one of each kind of state (PANM's
# lists and similarities, IFCA's cluster models, FedGroup's groups); random and panm_loss keep no state of
# their own beyond panm_grad's, and every algorithm's kill and resume is tested on one process.
RESUMED_ON_TWO = ("panm_grad", "ifca", "fedgroup", "fpfc")   # fpfc: its pair rows travel with their clients

# Runs under several network faults at once that tests/unit/test_network.py compares on 1 and 2 processes: an algorithm
# here is compared on 2 processes there (under its faults, a stronger check of the same claim) and not again
# without faults in tests/unit/test_plugins.py.
FAULT_RUNS = [
    ("random", ("algorithm.k=2", "network.graph=regular", "network.degree=3", "network.redraw_every=3",
                "network.p_drop=0.3", "network.stragglers=0.4", "network.straggler_work=0.3",
                "attack.fraction=0.25", "attack.kind=sign_flip", "share.personal=[head]", "exchange_mb=0.1")),
    ("panm_grad", ("algorithm.k=2", "network.graph=regular", "network.degree=3", "network.redraw_every=3",
                   "network.p_offline=0.3", "attack.fraction=0.25", "attack.kind=label_flip")),
    ("pens", ("algorithm.k=2", "network.graph=small_world", "network.degree=4", "network.p_drop=0.3",
              "share.personal=[head]")),
    ("panm_loss", ("network.p_offline=0.3", "network.p_drop=0.3")),
    ("fedavg", ("network.p_offline=0.3", "participation=0.5", "network.stragglers=0.4",
                "network.straggler_work=0.3", "attack.fraction=0.25", "attack.kind=gaussian")),
    ("ifca", ("network.p_offline=0.3",)),
    ("fpfc", ("network.p_offline=0.3",)),
    ("dac", ("algorithm.k=2", "network.graph=regular", "network.degree=3", "network.p_offline=0.3",
             "network.p_drop=0.3")),
    ("facade", ("network.graph=regular", "network.degree=3", "network.p_offline=0.3", "network.p_drop=0.3",
                "exchange_mb=0.1")),
    ("fedspd", ("network.graph=regular", "network.degree=3", "network.p_offline=0.3", "network.p_drop=0.3")),
    ("dfca", ("network.graph=regular", "network.degree=3", "network.p_offline=0.3", "network.p_drop=0.3",
              "exchange_mb=0.1", "dfca.init=local", "attack.fraction=0.25", "attack.kind=sign_flip")),
]
FAULTED_ON_TWO = tuple(name for name, _ in FAULT_RUNS)
EXCHANGE_RUNS = ("panm_grad", "fedavg", "ifca")   # random: with blocks under faults, above
EXCHANGE_BUDGET = "exchange_mb=0.1"   # 8 synthetic-MLP clients (54,410 weights): dozens of blocks a pass


# The SIMD features of the CPU that pick torch's, MKL's and oneDNN's kernels: two CPUs with the same ATen capability
# (AVX512, say) but other features round float32 sums differently (seen: every golden run but one differed from
# round 1 in its losses' last bits on a CPU with AVX512-FP16 and AMX, all within 1e-6 relative).
_SIMD = ("avx", "amx", "fma", "f16c", "sse", "ssse", "vnni", "bmi", "adx", "sha_ni", "vaes", "vpclmul", "gfni")


def machine_fingerprint() -> dict:
    """What a run's float32 bits depend on besides the code: the torch build, ATen's CPU capability and the
    CPU's vendor and SIMD features (Linux's /proc/cpuinfo; empty elsewhere)."""
    import torch

    vendor, flags = "", []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id" and not vendor:
                vendor = value.strip()
            if key.strip() == "flags":
                flags = sorted(f for f in value.split() if f.startswith(_SIMD))
                break
    except OSError:
        pass
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_vendor": vendor, "cpu_simd": flags}


def machine_id(fingerprint: dict | None = None) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(fingerprint or machine_fingerprint(), sort_keys=True).encode()).hexdigest()[:12]


def golden_dir() -> Path | None:
    """The golden files recorded on a machine like this one: ``tests/golden/`` when its ``environment.json``
    is this machine's fingerprint, else ``tests/golden/machines/<machine id>/`` where one was recorded; None:
    none was, and floats are compared to 1e-6 (tests/golden/README.md)."""
    here = machine_fingerprint()
    if json.loads((GOLDEN / "environment.json").read_text()) == here:
        return GOLDEN
    other = GOLDEN / "machines" / machine_id(here)
    return other if (other / "environment.json").is_file() else None


def golden_here() -> bool:
    """Whether tests/golden/ holds a recording made on a machine like this one: then a run of its config, on
    one thread per process, equals it bit for bit (tests/integration/test_golden_runs.py)."""
    return golden_dir() is not None


def golden(name: str) -> tuple[list[dict], dict]:
    """The golden metrics and summary of ``name``, wall times removed (as :func:`results` gives a run's)."""
    d = golden_dir() or GOLDEN
    records = [without_wall(json.loads(x)) for x in (d / f"{name}.jsonl").read_text().splitlines()]
    return records, without_wall(json.loads((d / f"{name}.summary.json").read_text()))


IMAGE_SIDE, IMAGE_CLASSES = 10, 4   # image_pool's images and classes


def image_pool(path: Path) -> str:
    """A small image pool (data.name=npz, pool form): 1x10x10 images of 4 classes, each class a bright
    block in its own corner over noise, so a conv model has something to learn."""
    import numpy as np

    r = np.random.default_rng(0)
    arrays = {}
    for split, per_class in (("train", 100), ("test", 50)):
        y = r.permutation(np.repeat(np.arange(IMAGE_CLASSES), per_class)).astype(np.int64)
        x = r.integers(0, 120, (len(y), 1, IMAGE_SIDE, IMAGE_SIDE)).astype(np.uint8)
        for i, label in enumerate(y):
            top, left = divmod(int(label), 2)
            x[i, 0, top * 5:top * 5 + 4, left * 5:left * 5 + 4] += 120
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, y
    np.savez(path, **arrays)
    return str(path)


# Runs of one_and_two_runs() that a test reads on one process count only (their key's first part): the golden
# configs' 2-process runs are compared with the golden files, which are the 1-process runs (tests/integration/test_golden_runs.py
# runs them); the runs without exchange blocks are the 1-process reference of the runs with them.
ONLY_ON = {"golden": 2, "exchange_whole": 1}


def drift_events(inputs: Path) -> list[str]:
    """DFCA's drifting run's keys (one_and_two's drift/dfca, killed_on_two's drift_dfca): 9 clients (5 + 4) on the
    image pool written to ``inputs``, half of each cluster moving at rounds 3 and 5, a validation split moving
    with them."""
    return ["clients=9", "rounds=6", "data.name=npz", f"data.path={image_pool(inputs / 'drift_pool.npz')}",
            "data.clusters=rotation", "data.drift_rounds=[3,5]", "data.drift_fraction=0.5", "data.validation=0.25"]


# killed_on_two's late joiners: PANMGrad's 2 of 8 join at round 3, after a 2-round stage one (their empty lists
# filled at HNM), copying a present client's model under offline clients: the checkpoint of round 4 holds them
JOIN_AFTER_STAGE_ONE = ("stage1_rounds=2", "network.join_round=3", "network.join_fraction=0.25",
                        "network.join_init=peer", "network.p_offline=0.2")


def one_and_two_runs(inputs: Path, nproc: int) -> dict[str, list[str]]:
    """Runs that tests compare on 1 and 2 processes, by a key naming the test that reads it, those of them that run
    on ``nproc`` processes (:data:`ONLY_ON`): all of them run in one 1-process and one 2-process job (conftest.py's
    ``one_and_two``), one after the other (tests/run_many.py), instead of two jobs each.  Each entry is
    ``fedclust run``'s arguments but ``out=``; data files they read are written to the folder ``inputs``."""
    import sys

    sys.path.insert(0, str(GOLDEN))
    from record import GOLDEN_OVERRIDES

    runs = {f"faults/{name}": [*GOLDEN_OVERRIDES, f"algorithm.name={name}", "checkpoint_every=2", *faults]
            for name, faults in FAULT_RUNS}
    # tests/integration/test_run.py: 9 clients over 2 ranks (5 + 4)
    runs["run/panm_grad"] = ["configs/fmnist_rotation2.yaml", "data.name=synthetic", "data.train_size=40",
                             "data.test_size=20", "clients=9", "rounds=4", "stage1_rounds=2", "algorithm.k=2",
                             "algorithm.l=3", "progress=false", "seed=5", "algorithm.name=panm_grad"]
    # tests/unit/test_centralized.py: IFCA on 11 clients over 2 ranks (6 + 5), half of them taking part
    runs["centralized/ifca"] = ["configs/fmnist_rotation2.yaml", "data.name=synthetic", "clients=11",
                                "data.train_size=200", "data.test_size=50", "data.synthetic_dim=1",
                                "data.synthetic_alpha=0", "data.synthetic_beta=0", "seed=0", "rounds=4",
                                "progress=false", "figures=false", "model=mlp", "algorithm.name=ifca",
                                "ifca.restarts=2", "ifca.restart_rounds=1", "participation=0.5"]
    # tests/integration/test_plugins_runs.py: every built-in algorithm not compared on 2 processes elsewhere, as the
    # golden files run it, and the example plug-in algorithm
    from fedclust.algorithms import registry

    for name in registry.builtin_names():
        if name not in RESUMED_ON_TWO and name not in FAULTED_ON_TWO:
            runs[f"golden/{name}"] = [*GOLDEN_OVERRIDES, f"algorithm.name={name}"]
    runs["outside/threshold_gossip"] = [*GOLDEN_OVERRIDES, "algorithm.name=threshold_gossip",
                                        f"plugins=[{ROOT / 'examples' / 'threshold_gossip.py'}]",
                                        "threshold_gossip.threshold=0.3"]
    # tests/integration/test_fpfc_state_runs.py: 13 clients (7 + 6 on 2 ranks) while FPFC's clusters fuse
    from test_fpfc_state import CLUSTERED

    runs["fpfc_clustered"] = list(CLUSTERED)
    # tests/integration/test_user_model_runs.py: a conv user model (looped on a CPU) on a generated image pool
    runs["user_conv"] = [*GOLDEN_OVERRIDES, "algorithm.name=panm_loss", "checkpoint_every=2", "rounds=4",
                         "stage1_rounds=2", "train.local_epochs=1", "data.name=npz",
                         f"data.path={image_pool(inputs / 'pool.npz')}", "data.clusters=rotation",
                         "data.num_clusters=2", f"model={ROOT / 'tests' / 'plugins' / 'user_models.py'}:SmallConvGN"]
    # tests/integration/test_drift_runs.py: DFCA (k cluster models a client) on the image pool, 9 clients (5 + 4),
    # half of each cluster moving at rounds 3 and 5, a validation split moving with them
    runs["drift/dfca"] = [*GOLDEN_OVERRIDES, "algorithm.name=dfca", *drift_events(inputs)]
    # tests/integration/test_join_runs.py: late joiners on 8 clients (4 + 4), 2 joining: PANMGrad's at round 5, after
    # stage one (their empty lists filled at HNM, panm.empty_list), copying a present client's model (held on either
    # rank) under offline clients; DFCA's (a bank a client) at round 4 with the initial one
    join = [*GOLDEN_OVERRIDES, "checkpoint_every=2", "network.join_fraction=0.25"]
    runs["join/panm_grad"] = [*join, "network.join_round=5", "algorithm.name=panm_grad", "network.join_init=peer",
                              "network.p_offline=0.2"]
    runs["join/dfca"] = [*join, "network.join_round=4", "algorithm.name=dfca"]
    # tests/integration/test_network_runs.py: PANM's stage one dropping silent previous neighbours under churn (the
    # rule before keep became the default; the fault runs above keep them)
    runs["silent/panm_grad"] = [*GOLDEN_OVERRIDES, "algorithm.name=panm_grad", "network.p_offline=0.3",
                                "network.p_drop=0.2", "panm.silent_neighbours=drop"]
    # tests/integration/test_exchange_runs.py: with a 0.1 MB exchange budget (dozens of blocks a pass) and without
    for name in EXCHANGE_RUNS:
        extra = ["participation=0.5"] if name in ("fedavg", "ifca") else []
        common = [*GOLDEN_OVERRIDES, f"algorithm.name={name}", "checkpoint_every=2"]
        runs[f"exchange/{name}"] = [*common, EXCHANGE_BUDGET, *extra]
        runs[f"exchange_whole/{name}"] = [*common, *extra]
    return {key: args for key, args in runs.items() if ONLY_ON.get(key.split("/")[0], nproc) == nproc}
