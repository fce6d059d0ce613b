"""The models of docs/algorithms.md, as plain ``nn.Module``s.

These modules are the reference: the vectorized engine
(:mod:`fedclust.engine.functional`) reproduces their forward pass on a flat
parameter buffer, and :mod:`fedclust.bench.reference` trains them one
client at a time with ``torch.optim.SGD``.

- ``logreg`` (Synthetic): multinomial logistic regression, Flatten,
  Linear(in, classes), as FedProx (its ``mclr`` model) and FPFC train it;
  the engine treats it as an MLP with no hidden layer.
- ``mlp`` (MNIST, Fashion-MNIST): Flatten, Linear(in, 200), ReLU,
  Linear(200, 200), ReLU, Linear(200, classes).
- ``cnn`` (CIFAR-10): Conv(3→32, 3), ReLU, MaxPool 2, Conv(32→64, 3), ReLU,
  MaxPool 2, Conv(64→64, 3), ReLU, Flatten, FC(1024→64), ReLU, FC(64→classes).
  On 32x32 inputs the sides go 30→15→13→6→4, so FC1 has 64·4·4 = 1024 inputs.

Parameter names (``fc1.weight``, ``conv2.bias``, ...) are the keys of the
functional forward's parameter dict.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import torch
from torch import nn
import torch.nn.functional as F

from fedclust.data import registry as data_registry
from fedclust.engine.layout import ParamLayout
from fedclust.engine.module_net import ModuleNet
from fedclust.errors import ConfigError
from fedclust.importing import import_target

ARCHS = ("logreg", "mlp", "cnn")


class MLP(nn.Module):
    """MLP in-200-200-classes with ReLU (docs/algorithms.md)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 200):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.flatten(x, 1)
        h = F.relu(self.fc1(h))
        h = F.relu(self.fc2(h))
        return self.fc3(h)


class LogReg(nn.Module):
    """Multinomial logistic regression in-classes (docs/algorithms.md, Synthetic)."""

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc1(torch.flatten(x, 1))


