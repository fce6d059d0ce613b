"""Issue 46, part 1: the reference code of Epidemic Learning (oracle), D-PSGD, DAC, DePRL and Facade
(``sacs-epfl/facade``, a decentralizepy fork) and fedclust, on one split that fedclust writes.

The setting: 16 nodes in 2 Fashion-MNIST rotation clusters (8 at 0°, 8 at 180°), 200 class-balanced training
images a node (no image on two nodes), every node tested on the same 2,000 class-balanced test images rotated to
its cluster, fedclust's MLP from fedclust's common initial weights, 1 epoch of batch 20 a round, SGD lr 0.05
without momentum, weight decay or lr decay, 100 rounds, k = degree = 4.

    python3 experiments/reference/harness.py setup --facade /path/to/facade     # its own venv, once
    python3 experiments/reference/harness.py run --facade /path/to/facade --seeds 1
    python3 experiments/reference/harness.py table                              # JSON + markdown

DFCA's reference (``jonaskir6/dfca`` at 93803c7, a notebook class without a command line) and FedSPD's
(``Anonymous-Submission-for-AISTATS/FedSPD_Anonymous_Submission`` at c2e47d8) run through their own drivers,
``dfca_ref.py`` and ``fedspd_ref.py``, which import them from a checkout; their rows run only when named:

    python3 experiments/reference/harness.py setup --dfca /path/to/dfca --fedspd /path/to/fedspd
    python3 experiments/reference/harness.py run --dfca /path/to/dfca --fedspd /path/to/fedspd \
        --methods dfca,fedspd --no-extras --seeds 1

Everything goes under ``--work`` (default ``runs/reference``, git-ignored): ``venv/`` (decentralizepy from the
checkout, ``--system-site-packages`` so it uses the torch already installed), ``seed<S>/data/`` (``split.npz``,
the file of clients both sides read, ``w0.pt``, fedclust's common initial weights under seed S as a state dict,
``inits_dfca.pt`` / ``inits_fedspd.pt``, fedclust's 2 cluster inits of DFCA-GI and FedSPD as state dicts, and
``graph.edges``, FedSPD's graph on both sides), ``seed<S>/ref-<method>/``
(decentralizepy's config, logs and per-node results) and ``seed<S>/fedclust-<method>/`` (a fedclust run
directory).  A finished run is skipped when run again.  Each run is one process tree at a time, ``nice``, one
thread a process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
NODES, PER_CLUSTER, TRAIN_PER_CLASS, TEST_PER_CLASS, CLASSES = 16, 8, 20, 200, 10
ROUNDS, DEGREE, LR, BATCH = 100, 4, 0.05, 20
METHODS = ["el_oracle", "dpsgd", "dac", "deprl", "facade"]   # decentralizepy's, run by default
DRIVEN = {"dfca": "dfca_ref.py", "fedspd": "fedspd_ref.py"}   # run by a driver here, only when --methods names it
DFCA_COMMIT = "93803c70cd213ecdf686e1b76a3e78c44126e35a"
FEDSPD_COMMIT = "c2e47d83269553c955973b46c2b9e77c2f0e3212"

# the reference's driver (its eval/ or tutorial/ script), node package, and config of each method: the Facade
# benchmark's own configs (tutorial/final_exps/configs/config_CIFAR_{dpsgd,dac,deprl,idca}.ini,
# tutorial/EpidemicLearning/config_EL.ini) with the setting's data, model, optimiser and rounds
REF = {
    "el_oracle": dict(driver="tutorial/EpidemicLearning/testingEL_Oracle.py", server=True, graph_file=True,
                      training=("decentralizepy.training.Training", "Training"),
                      sharing=("decentralizepy.sharing.PlainAverageSharing", "PlainAverageSharing"), node={}),
    "dpsgd": dict(driver="eval/testingDPSGDnIID.py", server=True,
                  training=("decentralizepy.training.TrainingNIID", "TrainingNIID"),
                  sharing=("decentralizepy.sharing.Sharing", "Sharing"),
                  node=dict(log_per_sample_loss=False, log_per_sample_pred_true=False, do_all_reduce_models=True)),
    "dac": dict(driver="eval/testingDAC.py", server=True,
                training=("decentralizepy.training.TrainingNIID", "TrainingNIID"),
                sharing=("decentralizepy.sharing.Sharing", "Sharing"),
                node=dict(log_per_sample_loss=False, log_per_sample_pred_true=False, do_all_reduce_models=False)),
    "deprl": dict(driver="eval/testingDePRL.py", server=True,
                  training=("decentralizepy.training.TrainingDePRL", "TrainingDePRL"),
                  sharing=("decentralizepy.sharing.DePRLSharing", "DePRLSharing"),
                  node=dict(log_per_sample_loss=False, log_per_sample_pred_true=False, do_all_reduce_models=True)),
    "facade": dict(driver="eval/testingIDCAwPS.py", server=False,
                   training=("decentralizepy.training.TrainingIDCA", "TrainingIDCA"),
                   sharing=("decentralizepy.sharing.CurrentModelSharing", "CurrentModelSharing"),
                   node=dict(log_per_sample_loss=False, log_per_sample_pred_true=False, do_all_reduce_models=True,
                             layers_sharing=True, share_all_for=10, graph_package="decentralizepy.graphs.Regular",
                             graph_class="Regular", graph_seed=1234),
                   extra_dataset=dict(number_of_models=2), extra_train=dict(explore_models=False)),
}

# fedclust's run of each method, with the keys that match the reference's (docs/results_reference.md)
COMMON_KEYS = [f"clients={NODES}", f"rounds={ROUNDS}", "stage1_rounds=0", "data.name=npz", "model=mlp",
               f"train.lr={LR}", "train.lr_decay=1", "train.momentum=0", f"train.batch_size={BATCH}",
               "train.local_epochs=1", f"algorithm.k={DEGREE}", "progress=false", "figures=false"]
FEDCLUST = {
    "el_oracle": ["algorithm.name=epidemic", "epidemic.variant=oracle", f"epidemic.s={DEGREE}"],
    # the fork's D-PSGD is D-PSGD on a fresh random 4-regular graph a round with Metropolis-Hastings weights,
    # which on a regular graph are 1/(degree + 1) each: EL-Oracle at s = 4, the same fedclust run
    "dpsgd": ["algorithm.name=epidemic", "epidemic.variant=oracle", f"epidemic.s={DEGREE}"],
    # the fork's τ is DAC_var's sigmoid from 1 towards 31 (DPSGDNodeDAC.py, tau_function), as dac.schedule=sigmoid
    "dac": ["algorithm.name=dac", "dac.propagate=false", "dac.schedule=sigmoid", "dac.tau=30"],
    "deprl": ["algorithm.name=deprl", "deprl.head_epochs=1", "deprl.body_epochs=1", f"deprl.degree={DEGREE}"],
    "facade": ["algorithm.name=facade", "facade.heads=2", "facade.warmup=10", f"facade.degree={DEGREE}"],
    # the reference's local step: τ = 10 full-batch steps (batch 200 = a client's training set), at the common lr
    "dfca": ["algorithm.name=dfca", "dfca.clusters=2", "dfca.init=global", "train.batch_size=200",
             "train.local_epochs=10"],
    # the reference's first pass is local_ep epochs at local_ep = 1; its graph the split's graph.edges (fedclust_keys)
    "fedspd": ["algorithm.name=fedspd", "fedspd.clusters=2", "fedspd.first_epochs=1", "fedspd.finetune_rounds=5",
               "fedspd.finetune_epochs=1", "network.graph=file"],
}
FEDCLUST_RUN = {"dpsgd": "el_oracle"}   # one fedclust run serves both rows
# fedclust's own defaults where they differ from the fork's, beside the reference of the same method
EXTRA = {
    "dac_edvinli": ("dac", ["algorithm.name=dac"]),   # propagate=true, constant τ = 30 (edvinli/DAC)
    "deprl_head3": ("deprl", ["algorithm.name=deprl", f"deprl.degree={DEGREE}"]),   # head_epochs=3 (GYan58)
    # issue 46 part 2's keys for the other departures, each beside the reference row it moves towards
    "dac_per_client": ("dac", [*FEDCLUST["dac"], "train.init=per_client"]),        # each node its own init
    "dpsgd_per_client": ("dpsgd", [*FEDCLUST["dpsgd"], "train.init=per_client"]),
    "deprl_per_client": ("deprl", [*FEDCLUST["deprl"], "train.init=per_client"]),
    "facade_per_client": ("facade", [*FEDCLUST["facade"], "train.init=per_client"]),
    "deprl_all_reduce": ("deprl", [*FEDCLUST["deprl"], "deprl.final_allreduce=true"]),   # the fork's last step
    # the fork's Facade as it reports: the head of lowest test loss, after the final all-reduce
    "facade_as_reference": ("facade", [*FEDCLUST["facade"], "facade.report_head=lowest_test_loss",
                                       "facade.final_allreduce=true"]),
}
FEDCLUST.update({name: keys for name, (_, keys) in EXTRA.items()})


def nice_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def run_logged(cmd: list[str], log: Path, env: dict, cwd: Path | None = None) -> float:
    t0 = time.time()
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.run(["nice", "-n", "10", *cmd], stdout=f, stderr=subprocess.STDOUT, env=env,
                            cwd=cwd).returncode
    if rc:
        raise SystemExit(f"failed ({rc}): {' '.join(cmd)}; see {log}")
    return time.time() - t0


# ---------------------------------------------------------------------------------------------------- setup
def venv_python(work: Path) -> Path:
    return work / "venv" / "bin" / "python"


def dfca_code(path: str) -> Path:
    code = Path(path).resolve() / "mnist" / "notebooks" / "exp_1"
    if not (code / "dfca.py").exists():
        raise SystemExit(f"{path} is not a checkout of jonaskir6/dfca (no mnist/notebooks/exp_1/dfca.py)")
    return code


def fedspd_code(path: str) -> Path:
    code = Path(path).resolve() / "src"
    if not (code / "main.py").exists() or not (code / "train.py").exists():
        raise SystemExit(f"{path} is not a checkout of FedSPD_Anonymous_Submission (no src/main.py)")
    return code


def setup(args) -> None:
    """The venv, with decentralizepy from ``--facade`` and/or what DFCA's (``--dfca``) and FedSPD's (``--fedspd``)
    code import."""
    if not args.facade and not args.dfca and not args.fedspd:
        raise SystemExit("setup needs --facade, --dfca and/or --fedspd")
    venv = Path(args.work) / "venv"
    if not venv_python(Path(args.work)).exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    pip = [str(venv_python(Path(args.work))), "-m", "pip", "install", "-q"]
    if args.facade:
        facade = Path(args.facade).resolve()
        if not (facade / "src" / "decentralizepy").is_dir():
            raise SystemExit(f"{facade} is not a checkout of sacs-epfl/facade (no src/decentralizepy)")
        # decentralizepy itself without its pinned-free dependency list (torch, torchvision, numpy come from the
        # system site); only what the five nodes import
        # (editable: the fork's src/decentralizepy/utils_decpy has no __init__.py, which a plain install leaves out)
        subprocess.run([*pip, "--no-deps", "-e", str(facade)], check=True)
        subprocess.run([*pip, "pyzmq", "localconfig", "smallworld", "networkx", "matplotlib"], check=True)
        probe = "import decentralizepy, zmq, localconfig, torch; print('decentralizepy from', decentralizepy.__file__)"
        subprocess.run([str(venv_python(Path(args.work))), "-c", probe], check=True)
    if args.dfca:
        # dfca.py imports seaborn (unused) and sklearn's confusion_matrix (its cluster accuracy, every round)
        subprocess.run([*pip, "scikit-learn", "seaborn", "matplotlib", "scipy"], check=True)
        probe = (f"import sys; sys.path.insert(0, {str(dfca_code(args.dfca))!r}); import dfca; "
                 "print('dfca from', dfca.__file__)")
        subprocess.run([str(venv_python(Path(args.work))), "-c", probe], check=True, env=nice_env())
    if args.fedspd:
        # main.py imports tensorboardX (a loss scalar a batch), utils.py igraph (its BA graph only)
        subprocess.run([*pip, "tensorboardX", "igraph", "tqdm", "scipy"], check=True)
        probe = (f"import sys; sys.path.insert(0, {str(fedspd_code(args.fedspd))!r}); import utils, train, update, "
                 "models, tensorboardX; print('fedspd from', utils.__file__)")
        subprocess.run([str(venv_python(Path(args.work))), "-c", probe], check=True, env=nice_env())


# ---------------------------------------------------------------------------------------------------- split
def write_split(root: str, seed: int, out: Path) -> None:
    """``split.npz`` (fedclust's file of clients: x/y/client of each split, cluster), ``w0.pt`` and
    ``inits_dfca.pt``."""
    import torch

    from fedclust.data.partition import rotate_images
    from fedclust.data.sources import load_fmnist
    from fedclust.models import initial_weights

    raw = load_fmnist(root, download=False)
    g = np.random.default_rng(seed)
    ytr, yte = raw.train_y.numpy(), raw.test_y.numpy()
    train_rows = [[] for _ in range(NODES)]
    for c in range(CLASSES):
        pool = g.permutation(np.flatnonzero(ytr == c))[: NODES * TRAIN_PER_CLASS]
        for i in range(NODES):
            train_rows[i] += list(pool[i * TRAIN_PER_CLASS:(i + 1) * TRAIN_PER_CLASS])
    train_rows = [g.permutation(np.asarray(r)) for r in train_rows]
    test = g.permutation(np.concatenate([g.permutation(np.flatnonzero(yte == c))[:TEST_PER_CLASS]
                                         for c in range(CLASSES)]))
    cluster = g.permutation(np.repeat(np.arange(2), PER_CLUSTER))
    xs_tr, xs_te = [], []
    for i in range(NODES):
        angle = 180.0 * cluster[i]
        xs_tr.append(rotate_images(raw.train_x[torch.from_numpy(train_rows[i])], angle).numpy())
        xs_te.append(rotate_images(raw.test_x[torch.from_numpy(test)], angle).numpy())
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "split.npz",
             x_train=np.concatenate(xs_tr), y_train=np.concatenate([ytr[r] for r in train_rows]),
             client_train=np.repeat(np.arange(NODES), [len(r) for r in train_rows]),
             x_test=np.concatenate(xs_te), y_test=np.tile(yte[test], NODES),
             client_test=np.repeat(np.arange(NODES), len(test)),
             cluster=cluster.astype(np.int64), num_classes=np.int64(CLASSES))
    layout, w0 = initial_weights("mlp", (1, 28, 28), CLASSES, seed)   # fedclust's common w0 of a run of seed
    torch.save(state_dict(layout, w0), out / "w0.pt")
    write_inits(seed, out)


def state_dict(layout, flat):
    """The named tensors of a flat parameter vector of fedclust's ``layout`` (fc1.weight, ...)."""
    return {name: flat[off:off + int(np.prod(shape))].reshape(shape).clone()
            for name, shape, off in zip(layout.names, layout.shapes, layout.offsets)}


def write_inits(seed: int, out: Path, k: int = 2) -> None:
    """``inits_dfca.pt`` and ``inits_fedspd.pt``: the k initial cluster models of fedclust's DFCA-GI and FedSPD in a
    run of ``seed`` (``w0``, then the model's init under ``cluster_inits``' seeds of their streams), each a list of
    state dicts; and ``graph.edges``.  2k model builds."""
    import torch

    from fedclust.algorithms import dfca, fedspd
    from fedclust.algorithms.cluster_models import cluster_inits
    from fedclust.models import initial_weights

    layout, w0 = initial_weights("mlp", (1, 28, 28), CLASSES, seed)
    for name, stream in (("dfca", dfca.INIT_STREAM), ("fedspd", fedspd.INIT_STREAM)):
        rows = cluster_inits(w0, k, seed, lambda s: initial_weights("mlp", (1, 28, 28), CLASSES, s)[1],
                             stream=stream)
        torch.save([state_dict(layout, row) for row in rows], out / f"inits_{name}.pt")
    write_graph(seed, out)


def write_graph(seed: int, out: Path) -> None:
    """``graph.edges``: a connected random ``DEGREE``-regular graph on the nodes (networkx, seeded), "i j" lines,
    no self-loops: FedSPD's graph on both sides (the reference's ER(16, 0.25) can be disconnected, which
    fedclust's file graph refuses)."""
    import networkx as nx

    for attempt in range(100):
        g = nx.random_regular_graph(DEGREE, NODES, seed=seed * 1000 + attempt)
        if nx.is_connected(g):
            break
    (out / "graph.edges").write_text("".join(f"{i} {j}\n" for i, j in sorted(tuple(sorted(e)) for e in g.edges)))


# ---------------------------------------------------------------------------------------------------- reference
def ref_config(method: str, seed: int, data: Path, folder: Path) -> Path:
    r = REF[method]
    ds = dict(dataset_package="decpy_fedclust", dataset_class="FedclustClients", model_class="FedclustMLP",
              train_dir=f"{data}/", test_dir=f"{data}/", random_seed=seed, number_of_clusters=2,
              test_batch_size=500, validation_source="Test", validation_size=1,
              **r.get("extra_dataset", {}))
    if method == "el_oracle":   # EL's node is not a clustered one: no validation set there
        ds.pop("validation_source")
        ds.pop("validation_size")
    train = dict(training_package=r["training"][0], training_class=r["training"][1], rounds=1, full_epochs=True,
                 batch_size=BATCH, shuffle=True, loss_package="torch.nn", loss_class="CrossEntropyLoss",
                 **r.get("extra_train", {}))
    sections = {
        "DATASET": ds,
        "OPTIMIZER_PARAMS": dict(optimizer_package="torch.optim", optimizer_class="SGD", lr=LR),
        "TRAIN_PARAMS": train,
        "COMMUNICATION": dict(comm_package="decentralizepy.communication.TCP", comm_class="TCP",
                              addresses_filepath=str(folder / "ip.json"),
                              offset=20000 + 200 * METHODS.index(method) + 1000 * (seed % 10)),
        "SHARING": dict(sharing_package=r["sharing"][0], sharing_class=r["sharing"][1]),
        "NODE": dict(graph_degree=DEGREE, **r["node"]),
    }
    if method == "el_oracle":
        sections["SHARING"]["compress"] = False
    lines = []
    for name, kv in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {v}" for k, v in kv.items()]
        lines.append("")
    (folder / "ip.json").write_text('{"0": "127.0.0.1"}\n')
    cfg = folder / "config.ini"
    cfg.write_text("\n".join(lines))
    return cfg


def finished(logs: Path) -> int | None:
    """The first node that did not write round 100's test accuracy (None: every node did)."""
    for uid in range(NODES):
        res = logs / f"{uid}_results.json"
        if not res.exists() or str(ROUNDS) not in json.loads(res.read_text())["test_acc"]:
            return uid
    return None


def reference_command(args, method: str, seed: int, data: Path, folder: Path) -> list[str]:
    """The command of a reference run by its own driver here (``DRIVEN``)."""
    checkout = {"dfca": args.dfca, "fedspd": args.fedspd}[method]
    cmd = [str(venv_python(Path(args.work))), str(HERE / DRIVEN[method]), f"--{method}", str(Path(checkout).resolve()),
           "--data", str(data.resolve()), "--seed", str(seed), "--rounds", str(ROUNDS), "--lr", str(LR),
           "--out", str(folder.resolve())]
    return cmd + (["--batch", str(BATCH)] if method == "fedspd" else [])


def run_reference(args, method: str, seed: int, data: Path, folder: Path) -> None:
    logs = folder / "logs"
    if (folder / "done.json").exists():
        return
    if folder.exists() and (folder / "driver.log").exists() and finished(logs) is None:   # ended without us
        (folder / "done.json").write_text(json.dumps({"seconds": None, "command": "see driver.log"}) + "\n")
        return
    if folder.exists():
        shutil.rmtree(folder)
    logs.mkdir(parents=True)
    if method in DRIVEN:
        cmd = reference_command(args, method, seed, data, folder)
        env = dict(nice_env(), CUDA_VISIBLE_DEVICES="")   # FedSPD's main.py puts its models on a GPU, its data not
        run_and_mark(cmd, env, folder, f"reference {method}, seed {seed}")
        return
    cfg = ref_config(method, seed, data, folder)
    facade = Path(args.facade).resolve()
    r = REF[method]
    # the NIID nodes test in rounds 1, 1 + T, ...; EL's node in rounds T, 2T, ...: both in round 100
    every = 25 if method == "el_oracle" else 33
    cmd = [str(venv_python(Path(args.work))), str(facade / r["driver"]), "-ro", "0", "-tea", str(every),
           "-ta", str(every), "-ld", str(logs), "-wsd", str(logs), "-mid", "0", "-ps", str(NODES),
           "-ms", "1", "-is", str(ROUNDS), "-cf", str(cfg), "-ll", "INFO"]
    if r["server"]:
        cmd += ["-sm", "0", "-sr", "-1"]
    if r.get("graph_file"):   # EL's driver reads a graph only for the number of nodes
        edges = folder / "complete.edges"
        edges.write_text(f"{NODES}\n" + "".join(f"{i} {j}\n" for i in range(NODES) for j in range(NODES) if i < j))
        cmd += ["-gf", str(edges), "-gt", "edges"]
    env = nice_env()
    env["PYTHONPATH"] = str(HERE)
    if not args.per_node_init:
        env["FEDCLUST_REF_W0"] = str(data)
    run_and_mark(cmd, env, folder, f"reference {method}, seed {seed}")


def run_and_mark(cmd: list[str], env: dict, folder: Path, what: str) -> None:
    """Run a reference's command in ``folder`` (its output in driver.log), then mark it done (done.json: seconds,
    command) when every node wrote round ROUNDS: a driver exits 0 when its node processes die."""
    seconds = run_logged(cmd, folder / "driver.log", env, cwd=folder)
    uid = finished(folder / "logs")
    if uid is not None:
        raise SystemExit(f"{what}: node {uid} did not finish round {ROUNDS}; see {folder}/driver.log and "
                         f"{folder}/logs/{uid}.log")
    (folder / "done.json").write_text(json.dumps({"seconds": seconds, "command": " ".join(cmd)}) + "\n")


# ---------------------------------------------------------------------------------------------------- fedclust
def fedclust_keys(method: str, seed: int, data: Path) -> list[str]:
    graph = [f"network.path={data / 'graph.edges'}"] if "network.graph=file" in FEDCLUST[method] else []
    return [*COMMON_KEYS, f"seed={seed}", f"data.path={data / 'split.npz'}", *FEDCLUST[method], *graph]


def run_fedclust(method: str, seed: int, data: Path, folder: Path) -> None:
    if (folder / "summary.json").exists():
        return
    cmd = [sys.executable, "-m", "fedclust", "run", str(REPO / "configs" / "fmnist_rotation2.yaml"),
           *fedclust_keys(method, seed, data), f"out={folder}", "overwrite=true"]
    folder.parent.mkdir(parents=True, exist_ok=True)
    run_logged(cmd, folder.parent / f"{folder.name}.log", nice_env(), cwd=REPO)


def run(args) -> None:
    work = Path(args.work)
    if not venv_python(work).exists():
        raise SystemExit(f"no venv at {work / 'venv'}: run `harness.py setup --facade PATH` (or --dfca PATH) first")
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS + list(DRIVEN)]
    if unknown:
        raise SystemExit(f"unknown methods {unknown}: choose among {METHODS + list(DRIVEN)}")
    if not args.fedclust_only:
        if not args.facade and any(m in METHODS for m in methods):
            raise SystemExit("decentralizepy's methods need --facade")
        if "dfca" in methods:
            if not args.dfca:
                raise SystemExit("the dfca row needs --dfca (a checkout of jonaskir6/dfca)")
            dfca_code(args.dfca)
        if "fedspd" in methods:
            if not args.fedspd:
                raise SystemExit("the fedspd row needs --fedspd (a checkout of FedSPD_Anonymous_Submission)")
            fedspd_code(args.fedspd)
        if args.per_node_init and any(m in DRIVEN for m in methods):
            raise SystemExit("--per-node-init: not wired for the dfca and fedspd rows")
    for seed in [int(s) for s in args.seeds.split(",")]:
        base = work / f"seed{seed}"
        data = base / "data"
        if not (data / "split.npz").exists():
            write_split(args.root, seed, data)
        if any(m in DRIVEN for m in methods) and not (data / "inits_fedspd.pt").exists():   # an older split
            write_inits(seed, data)
        for m in methods + ([] if args.no_extras or args.reference_only else list(EXTRA)):
            if m in EXTRA:
                print(f"seed {seed} fedclust {m} ...", flush=True)
                run_fedclust(m, seed, data, base / f"fedclust-{m}")
                continue
            if not args.fedclust_only:
                print(f"seed {seed} reference {m} ...", flush=True)
                run_reference(args, m, seed, data, base / f"ref-{m}{'-pernode' if args.per_node_init else ''}")
            if not args.reference_only:
                fm = FEDCLUST_RUN.get(m, m)
                print(f"seed {seed} fedclust {fm} ...", flush=True)
                run_fedclust(fm, seed, data, base / f"fedclust-{fm}")


