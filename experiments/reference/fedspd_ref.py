"""FedSPD's reference code (``Anonymous-Submission-for-AISTATS/FedSPD_Anonymous_Submission`` at c2e47d8,
``src/main.py``) on a split fedclust wrote (``experiments/reference/harness.py``, ``write_split``): the harness's
fedspd row.  The code is imported from the checkout (``--fedspd``, never copied here: the repository has no
licence) and its ``main.py`` runs as it is (``runpy``), after these patches, process-local:

- ``utils.get_dataset_ubc``: ``split.npz`` instead of its datasets (inputs normalised as fedclust normalises a
  file of clients); ``user_groups[i]`` client i's training rows, and a test set per client (``tidx[i]``, its own
  test rows) where the reference keys 5 test sets by ``i % 5``: ``train.agg_train_UB_M`` and
  ``update.test_inference_UB2_M`` are wrapped to pass client i's (the latter still drops the last partial batch
  of 128, as the reference does; the full-test accuracy is computed after the run from the final models).
- ``utils.genGraph``: the harness's ``graph.edges`` (the 0/1 adjacency with self-loops, as ``genER`` builds it),
  fedclust's ``network.graph=file`` on the same file.
- ``models.CNNMnist`` (what ``--dataset mnist`` builds): fedclust's MLP with ``log_softmax`` (the reference's
  losses are ``NLLLoss``), cluster model s of every client from ``inits_fedspd.pt`` (fedclust's inits:
  ``w0``, then ``cluster_inits`` of stream ``fedspd_init``).
- ``torch.optim.SGD``: momentum ``--momentum`` (default 0, the setting's optimiser) where the reference hard-codes
  0.5 (``update.py`` 68, 181).
- ``tensorboardX.SummaryWriter`` is used as installed (``harness.py setup``), its events under ``<out>/logs_tb``.

Kept as the reference runs: the first pass of every cluster model (epoch 0, ``local_ep`` epochs at 1), the
random groups, the alignment every 10 rounds, the per-example reassignment with its minimum and batch rules,
``drop_last`` in local training, the fine-tuning of the mixed model at lr/2 with a fresh 10% held out each stage.

    python experiments/reference/fedspd_ref.py --fedspd CHECKOUT --data runs/reference/seed1/data --seed 1 \\
        --rounds 100 --out runs/reference/seed1/ref-fedspd

``--rounds`` counts as fedclust does: the first pass is 2 rounds there (one a cluster model), 1 epoch here, so the
reference runs ``rounds − 2 − 5 + 1`` epochs and 5 fine-tuning stages.  Seeds ``random``, numpy and torch (the
reference seeds nothing); one thread.  Writes ``<out>/logs/<uid>_results.json`` (``test_acc``: the accuracy on the
client's whole test set; ``test_acc_reference``: the reference's own, without the last partial batch;
``cluster_assigned``: the cluster of most of its examples) and ``<uid>.log`` (``Best model chosen:<cluster>``),
which the harness's ``read_reference`` reads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import runpy
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from dfca_ref import FedclustMLP  # this folder's DFCA driver: the same model class
from torch.utils.data import TensorDataset

S, FINETUNE = 2, 5


def adjacency(edges: Path, n: int) -> np.ndarray:
    """The 0/1 ``[n, n]`` adjacency of an edge list ("i j" lines), with self-loops as ``genER`` sets them."""
    adj = np.eye(n)
    for line in edges.read_text().split("\n"):
        if line.strip():
            i, j = (int(v) for v in line.split())
            adj[i, j] = adj[j, i] = 1
    return adj


def epochs_of(rounds: int) -> int:
    """The reference's ``--epochs`` for fedclust's ``rounds``: its epoch 0 is fedclust's S first-pass rounds."""
    return rounds - S - FINETUNE + 1


