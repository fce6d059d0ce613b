"""What decentralizepy (a checkout of ``sacs-epfl/facade``) loads to run on a split fedclust wrote
(``experiments/reference/harness.py``): its ``[DATASET] dataset_package`` is this module, on ``PYTHONPATH`` in
the harness's virtual environment only (it imports decentralizepy, which fedclust never does).

- ``FedclustClients``: node ``uid`` trains on client ``uid``'s examples of ``split.npz`` (in ``train_dir``) and
  is tested on its own test examples; its cluster is the file's ``cluster[uid]`` (not decentralizepy's own
  shuffled assignment).  Inputs are normalised as fedclust normalises a file of clients
  (``fedclust/data/sets/npz.py``, ``_stats``: the mean and standard deviation of all of ``x_train``).  With
  ``validation_size`` and ``validation_source`` set, the validation set is the node's test set (Facade's node
  needs one to pick the head it all-reduces; no training example is held out).
- ``FedclustMLP``: fedclust's MLP (784-200-200-10, ReLU), with the hooks the fork's nodes call (DePRL's
  ``key_in_head``, Facade's ``HEAD_LAYERS`` / ``get_shared_layers`` / ``set_share_all``); the head is ``fc3``, as
  fedclust's ``[head]``.  Built from fedclust's common initial weights (``w0.pt``, a state dict, in the folder
  named by the environment variable ``FEDCLUST_REF_W0``); with ``FEDCLUST_REF_W0`` unset the node keeps the
  fork's own initialisation (each node's under ``random_seed * uid``, EL's under ``random_seed``).
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F
from decentralizepy.datasets.DatasetClustered import DatasetClustered
from decentralizepy.models.Model import Model
from torch import nn
from torch.utils.data import TensorDataset


def _normalised(x: np.ndarray, mean: float, std: float) -> torch.Tensor:
    return ((torch.from_numpy(x).to(torch.float32) - mean) / std).contiguous()


class FedclustClients(DatasetClustered):
    """Client ``uid`` of fedclust's ``split.npz`` (x_train, y_train, client_train, x_test, y_test, client_test,
    cluster)."""

    def __init__(self, rank, machine_id, mapping, random_seed=1234, only_local=False, train_dir="", test_dir="",
                 sizes="", test_batch_size="", validation_source="", validation_size="", number_of_clusters=1,
                 top_k_acc=1):
        self._arrays = np.load(os.path.join(train_dir or test_dir, "split.npz"))
        super().__init__(rank, machine_id, mapping, random_seed, only_local, train_dir, test_dir, sizes,
                         test_batch_size, validation_source, validation_size, int(number_of_clusters),
                         int(top_k_acc))
        self.num_classes = int(self._arrays["y_train"].max()) + 1
        x = self._arrays["x_train"].astype(np.float64)
        self._mean, self._std = float(x.mean()), float(x.std()) or 1.0
        if self.__training__:
            self.load_trainset()
        if self.__testing__:
            self.load_testset()

    def assign_cluster(self):
        self.clusters_idx = [int(c) for c in self._arrays["cluster"]]
        self.cluster = self.clusters_idx[self.uid]

    def _rows(self, split: str) -> TensorDataset:
        a = self._arrays
        mine = np.flatnonzero(a[f"client_{split}"] == self.uid)
        return TensorDataset(_normalised(a[f"x_{split}"][mine], self._mean, self._std),
                             torch.from_numpy(a[f"y_{split}"][mine].astype(np.int64)))

    def load_trainset(self):
        self.trainset = self._rows("train")

    def load_testset(self):
        self.testset = self._rows("test")
        if self.__validating__:
            self.validationset = self.testset


class FedclustMLP(Model):
    """fedclust's MLP (fedclust/models/mlp.py), head ``fc3``."""

    HEAD_LAYERS = ["fc3.weight", "fc3.bias"]
    HEAD_BUFFERS: list = []
    current_head = HEAD_LAYERS
    current_head_buffers = HEAD_BUFFERS

    def __init__(self, in_features: int = 784, hidden: int = 200, classes: int = 10):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)
        folder = os.environ.get("FEDCLUST_REF_W0")
        if folder:
            self.load_state_dict(torch.load(os.path.join(folder, "w0.pt"), weights_only=True))

    def forward(self, x):
        h = torch.flatten(x, 1)
        h = F.relu(self.fc1(h))
        h = F.relu(self.fc2(h))
        return self.fc3(h)

    def deepcopy(self):
        twin = type(self)()
        twin.load_state_dict(self.state_dict())
        return twin

    # DePRL (sacs-epfl/facade's DePRLSharing, TrainingDePRL)
    def key_in_head(self, key: str) -> bool:
        return key.startswith("fc3")

    # Facade (the fork's IDCA nodes)
    def get_layers(self):
        return [self.fc1, self.fc2, self.fc3]

    def get_shared_layers(self):
        with torch.no_grad():
            return [p.detach().clone() for name, p in self.named_parameters() if name not in self.current_head]

    def set_shared_layers(self, shared_layers):
        shared = list(shared_layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name not in self.current_head:
                    p.copy_(shared.pop(0))
        assert not shared, "more shared layers given than the model has"

    def freeze_body(self):
        for p in list(self.fc1.parameters()) + list(self.fc2.parameters()):
            p.requires_grad = False

    @classmethod
    def set_share_all(cls):
        cls.current_head = []
        cls.current_head_buffers = []

    @classmethod
    def set_share_core(cls):
        cls.current_head = cls.HEAD_LAYERS
        cls.current_head_buffers = cls.HEAD_BUFFERS