# ---------------------------------------------------------------------------------------------------- table
def ari(a, b) -> float:
    """Adjusted Rand index of two labelings."""
    a, b = np.asarray(a), np.asarray(b)
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1))
    np.add.at(table, (ai, bi), 1)

    def c2(x):
        return (x * (x - 1) / 2).sum()

    index, sa, sb, n2 = c2(table), c2(table.sum(1)), c2(table.sum(0)), len(a) * (len(a) - 1) / 2
    expected = sa * sb / n2
    top = (sa + sb) / 2
    return 1.0 if top == expected else float((index - expected) / (top - expected))


def read_reference(folder: Path, cluster: np.ndarray) -> dict | None:
    logs = folder / "logs"
    if not (folder / "done.json").exists():
        return None
    acc_last, acc_after, best_idx, chosen, same, best_of_k = [], [], [], [], [], []
    for uid in range(NODES):
        res = json.loads((logs / f"{uid}_results.json").read_text())
        keys = sorted(res["test_acc"], key=int)
        acc_last.append(res["test_acc"][str(ROUNDS)])
        acc_after.append(res["test_acc"][keys[-1]] if int(keys[-1]) > ROUNDS else None)
        if "test_best_model_idx" in res:
            best_idx.append(res["test_best_model_idx"][str(ROUNDS)])
        if "test_acc_best_of_k" in res:
            best_of_k.append(res["test_acc_best_of_k"][str(ROUNDS)])
        text = (logs / f"{uid}.log").read_text(errors="replace") if (logs / f"{uid}.log").exists() else ""
        picks = re.findall(r"Best model chosen:(\d+)", text.split("Final evaluation (after all-reduce)")[0])
        if picks:
            chosen.append(int(picks[-1]))
        pulls = re.findall(r"Incomming neighbors \(to recieve from\): \{([^}]*)\}", text)
        for line in pulls[-20:]:
            peers = [int(p) for p in line.replace("np.int64(", "").replace(")", "").split(",") if p.strip()]
            same += [float(cluster[p] == cluster[uid]) for p in peers]
    out = {"accuracy": float(np.mean(acc_last)), "per_node": acc_last,
           "seconds": json.loads((folder / "done.json").read_text())["seconds"]}
    if all(a is not None for a in acc_after):
        out["accuracy_after_all_reduce"] = float(np.mean(acc_after))
    if len(best_of_k) == NODES:
        out["accuracy_best_of_k"] = float(np.mean(best_of_k))
    if len(best_idx) == NODES:
        out["ari_reported_head"] = ari(best_idx, cluster)
    if len(chosen) == NODES:
        out["ari_trained_head"] = ari(chosen, cluster)
    if same:
        out["same_cluster_share_last20"] = float(np.mean(same))
    return out


