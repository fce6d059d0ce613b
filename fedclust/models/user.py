"""Your own model: ``model=FILE.py:NAME`` or ``model=package.module:NAME``,
``NAME(input_shape, num_classes)`` returning an ``nn.Module``.  Importing
it, refusing what the engine would train wrongly (:func:`check_module`),
and choosing how it trains (:func:`auto_engine`, :func:`check_vmap`)."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import torch
from torch import nn

from fedclust.engine.module_net import ModuleNet
from fedclust.errors import ConfigError
from fedclust.importing import import_target


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
    """The SHA-256 of a file, read in 1 MiB chunks (a data file of hundreds of MB is never in memory whole:
    473 MB hash in 0.4 s on the 2-core CPU, as long as numpy takes to load them)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def folder_sha256(path: str) -> str:
    """The SHA-256 of a folder's files (a data set given as a folder: LEAF's train/ and test/, a saved Hugging
    Face data set): of each regular file's path relative to the folder and its :func:`file_sha256`, in sorted
    order, so that a file changed, added, removed or renamed anywhere under it changes the digest."""
    root = Path(path)
    h = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{file.relative_to(root).as_posix()}\0{file_sha256(str(file))}\n".encode())
    return h.hexdigest()


# ----------------------------------------------------------------------------
# What a resume is tied to: the model's definition and shapes, not every byte of its file