class MixtureMLP(FedclustMLP):
    """fedclust's MLP as the reference's model (``CNNMnist(args=args)``): ``log_softmax`` out; the k-th model
    built is cluster ``k % S``'s, from ``inits`` (main.py builds them client by client, cluster by cluster)."""

    inits: list = []
    built = 0

    def __init__(self, args=None):
        super().__init__()
        cls = type(self)
        self.load_state_dict(cls.inits[cls.built % S])
        cls.built += 1

    def forward(self, x):
        return F.log_softmax(super().forward(x), dim=1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fedspd", required=True, help="a checkout of FedSPD_Anonymous_Submission at c2e47d8")
    p.add_argument("--data", required=True, help="the split's folder: split.npz, inits_fedspd.pt, graph.edges")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=20)
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (the reference hard-codes 0.5)")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    src = Path(args.fedspd).resolve() / "src"
    if not (src / "main.py").exists():
        raise SystemExit(f"{src} has no main.py: --fedspd must be a checkout of FedSPD_Anonymous_Submission")
    data, out = Path(args.data).resolve(), Path(args.out).resolve()
    sys.path.insert(0, str(src))
    import models  # the checkout's modules, patched before main.py imports their names
    import train
    import update
    import utils

    a = np.load(data / "split.npz")
    x = a["x_train"].astype(np.float64)
    mean, std = float(x.mean()), float(x.std()) or 1.0
    n = len(a["cluster"])

    def rows(split):
        return TensorDataset(((torch.from_numpy(a[f"x_{split}"]).to(torch.float32) - mean) / std),
                             torch.from_numpy(a[f"y_{split}"].astype(np.int64)))

    user_groups = {i: np.flatnonzero(a["client_train"] == i) for i in range(n)}
    tidx = {i: np.flatnonzero(a["client_test"] == i) for i in range(n)}
    trainset, testset = rows("train"), rows("test")
    utils.get_dataset_ubc = lambda _args: (trainset, testset, dict(user_groups), dict(tidx))
    utils.genGraph = lambda *_: adjacency(data / "graph.edges", n)
    MixtureMLP.inits = torch.load(data / "inits_fedspd.pt", weights_only=True)
    models.CNNMnist = MixtureMLP
    finetune, infer = train.agg_train_UB_M, update.test_inference_UB2_M

    def agg_train(users, *rest):   # the client's own test set where main.py passes tidx[users % 5]
        return finetune(users, *rest[:-1], tidx[users])

    def test_each(args_, agg_models, test_dataset, _idxs):
        accs, losses = torch.zeros(args_.num_users), torch.zeros(args_.num_users)
        one = argparse.Namespace(**{**vars(args_), "num_users": 1})
        for u in range(args_.num_users):
            acc, loss = infer(one, {0: agg_models[u]}, test_dataset, {0: tidx[u]})
            accs[u], losses[u] = acc[0], loss[0]
        return accs, losses

    train.agg_train_UB_M, update.test_inference_UB2_M = agg_train, test_each
    sgd = torch.optim.SGD

    class SGD(sgd):
        def __init__(self, params, lr, momentum=0.0, **kw):
            super().__init__(params, lr=lr, momentum=args.momentum, **kw)

    torch.optim.SGD = SGD
    cwd = out / "work" / "src"
    for d in (cwd, out / "work" / "save" / "C_25", out / "work" / "logs"):
        d.mkdir(parents=True, exist_ok=True)
    os.chdir(cwd)   # main.py writes ../logs and ../save/C_25
    sys.argv = ["main.py", "--dataset", "mnist", "--model", "cnn", "--num_channels", "1", "--num_classes", "10",
                "--num_users", str(n), "--clusters", str(S), "--epochs", str(epochs_of(args.rounds)),
                "--local_ep", "1", "--local_bs", str(args.batch), "--lr", str(args.lr), "--lr_decay_tr", "1",
                "--lr_decay_ft", "1", "--ft_ep", str(FINETUNE), "--graph", "er", "--verbose", "0"]
    g = runpy.run_path(str(src / "main.py"), run_name="__main__")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    full, kept = [], g["test_acc"].numpy() * 100
    with torch.no_grad():
        for u in range(n):
            model = g["agg_models"][u][0].eval()
            xs, ys = testset[tidx[u]]
            full.append(100.0 * float((model(xs).argmax(1) == ys).double().mean()))
    for u in range(n):
        chosen = int(np.argmax(g["gs"][u]))
        r = str(args.rounds)
        (logs / f"{u}_results.json").write_text(json.dumps({
            "test_acc": {r: full[u]}, "test_acc_reference": {r: float(kept[u])}, "cluster_assigned": {r: chosen},
            "cluster_sizes": {r: [int(v) for v in g["gs"][u]]}}) + "\n")
        (logs / f"{u}.log").write_text(f"round {r} Best model chosen:{chosen}\n")
    print(json.dumps({"rounds": args.rounds, "accuracy": float(np.mean(full)),
                      "accuracy_reference": float(np.mean(kept)),
                      "clusters": [int(np.argmax(g["gs"][u])) for u in range(n)]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