def read_fedclust(folder: Path) -> dict | None:
    p = folder / "summary.json"
    if not p.exists():
        return None
    s = json.loads(p.read_text())
    out = {"accuracy": s.get("final_accuracy")}
    for key in ("ari", "neighbor_precision", "num_clusters", "final_accuracy_oracle_head", "worst_cluster_accuracy",
                "final_accuracy_best_of_k", "wall_seconds"):
        if s.get(key) is not None:
            out[key] = s[key]
    return out


def table(args) -> None:
    work = Path(args.work)
    rows: dict = {}
    seeds = sorted(int(p.name[4:]) for p in work.glob("seed*") if p.name[4:].isdigit())
    for seed in seeds:
        base = work / f"seed{seed}"
        cluster = np.load(base / "data" / "split.npz")["cluster"]
        for m in METHODS + list(DRIVEN) + list(EXTRA):
            for tag, folder in (("reference", base / f"ref-{m}"),
                                ("reference_per_node_init", base / f"ref-{m}-pernode"),
                                ("fedclust", base / f"fedclust-{FEDCLUST_RUN.get(m, m)}")):
                if m in EXTRA and tag != "fedclust":
                    continue
                got = read_reference(folder, cluster) if tag.startswith("reference") else read_fedclust(folder)
                if got is not None:
                    rows.setdefault(m, {}).setdefault(tag, {})[seed] = got
    facade = Path(args.facade).resolve() if args.facade else None
    commit = None
    if facade and (facade / ".git").exists():
        commit = subprocess.run(["git", "-C", str(facade), "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    doc = {"what": "issue 46 part 1: sacs-epfl/facade (decentralizepy) beside fedclust on one split",
           "reference_commit": commit, "machine": f"{platform.processor() or platform.machine()}, "
           f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d"), "seeds": seeds,
           "fedclust_commit": subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                             text=True).stdout.strip(),
           "dfca_commit": DFCA_COMMIT if "dfca" in rows else None,
           "fedspd_commit": FEDSPD_COMMIT if "fedspd" in rows else None,
           "fedclust_keys": {m: [*COMMON_KEYS, *FEDCLUST[m]] for m in FEDCLUST}, "rows": rows}
    out = Path(args.json or work / "results_reference.json")
    out.write_text(json.dumps(doc, indent=1) + "\n")

    def mean(tag, m, key="accuracy"):
        vals = [v[key] for v in rows.get(m, {}).get(tag, {}).values() if v.get(key) is not None]
        return (float(np.mean(vals)), len(vals)) if vals else (None, 0)

    def fmt(v):
        return "—" if v[0] is None else f"{v[0]:.2f} ({v[1]})"

    print("| method | reference (seeds) | reference after its final all-reduce | fedclust (seeds) | gap (seeds) | "
          "clusters, reference | clusters, fedclust |")
    print("|---|---|---|---|---|---|---|")
    for m in METHODS + list(DRIVEN) + list(EXTRA):
        refm = EXTRA[m][0] if m in EXTRA else m
        ref, fed = mean("reference", refm), mean("fedclust", m)
        after = mean("reference", refm, "accuracy_after_all_reduce")
        pr, pf = rows.get(refm, {}).get("reference", {}), rows.get(m, {}).get("fedclust", {})
        both = [seed for seed in pr if seed in pf]   # the gap over the seeds both sides ran
        gap = "—" if not both else (f"{np.mean([pf[x]['accuracy'] - pr[x]['accuracy'] for x in both]):+.2f} "
                                    f"({len(both)})")
        rc = []
        for key, label in (("same_cluster_share_last20", "same-cluster share of pulls, last 20 rounds"),
                           ("ari_trained_head", "ARI of trained head"), ("ari_reported_head", "ARI of reported head"),
                           ("accuracy_best_of_k", "best-of-k accuracy")):
            v = mean("reference", refm, key)
            if v[0] is not None:
                rc.append(f"{label} {v[0]:.2f}")
        fc = []
        for key, label in (("num_clusters", "clusters found"), ("ari", "ARI"),
                           ("neighbor_precision", "same-cluster share of neighbours"),
                           ("final_accuracy_oracle_head", "oracle-head accuracy"),
                           ("final_accuracy_best_of_k", "best-of-k accuracy")):
            v = mean("fedclust", m, key)
            if v[0] is not None:
                fc.append(f"{label} {v[0]:.2f}")
        print(f"| {m} | {fmt(ref)} | {fmt(after)} | {fmt(fed)} | {gap} | {'; '.join(rc) or '—'} | "
              f"{'; '.join(fc) or '—'} |")
    print("\nEach seed, reference / fedclust (the reference after its final all-reduce in brackets):\n")
    print("| method | " + " | ".join(f"seed {seed}" for seed in seeds) + " |")
    print("|---|" + "---|" * len(seeds))
    for m in METHODS + list(DRIVEN) + list(EXTRA):
        refm = EXTRA[m][0] if m in EXTRA else m
        cells = []
        for seed in seeds:
            r = rows.get(refm, {}).get("reference", {}).get(seed, {})
            f = rows.get(m, {}).get("fedclust", {}).get(seed, {})
            ref_txt = f"{r['accuracy']:.2f}" if r else "—"
            if r.get("accuracy_after_all_reduce") is not None:
                ref_txt += f" ({r['accuracy_after_all_reduce']:.2f})"
            cells.append(f"{ref_txt} / {f['accuracy']:.2f}" if f else f"{ref_txt} / —")
        print(f"| {m} | " + " | ".join(cells) + " |")
    print(f"\n(JSON: {out})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default=str(REPO / "runs" / "reference"), help="venv, splits and runs (git-ignored)")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("setup", help="create the venv: decentralizepy from --facade, the imports of --dfca, --fedspd")
    s.add_argument("--facade", default=None, help="a checkout of sacs-epfl/facade")
    s.add_argument("--dfca", default=None, help="a checkout of jonaskir6/dfca (its imports, and a probe)")
    s.add_argument("--fedspd", default=None, help="a checkout of FedSPD_Anonymous_Submission (its imports, a probe)")
    s = sub.add_parser("split", help="write the split, w0, the cluster inits and graph of a seed")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--root", default=str(REPO / "data"), help="Fashion-MNIST's folder (else the Debian package's)")
    s = sub.add_parser("run", help="run both sides, one run at a time")
    s.add_argument("--facade", default=None, help="a checkout of sacs-epfl/facade (decentralizepy's methods)")
    s.add_argument("--dfca", default=None, help="a checkout of jonaskir6/dfca at 93803c7 (the dfca row)")
    s.add_argument("--fedspd", default=None, help="a checkout of FedSPD_Anonymous_Submission at c2e47d8 (fedspd row)")
    s.add_argument("--seeds", default="1")
    s.add_argument("--methods", default=",".join(METHODS), help=f"of {','.join(METHODS + list(DRIVEN))}")
    s.add_argument("--root", default=str(REPO / "data"))
    s.add_argument("--per-node-init", action="store_true",
                   help="the reference keeps its own per-node initial weights (runs go to ref-<method>-pernode)")
    s.add_argument("--no-extras", action="store_true", help="leave out fedclust's own defaults (EXTRA)")
    s.add_argument("--reference-only", action="store_true")
    s.add_argument("--fedclust-only", action="store_true")
    s = sub.add_parser("table", help="results JSON and the markdown table")
    s.add_argument("--facade", default=None, help="the checkout, for its commit")
    s.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.cmd == "setup":
        setup(args)
    elif args.cmd == "split":
        write_split(args.root, args.seed, Path(args.work) / f"seed{args.seed}" / "data")
    elif args.cmd == "run":
        run(args)
    else:
        table(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
