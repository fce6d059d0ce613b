"""DFCA's reference code (``jonaskir6/dfca`` at 93803c7, ``mnist/notebooks/exp_1/dfca.py``, class
``TrainMNISTCluster``) on a split fedclust wrote (``experiments/reference/harness.py``, ``write_split``): the
harness's dfca row.  The code is imported from the checkout (``--dfca``, never copied here: the repository has no
licence); it has no command line (its notebook ``result.ipynb`` calls ``setup()`` and ``run()``), so this driver
does.

    python experiments/reference/dfca_ref.py --dfca CHECKOUT --data runs/reference/seed1/data --seed 1 \\
        --rounds 100 --out runs/reference/seed1/ref-dfca

The algorithm runs as it is (``run``, ``train``: τ = 10 full-batch steps of manual SGD on the model of lowest
training loss; ``dec_param_update``: 1 .. λ−1 random partners and the pairwise 0.5/0.4 merge with its list
trimming; ``get_inference_stats``: the choice of each client's model by training loss).  Overridden, and only
these:

- ``setup_datasets``: ``split.npz`` instead of MNIST: client i's examples (``client_train == i``, tests
  ``client_test == i``), its cluster the file's, inputs normalised as fedclust normalises a file of clients
  (the mean and standard deviation of all of ``x_train``).
- ``load_data``: no rotation (the split is rotated already; the original would rotate it again).
- ``setup_models``: fedclust's MLP (784-200-200-10, layers fc1/fc2/fc3 as ``decpy_fedclust.FedclustMLP``, a copy
  here because that module imports decentralizepy) from ``inits_dfca.pt`` (fedclust's DFCA-GI inits of the seed,
  ``cluster_inits`` with ``w0`` first); every client a copy of the same k models, as DFCA-GI; the reference's
  ``numpy`` / ``torch`` seeding there is kept.
- ``test`` / ``test_all``: the test set is evaluated only in rounds 1, every 25th and the last (the reference
  evaluates every round); per client, on its own test examples: the accuracy of the model it trained that round
  (chosen by lowest training loss at the round's start, after the round's merge: fedclust's reported figure),
  the best of its k models (fedclust's ``accuracy_best_of_k``; the reference's own figure also tries every
  rotation of the test images, an oracle the split has no use for), and both indices.  Written as
  ``<out>/logs/<uid>_results.json`` and ``<uid>.log``, which the harness's ``read_reference`` reads.

Seeds ``random`` (the partner draws; the notebook seeds it once), numpy and torch with ``--seed``; one thread.
Needs scikit-learn and seaborn importable (``harness.py setup`` installs them; seaborn is imported and unused).
Cost: 16 clients × 10 full-batch steps of 200 images a round, about 1-2 s a round on one core.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

CHECKOUT_MODULE = "mnist/notebooks/exp_1"   # dfca.py and its util.py
NODES, TAU = 16, 10


class FedclustMLP(nn.Module):
    """fedclust's MLP (fedclust/models/mlp.py), named as ``decpy_fedclust.FedclustMLP`` so ``w0.pt`` loads."""

    def __init__(self, in_features: int = 784, hidden: int = 200, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x):
        h = torch.flatten(x, 1)
        h = F.relu(self.fc1(h))
        h = F.relu(self.fc2(h))
        return self.fc3(h)


def tested_rounds(rounds: int, every: int = 25) -> set[int]:
    """Rounds whose test accuracy is computed: 1, every ``every``-th, the last."""
    return {1, rounds} | set(range(every, rounds + 1, every))


def write_logs(logs: Path, records: dict[int, list[dict]]) -> None:
    """Per node ``<uid>_results.json`` (``test_acc``, ``test_loss``, ``test_best_model_idx``,
    ``test_acc_best_of_k`` keyed by round, as the fork's nodes write them) and ``<uid>.log`` (a line ``Best model
    chosen:<a_i>`` per tested round): ``records[round][uid]`` is ``dict(acc, loss, best_of_k, best, chosen)``,
    accuracies in %."""
    logs.mkdir(parents=True, exist_ok=True)
    uids = range(len(next(iter(records.values())))) if records else range(0)
    for uid in uids:
        rows = {str(r): records[r][uid] for r in sorted(records)}
        res = {"test_acc": {r: v["acc"] for r, v in rows.items()},
               "test_loss": {r: v["loss"] for r, v in rows.items()},
               "test_best_model_idx": {r: v["best"] for r, v in rows.items()},
               "test_acc_best_of_k": {r: v["best_of_k"] for r, v in rows.items()},
               "cluster_assigned": {r: v["chosen"] for r, v in rows.items()}}
        (logs / f"{uid}_results.json").write_text(json.dumps(res) + "\n")
        (logs / f"{uid}.log").write_text("".join(f"round {r} Best model chosen:{v['chosen']}\n"
                                                 for r, v in rows.items()))


