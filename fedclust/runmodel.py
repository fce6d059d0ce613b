"""The run's model, worked out once from the config: its name (``model``, or with ``auto`` its data set's
default), the input shape and classes its data set declares, its layout, its initial weights, and what the engine
trains.  It sits above both ``fedclust.data`` and ``fedclust.models`` (neither imports the other for it), and
every part of a run that needs the model asks :func:`run_model`.

Building a model's module costs a forward-free ``nn.Module`` construction (a user's model: its file imported once):
:func:`run_model` keeps the few it built in this process, keyed on what decides them (name, input shape, classes,
seed), so the config check, the run's set-up, the checkpoint's record and an export share one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from fedclust import rng
from fedclust.data import registry as data_registry
from fedclust.engine.layout import ParamLayout
from fedclust.models import build_model, initial_weights, make_net


def default_arch(data_name: str) -> str:
    """The model a data set declares for model=auto (docs/algorithms.md: cnn for cifar10, logreg for
    synthetic, mlp for the others); mlp for a name no registered data set has (a report of a plugin's runs)."""
    ds = data_registry.find(data_name)
    return ds.default_model if ds is not None else "mlp"


def model_name(cfg) -> str:
    """The run's model as named: ``cfg.model``, or with ``auto`` its data set's default."""
    return default_arch(cfg.data.name) if cfg.model == "auto" else cfg.model


def model_spec(cfg) -> tuple[str, tuple[int, ...], int]:
    """(architecture, input shape of one sample, classes) of a run's model, as its data set declares them."""
    ds = data_registry.get(cfg.data.name)
    return model_name(cfg), tuple(ds.input_shape(cfg.data)), int(ds.num_classes(cfg.data))


@dataclass(frozen=True)
class RunModel:
    """A run's model: ``spec`` as the config names it (resolved from ``auto``), one sample's ``input_shape``,
    ``classes``, its flat ``layout`` and ``w0``, the common initial weights of every client (the default init
    under the run's seed, CPU generator: the same on every rank)."""

    spec: str
    input_shape: tuple[int, ...]
    classes: int
    seed: int
    layout: ParamLayout
    w0: torch.Tensor

    @property
    def parameters(self) -> int:
        """P, the flat parameter count."""
        return self.layout.numel

    def init(self, seed: int) -> torch.Tensor:
        """The model's default init under another ``seed`` (IFCA's further cluster models), flat ``[P]``."""
        return self.w0.clone() if seed == self.seed else initial_weights(self.spec, self.input_shape,
                                                                         self.classes, seed)[1]

    def client_rows(self, client_ids: torch.Tensor) -> torch.Tensor:
        """``[C, P]``: each client's own initial model (config ``train.init=per_client``), the default init under
        :func:`client_seed` of (run seed, client): the same row on any number of processes."""
        ids = [int(i) for i in client_ids.cpu()]
        if not ids:
            return self.w0.new_zeros(0, self.parameters)
        return torch.stack([self.init(client_seed(self.seed, i)) for i in ids])

    def net(self, engine: str = "auto", device: str = "cpu", unequal: bool = False):
        """``(net, why)``: what the engine trains for this model and ``engine`` on ``device``
        (:func:`fedclust.models.make_net`); ``unequal``: the clients hold different numbers of examples."""
        return make_net(self.spec, self.input_shape, self.classes, engine, device, self.seed, unequal=unequal)


def client_seed(seed: int, client: int) -> int:
    """The seed of client ``client``'s own initial model in a run of seed ``seed`` (``train.init=per_client``): a
    32-bit hash of (seed, client), never the run's seed itself for a client."""
    h = int(rng.hash_ints(seed, 0, "init", client, 0))
    return h if h != seed else (h + 1) % 2**32


@functools.lru_cache(maxsize=8)
def _built(spec: str, input_shape: tuple[int, ...], classes: int, seed: int) -> RunModel:
    layout, w0 = initial_weights(spec, input_shape, classes, seed)
    return RunModel(spec, input_shape, classes, seed, layout, w0)


def run_model(cfg, seed: int | None = None) -> RunModel:
    """The run's :class:`RunModel` under ``seed`` (default: the run's), built once per process for each (model,
    inputs, classes, seed).  Its ``w0`` is shared: copy it before changing it."""
    spec, shape, classes = model_spec(cfg)
    return _built(spec, tuple(shape), classes, cfg.seed if seed is None else int(seed))


def parameter_count(cfg) -> int:
    """P, the flat parameter count of the run's model."""
    return run_model(cfg).parameters


__all__ = ["RunModel", "run_model", "model_spec", "model_name", "default_arch", "parameter_count", "build_model"]