class CNN(nn.Module):
    """CIFAR-10 CNN of PANM paper §4.2 (docs/algorithms.md)."""

    def __init__(self, in_channels: int, height: int, width: int, num_classes: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.conv3 = nn.Conv2d(64, 64, 3)
        self.fc1 = nn.Linear(64 * cnn_side(height) * cnn_side(width), 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.max_pool2d(F.relu(self.conv1(x)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        h = F.relu(self.conv3(h))
        h = F.relu(self.fc1(torch.flatten(h, 1)))
        return self.fc2(h)


def cnn_side(side: int) -> int:
    """Side length after conv3-pool2-conv3-pool2-conv3 (32 -> 4)."""
    return ((side - 2) // 2 - 2) // 2 - 2


def build_model(arch: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The reference module of ``arch`` for inputs of ``input_shape`` (one
    sample, no batch dimension): (1, 28, 28), (3, 32, 32) or (d,).  ``arch`` is
    a built-in name or a user model ``FILE.py:NAME`` / ``package.module:NAME``
    (:func:`user_factory`)."""
    input_shape = tuple(int(s) for s in input_shape)
    if num_classes < 2:
        raise ValueError(f"num_classes = {num_classes}: a classifier needs at least 2 classes")
    if is_user_model(arch):
        return _build_user(arch, input_shape, num_classes)
    if arch == "logreg":
        return LogReg(math.prod(input_shape), num_classes)
    if arch == "mlp":
        return MLP(math.prod(input_shape), num_classes)
    if arch == "cnn":
        if len(input_shape) != 3 or min(cnn_side(s) for s in input_shape[1:]) < 1:
            raise ConfigError(
                "model", arch,
                f"the cnn needs image inputs (channels, height, width) of at least 18x18, got {input_shape}; "
                "use model: mlp for this data set")
        c, h, w = input_shape
        return CNN(c, h, w, num_classes)
    raise ConfigError("model", arch, f"choose one of {', '.join(ARCHS)} (or 'auto'), or your own module as "
                      "FILE.py:NAME or package.module:NAME")


# ----------------------------------------------------------------------------
# Your own model: model=FILE.py:NAME or model=package.module:NAME

def is_user_model(spec: str) -> bool:
    """Whether ``spec`` names a user's model (``...:NAME``) rather than a built-in."""
    return ":" in str(spec)


def _import_target(target: str):
    """The module a spec's part before ':' names (a ``.py`` file or an importable module)."""
    return import_target(target, "model", "give model=FILE.py:NAME (FILE.py a path relative to where you run "
                         "fedclust, or absolute) or model=package.module:NAME with an importable module")


def user_factory(spec: str):
    """The callable a user model spec names: ``NAME(input_shape, num_classes)``
    returns an ``nn.Module`` (a class with that constructor is such a callable)."""
    target, _, name = str(spec).rpartition(":")
    if not target or not name.isidentifier():
        raise ConfigError("model", spec, "write your own model as FILE.py:NAME or package.module:NAME, NAME a "
                          "callable taking (input_shape, num_classes) and returning a torch.nn.Module")
    module = _import_target(target)
    factory = getattr(module, name, None)
    if not callable(factory):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise ConfigError("model", spec, f"{target} has no callable '{name}'"
                          + (f" (it defines: {', '.join(found)})" if found else ""))
    return factory


def model_source(spec: str) -> str | None:
    """The file a user model is defined in (None for the built-ins)."""
    if not is_user_model(spec):
        return None
    target = str(spec).rpartition(":")[0]
    if target.endswith(".py"):
        return str(Path(target).expanduser().resolve())
    path = getattr(_import_target(target), "__file__", None)
    return str(Path(path).resolve()) if path else None


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def model_record(spec: str, params: int, arch=None) -> dict:
    """What a run records of its model: the parameter count, the engine that
    trained it, and for a user model its source file and that file's SHA-256
    (a resume with a changed file is refused)."""
    source = model_source(spec)
    engine = getattr(arch, "engine", None) or ("hand-written" if isinstance(arch, str) else None)
    return {"model_parameters": int(params), "model_engine": engine, "model_source": source,
            "model_source_sha256": file_sha256(source) if source else None}


def _build_user(spec: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    try:
        module = user_factory(spec)(tuple(input_shape), int(num_classes))
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError("model", spec, f"NAME{tuple(input_shape), int(num_classes)} raised {type(exc).__name__}: "
                          f"{exc}; make it take this data set's input_shape and num_classes, or choose another "
                          "model") from None
    if not isinstance(module, nn.Module):
        raise ConfigError("model", spec, f"NAME(input_shape, num_classes) must return a torch.nn.Module, got "
                          f"{type(module).__name__}")
    return module


# Modules whose training the engine cannot reproduce per client: (types, why, what to use instead).
_REFUSED = (
    (nn.modules.batchnorm._BatchNorm, "keeps running statistics that every client would have to hold and update "
     "itself", "nn.GroupNorm(groups, channels) or nn.LayerNorm"),
    (nn.modules.dropout._DropoutNd, "draws random masks that would not be keyed on (seed, round, client), so "
     "runs could not be repeated or resumed exactly", "p=0, or leave it out"),
)


def check_module(spec: str, module: nn.Module, input_shape: tuple[int, ...], num_classes: int) -> None:
    """Refuse, before anything starts, a module the engine would train
    wrongly: BatchNorm (running statistics), dropout with p > 0, frozen
    parameters, a forward that changes a buffer, or one that does not map
    a batch of ``input_shape`` to ``[batch, num_classes]`` logits."""
    for path, sub in module.named_modules():
        for types, why, instead in _REFUSED:
            if isinstance(sub, types) and not (isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p == 0):
                raise ConfigError("model", spec, f"its module '{path or 'model'}' ({type(sub).__name__}) {why}; "
                                  f"use {instead}")
    params = list(module.named_parameters())
    if not params:
        raise ConfigError("model", spec, "the module has no parameters to train")
    frozen = [n for n, p in params if not p.requires_grad]
    if frozen:
        raise ConfigError("model", spec, f"parameter '{frozen[0]}' does not require grad: fedclust trains every "
                          "parameter; register a fixed tensor as a buffer (module.register_buffer) instead")
    if len({p.dtype for _, p in params}) != 1 or params[0][1].dtype != torch.float32:
        raise ConfigError("model", spec, "every parameter must be float32 (the engine stacks them in one float32 "
                          "buffer); leave the module's dtype at its default")
    before = {n: b.clone() for n, b in module.named_buffers()}
    x = torch.zeros((2,) + tuple(input_shape))
    try:
        out = module(x)
    except Exception as exc:
        raise ConfigError("model", spec, f"its forward fails on a batch of inputs of shape (2, "
                          f"{', '.join(map(str, input_shape))}) ({type(exc).__name__}: {exc}); make the module take "
                          "the data set's input shape (passed to NAME as input_shape)") from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError("model", spec, f"its forward must return logits [batch, {num_classes}] for a batch of "
                          f"shape (2, {', '.join(map(str, input_shape))}), got {got}")
    for n, b in module.named_buffers():
        if not torch.equal(before[n], b):
            raise ConfigError("model", spec, f"its forward changes buffer '{n}': fedclust gives every client the "
                              "same buffers and keeps only parameters per client; compute it in forward instead")


def auto_engine(module: nn.Module, device: str) -> tuple[str, str]:
    """(engine, why) for ``engine=auto``: one client after another on a CPU
    for a module with convolutions (``vmap`` of a convolution measured slower
    there than the per-client loop: ``fedclust bench --user-models``,
    docs/algorithms.md "Models"), else batched; :func:`make_net` also takes
    the loop where ``torch.func.vmap`` cannot batch the module."""
    convs = [type(m).__name__ for m in module.modules() if isinstance(m, nn.modules.conv._ConvNd)]
    if convs and device == "cpu":
        return "loop", (f"it has convolutions ({convs[0]}), which train slower batched than one client after "
                        "another on a CPU; engine=batched overrides")
    return "batched", "engine=loop trains one client after another instead"


def check_vmap(spec: str, net: ModuleNet, input_shape: tuple[int, ...]) -> str | None:
    """None when the batched forward of ``net`` works on 2 clients x 2 inputs,
    else why not (a random operation in forward, an operation vmap lacks)."""
    params = {n: p.detach().unsqueeze(0).expand(2, *p.shape) for n, p in net.module.named_parameters()}
    try:
        net._vmapped(params, torch.zeros((2, 2) + tuple(input_shape)))
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def make_net(spec: str, input_shape: tuple[int, ...], num_classes: int, engine: str = "auto",
             device: str = "cpu", seed: int = 0) -> tuple[str | ModuleNet, str]:
    """What the engine trains for a run's ``model`` and ``engine``: a
    built-in's name (its hand-written paths) unless ``engine=loop`` is asked
    for it; a :class:`~fedclust.engine.module_net.ModuleNet` for a user model.
    Returns it with a one-line account of the choice ("" for a built-in).
    ``device`` is the resolved one (cpu or cuda)."""
    if not is_user_model(spec) and engine != "loop":
        return spec, ""
    with torch.random.fork_rng(devices=[]):   # buffers made at random are the same on every rank
        torch.manual_seed(seed)
        module = build_model(spec, input_shape, num_classes)
    check_module(spec, module, input_shape, num_classes)
    asked = engine
    why = f"as asked (engine={engine})"
    if engine == "auto":
        engine, why = auto_engine(module, device)
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


def default_arch(data_name: str) -> str:
    """The model a data set declares for model=auto (docs/algorithms.md: cnn for cifar10, logreg for
    synthetic, mlp for the others); mlp for a name no registered data set has (a report of a plugin's runs)."""
    ds = data_registry.find(data_name)
    return ds.default_model if ds is not None else "mlp"


def model_spec(cfg) -> tuple[str, tuple[int, ...], int]:
    """(architecture, input shape of one sample, classes) of a run's model, as its data set declares them."""
    ds = data_registry.get(cfg.data.name)
    return model_name(cfg), tuple(ds.input_shape(cfg.data)), int(ds.num_classes(cfg.data))


def model_name(cfg) -> str:
    """The run's model as named: ``cfg.model``, or with ``auto`` its data set's default."""
    return default_arch(cfg.data.name) if cfg.model == "auto" else cfg.model


def parameter_count(cfg) -> int:
    """P, the flat parameter count of the run's model."""
    arch, shape, classes = model_spec(cfg)
    return sum(p.numel() for p in build_model(arch, shape, classes).parameters())


def initial_weights(arch: str, input_shape, num_classes: int, seed: int):
    """``(layout, w [P])``: the model's default init under ``seed`` (CPU
    generator, identical on every rank), flat.  The common w0 of all clients
    (seed = run seed) and IFCA's further cluster inits."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = build_model(arch, input_shape, num_classes)
    layout = ParamLayout.from_module(module)
    return layout, layout.flatten(module).detach().clone()