def make_trainer(base):
    """The subclass of the checkout's ``TrainMNISTCluster`` (``base``) with the overrides of the module
    docstring."""

    class OnSplit(base):
        def __init__(self, config, device, data: Path, out: Path):
            super().__init__(config, device)
            self.data, self.logs = data, out / "logs"
            self.records: dict[int, list[dict]] = {}
            self.latest = self.trained = None   # choice of the last training-set pass; the round's trained one

        def setup_datasets(self):
            np.random.seed(self.config["data_seed"])
            a = np.load(self.data / "split.npz")
            x = a["x_train"].astype(np.float64)
            mean, std = float(x.mean()), float(x.std()) or 1.0
            self.dataset = {}
            for split, m in (("train", self.config["m"]), ("test", self.config["m_test"])):
                client = a[f"client_{split}"]
                X = ((torch.from_numpy(a[f"x_{split}"]).to(torch.float32) - mean) / std).to(self.device)
                self.dataset[split] = {
                    "X": X, "y": torch.from_numpy(a[f"y_{split}"].astype(np.int64)).to(self.device),
                    "data_indices": [np.flatnonzero(client == i) for i in range(m)],
                    "cluster_assign": a["cluster"][:m].astype(np.int64)}

        def load_data(self, m_i, train=True):
            d = self.dataset["train" if train else "test"]
            idx = d["data_indices"][m_i]
            return d["X"][idx].reshape(-1, 28 * 28), d["y"][idx]

        def setup_models(self):
            np.random.seed(self.config["train_seed"])
            torch.manual_seed(self.config["train_seed"])
            inits = torch.load(self.data / "inits_dfca.pt", weights_only=True)
            if len(inits) != self.config["p"]:
                raise SystemExit(f"inits_dfca.pt has {len(inits)} models, p = {self.config['p']}")
            shared = []
            for sd in inits:
                model = FedclustMLP()
                model.load_state_dict(sd)
                shared.append(model.to(self.device))
            self.models = [[FedclustMLP().to(self.device) for _ in shared] for _ in range(self.config["m"])]
            for row in self.models:
                for model, src in zip(row, shared):
                    model.load_state_dict(src.state_dict())
            self.criterion = torch.nn.CrossEntropyLoss()

        def test(self, train=False):
            if train:
                res = super().test(train=True)
                self.trained, self.latest = self.latest, [int(c) for c in res["cluster_assign"]]
                return res
            if self.epoch + 1 not in tested_rounds(self.config["num_epochs"]):
                return {"is_train": False, "loss": math.nan, "acc": math.nan, "cl_acc": math.nan, "cl_ct": [],
                        "cluster_assign": None, "num_data": 0}
            return super().test(train=False)

        @torch.no_grad()
        def test_all(self, train=False):
            rows = []
            for m_i in range(self.config["m_test"]):
                X, y = self.load_data(m_i, train=False)
                accs, losses = [], []
                for model in self.models[m_i]:
                    logits = model(X)
                    losses.append(float(self.criterion(logits, y)))
                    accs.append(100.0 * self.n_correct(logits, y) / len(y))
                chosen = self.trained[m_i]
                rows.append({"acc": accs[chosen], "loss": losses[chosen], "best_of_k": max(accs),
                             "best": int(np.argmax(accs)), "chosen": chosen})
            self.records[self.epoch + 1] = rows
            write_logs(self.logs, self.records)
            return float(np.mean([r["loss"] for r in rows])), float(np.mean([r["acc"] for r in rows])) / 100

    return OnSplit


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dfca", required=True, help="a checkout (or exported tree) of jonaskir6/dfca at 93803c7")
    p.add_argument("--data", required=True, help="the split's folder: split.npz, inits_dfca.pt")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--lr", type=float, default=0.05, help="the setting's lr (the reference's configs: 0.1)")
    p.add_argument("--out", required=True, help="logs/ and the reference's project_dir (results.pickle)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    os.environ.setdefault("MPLBACKEND", "Agg")
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    code = Path(args.dfca).resolve() / CHECKOUT_MODULE
    if not (code / "dfca.py").exists():
        raise SystemExit(f"{code} has no dfca.py: --dfca must be a checkout of jonaskir6/dfca")
    sys.path.insert(0, str(code))
    import dfca  # the checkout's module (its own `from util import *` needs the folder on sys.path)

    out = Path(args.out).resolve()
    config = {"m": NODES, "m_test": NODES, "p": 2, "n": 200, "h1": 200, "uneven": False, "local_model_init": False,
              "num_epochs": args.rounds, "batch_size": 200, "tau": TAU, "lr": args.lr, "data_seed": args.seed,
              "train_seed": args.seed, "config_override": "", "project_dir": str(out / "project")}
    exp = make_trainer(dfca.TrainMNISTCluster)(config, torch.device("cpu"), Path(args.data).resolve(), out)
    exp.setup()
    exp.run()
    last = exp.records[args.rounds]
    print(json.dumps({"rounds": args.rounds, "accuracy": float(np.mean([r["acc"] for r in last])),
                      "accuracy_best_of_k": float(np.mean([r["best_of_k"] for r in last])),
                      "chosen": [r["chosen"] for r in last]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