def _bound(stmt: ast.stmt) -> set[str]:
    """The module-level names a top-level statement binds: a def's or class's name, an assignment's or
    import's targets; for a compound statement (if, try, with, for) every name bound anywhere in it."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    out: set[str] = set()
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def _without_docstrings(stmt: ast.stmt) -> ast.stmt:
    """A copy of ``stmt`` with the docstrings of every def and class in it left out."""
    import copy

    stmt = copy.deepcopy(stmt)
    for node in ast.walk(stmt):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return stmt


def definition(source: str, name: str) -> list[str]:
    """The definition of ``name`` in the module file ``source``, as what a run's results depend on: the
    top-level statements that bind ``name`` and, transitively, every module-level name they use (the classes
    and functions it builds or calls, its base classes, constants, imports), each as ``ast.dump`` without
    docstrings, sorted.  Comments, docstrings, layout, the order of definitions and every statement the
    model does not reach (another class, a script block) do not count.  A file Python cannot parse, or one where
    nothing at the top level binds ``name``, counts whole (its bytes' SHA-256)."""
    try:
        tree = ast.parse(Path(source).read_text(encoding="utf-8"), filename=source)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return [file_sha256(source)]
    binders: dict[str, list[int]] = {}
    for i, stmt in enumerate(tree.body):
        for bound in _bound(stmt):
            binders.setdefault(bound, []).append(i)
    if name not in binders:
        return [file_sha256(source)]
    keep: set[int] = set()
    todo, seen = [name], {name}
    while todo:
        for i in binders.get(todo.pop(), []):
            if i in keep:
                continue
            keep.add(i)
            for node in ast.walk(tree.body[i]):
                if isinstance(node, ast.Name) and node.id in binders and node.id not in seen:
                    seen.add(node.id)
                    todo.append(node.id)
    return sorted(ast.dump(_without_docstrings(tree.body[i])) for i in keep)


def source_file(spec: str) -> Path | None:
    """The file a ``FILE.py:NAME`` spec names, resolved as a run resolves it (from the working directory), without
    importing anything; None for a built-in or a ``package.module:NAME`` spec (Python finds that one)."""
    if not is_user_model(spec):
        return None
    target = str(spec).rpartition(":")[0]
    return Path(target).expanduser().resolve() if target.endswith(".py") else None


def definition_sha256(source: str | Path, name: str) -> str:
    """The SHA-256 of :func:`definition` (what a model's results depend on in its file), read from the file's text
    alone: the part of :func:`model_fingerprint` that can be checked before the file is imported."""
    return hashlib.sha256(json.dumps(definition(str(source), name)).encode()).hexdigest()


def model_fingerprint(spec: str, input_shape: tuple[int, ...], num_classes: int) -> str:
    """The SHA-256 of what a user model's results depend on: its :func:`definition` in its file, and the names
    and shapes of the parameters and buffers of the module ``NAME(input_shape, num_classes)`` builds.  A
    checkpoint keeps it, and a resume compares it instead of the file's bytes: an edit elsewhere in the file
    (another class, a comment) leaves it as it was, an edit of the model (its class, what it uses, its shapes)
    changes it.  Files the model file imports are not read (neither was their content hashed before)."""
    name = str(spec).rpartition(":")[2]
    source = model_source(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        module = build_user(spec, input_shape, num_classes)
    record = {"name": name,
              "definition": definition(source, name) if source else [],
              "parameters": [[n, list(p.shape)] for n, p in module.named_parameters()],
              "buffers": [[n, list(b.shape)] for n, b in module.named_buffers()]}
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def build_user(spec: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
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
    # track_running_stats=False (checked below): no statistics kept, but each batch normalized by its own
    (nn.modules.dropout._DropoutNd, "draws random masks that would not be keyed on (seed, round, client), so "
     "runs could not be repeated or resumed exactly", "p=0, or leave it out"),
)


def check_module(spec: str, module: nn.Module, input_shape: tuple[int, ...], num_classes: int) -> None:
    """Refuse, before anything starts, a module the engine would train
    wrongly: BatchNorm (running statistics), dropout with p > 0, frozen
    parameters, a forward that changes a buffer, or one that does not map
    a batch of ``input_shape`` to ``[batch, num_classes]`` logits."""
    for path, sub in module.named_modules():
        if isinstance(sub, nn.modules.batchnorm._BatchNorm) and not sub.track_running_stats:
            raise ConfigError("model", spec, f"its module '{path or 'model'}' ({type(sub).__name__} with "
                              "track_running_stats off) normalizes each batch by that batch's own statistics, so "
                              "a client's outputs would depend on which of its examples share a batch (evaluation "
                              "and losses go in chunks sized from memory); use nn.GroupNorm(groups, channels) or "
                              "nn.LayerNorm")
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
    probe = torch.randn((2,) + tuple(input_shape), generator=torch.Generator().manual_seed(0))
    module.train()
    with torch.no_grad():
        again = [module(probe) for _ in range(2)]
    if not torch.equal(again[0], again[1]):
        raise ConfigError("model", spec, "its forward draws random numbers (two calls on the same inputs give "
                          "different outputs: F.dropout, noise), which would not be keyed on (seed, round, client), "
                          "so runs could not be repeated or resumed exactly; remove them (dropout p=0)")


def auto_engine(module: nn.Module, device: str, unequal: bool = False) -> tuple[str, str]:
    """(engine, why) for ``engine=auto``: one client after another on a CPU
    for a module with convolutions (``vmap`` of a convolution measured slower
    there than the per-client loop: ``fedclust bench --user-models``,
    docs/algorithms.md "Models") or for clients holding different numbers of
    examples (``unequal``: the batched engine pads every client to the
    largest, measured 8x slower than the loop on 16 clients of 2 to 1,200
    examples), else batched; :func:`make_net` also takes the loop where
    ``torch.func.vmap`` cannot batch the module."""
    convs = [type(m).__name__ for m in module.modules() if isinstance(m, nn.modules.conv._ConvNd)]
    if convs and device == "cpu":
        return "loop", (f"it has convolutions ({convs[0]}), which train slower batched than one client after "
                        "another on a CPU; engine=batched overrides")
    if unequal and device == "cpu":
        return "loop", ("the clients hold different numbers of examples, and the batched engine pads each to the "
                        "largest, slower than one client after another on a CPU; engine=batched overrides")
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
