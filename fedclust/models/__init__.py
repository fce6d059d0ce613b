"""The models of docs/algorithms.md and yours.

A built-in model is one file here (:mod:`.logreg`, :mod:`.mlp`,
:mod:`.cnn`): its reference ``nn.Module`` and what the engine needs to
train it fast (:class:`.base.BuiltinModel`), found by name in
:mod:`.registry`.  Your own model (``model=FILE.py:NAME``) is any
``nn.Module`` (:mod:`.user`), trained through its functional forward
(:class:`fedclust.engine.module_net.ModuleNet`).  Both reach the engine as
a :class:`fedclust.engine.net.Net`.  The reference modules are what
:mod:`fedclust.bench.reference` trains one client at a time with
``torch.optim.SGD``, and what the engine's forwards reproduce.

Parameter names (``fc1.weight``, ``conv2.bias``, ...) are the keys of the
functional forward's parameter dict.
"""

from __future__ import annotations

import torch
from torch import nn

from fedclust.engine.layout import ParamLayout
from fedclust.engine.module_net import ModuleNet
from fedclust.errors import ConfigError
from fedclust.models.base import BuiltinModel
from fedclust.models.registry import MODELS, builtin, names, register, unknown_model
from fedclust.models.user import (  # noqa: F401
    auto_engine,
    build_user,
    check_module,
    check_vmap,
    definition_sha256,
    file_sha256,
    folder_sha256,
    is_user_model,
    model_fingerprint,
    model_source,
    source_file,
    user_factory,
)

__all__ = ["BuiltinModel", "MODELS", "register", "names", "builtin", "build_model", "check_input", "make_net",
           "model_record", "initial_weights",
           "is_user_model", "model_source", "model_fingerprint", "file_sha256", "folder_sha256", "check_module",
           "user_factory"]


def build_model(arch: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The reference module of ``arch`` for inputs of ``input_shape`` (one
    sample, no batch dimension): (1, 28, 28), (3, 32, 32) or (d,).  ``arch`` is
    a built-in name or a user model ``FILE.py:NAME`` / ``package.module:NAME``
    (:func:`fedclust.models.user.user_factory`)."""
    input_shape = tuple(int(s) for s in input_shape)
    if num_classes < 2:
        raise ValueError(f"num_classes = {num_classes}: a classifier needs at least 2 classes")
    if is_user_model(arch):
        return build_user(arch, input_shape, num_classes)
    if MODELS.find(arch) is None:
        raise unknown_model(arch)
    why = check_input(arch, input_shape)
    if why:
        raise ConfigError("model", arch, f"the {arch} {why}, got {input_shape}; use model: mlp for this data set")
    return builtin(arch).module(input_shape, num_classes)


def check_input(arch: str, input_shape: tuple[int, ...]) -> str | None:
    """What the built-in ``arch`` needs of inputs it cannot take (None: it takes ``input_shape``, or a user
    model)."""
    return None if is_user_model(arch) else builtin(arch).check_input(tuple(input_shape))


def model_record(spec: str, params: int, arch=None) -> dict:
    """What a run records of its model: the parameter count, the engine that
    trained it, and for a user model its source file and that file's SHA-256
    (a resume with a changed file is refused)."""
    source = model_source(spec)
    net = builtin(arch) if isinstance(arch, str) else arch
    return {"model_parameters": int(params), "model_engine": getattr(net, "engine_label", None),
            "model_source": source, "model_source_sha256": file_sha256(source) if source else None}


def make_net(spec: str, input_shape: tuple[int, ...], num_classes: int, engine: str = "auto",
             device: str = "cpu", seed: int = 0, unequal: bool = False) -> tuple[BuiltinModel | ModuleNet, str]:
    """What the engine trains for a run's ``model`` and ``engine``
    (:class:`fedclust.engine.net.Net`): a built-in model (its own batched
    paths) unless ``engine=loop`` is asked for it; a
    :class:`~fedclust.engine.module_net.ModuleNet` for a user model.
    Returns it with a one-line account of the choice ("" for a built-in).
    ``device`` is the resolved one (cpu or cuda)."""
    if not is_user_model(spec) and engine != "loop":
        return builtin(spec), ""
    with torch.random.fork_rng(devices=[]):   # buffers made at random are the same on every rank
        torch.manual_seed(seed)
        module = build_model(spec, input_shape, num_classes)
    check_module(spec, module, input_shape, num_classes)
    asked = engine
    why = f"as asked (engine={engine})"
    if engine == "auto":
        engine, why = auto_engine(module, device, unequal)
    net = ModuleNet(module, engine, name=spec)
    if net.engine == "batched":
        failed = check_vmap(spec, net, input_shape)
        if failed and asked == "batched":
            raise ConfigError("engine", "batched", f"model {spec} cannot be batched with torch.func.vmap "
                              f"({failed}); use engine=loop or engine=auto")
        if failed:
            net = ModuleNet(module, "loop", name=spec)
            why = f"torch.func.vmap cannot batch it ({failed})"
    return net, f"model {spec}: engine={net.engine}, {why}"


def initial_weights(arch: str, input_shape, num_classes: int, seed: int):
    """``(layout, w [P])``: the model's default init under ``seed`` (CPU
    generator, identical on every rank), flat.  The common w0 of all clients
    (seed = run seed) and IFCA's further cluster inits."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build_model(arch, input_shape, num_classes)
    layout = ParamLayout.from_module(module)
    return layout, layout.flatten(module).detach().clone()
