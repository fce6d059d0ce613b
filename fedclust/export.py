"""Models you can take away (docs/own-model-and-data.md, "Taking the models away"):

- :func:`export_run` (``fedclust export RUN_DIR OUT_DIR``): each client's model from the run's newest checkpoint
  (verified as a resume verifies it) in ``models.safetensors``, each parameter stacked over clients
  (``[n, *shape]``, float32, named as the module names it); where the method keeps models of its own (IFCA's,
  FedGroup's and CFL's cluster models, DFCA's, Facade's and FedSPD's banks) those in ``method_models.safetensors``,
  flat rows in the model's parameter order (the manifest gives names and shapes); and ``manifest.json``: the model
  (name, source file and its SHA-256, input shape, classes, parameters), the input normalisation, each client's
  true cluster, found cluster and neighbour list, the round, the algorithm, the seed.
- :func:`load_client_model` (``fedclust.load_client_model``): a ready ``nn.Module`` of one client, from a run
  directory or an export, in eval mode.
- :func:`evaluate_run` (``fedclust evaluate RUN_DIR [--data FILE] [--json]``): every client's model on the run's
  own test data (then the accuracies are the run's ``client_accuracy`` of that round, to its 2 decimals) or on a
  file of new test data in the natural form (``x_test``, ``y_test``, ``client_test``), normalised as the run's
  inputs were.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from fedclust import checkpoint
from fedclust.config import load_algorithms
from fedclust.data import dataset, load_federated
from fedclust.data.base import PoolDataSet
from fedclust.data.sets.npz import by_client
from fedclust.engine.train import evaluate
from fedclust.errors import DataError, OutputError
from fedclust.evaluation import best_validation
from fedclust.models import build_model, file_sha256, initial_weights, make_net, model_source, model_spec
from fedclust.schema import Config, parse

FORMAT = "fedclust-export-1"
MANIFEST = "manifest.json"
MODELS = "models.safetensors"
METHOD_MODELS = "method_models.safetensors"
BEST_MODELS = "best_validation_models.safetensors"


def _run_config(raw: dict) -> Config:
    load_algorithms(raw)
    return parse(raw)


def read_run(run_dir: str | Path) -> tuple[Config, dict, Path]:
    """``(config, checkpoint payload, its path)`` of a run directory's newest checkpoint that reads back whole."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise OutputError(f"{run_dir} is not a directory: give a run directory (the out= of a run)")
    found = checkpoint.newest(run_dir)
    if found is None:
        raise OutputError(f"{run_dir} holds no checkpoint that reads back whole ({checkpoint.directory(run_dir)}): "
                          "run it (or run it again) to write one")
    path, payload = found
    return _run_config(payload["config"]), payload, path


def _model_facts(cfg) -> tuple[str, tuple[int, ...], int]:
    try:
        return model_spec(cfg)
    except (OSError, DataError) as exc:
        raise DataError(f"the run's data ({cfg.data.name}) is needed to know its inputs and is not readable: {exc}; "
                        "give the data back at its path (data.root / data.path)") from None


def _layout(cfg):
    arch, shape, classes = _model_facts(cfg)
    return initial_weights(arch, shape, classes, cfg.seed)[0], arch, shape, classes


def _normalization(cfg) -> dict | None:
    """What the run did to its inputs (a pool data set's normalisation); None: a data set that makes its own
    inputs (Synthetic, a plug-in's) records none."""

    ds = dataset(cfg.data)
    if not isinstance(ds, PoolDataSet):
        return None
    try:
        mean, std = ds.normalization(cfg.data)
    except (OSError, DataError) as exc:
        raise DataError(f"the run's data is needed for its input normalisation: {exc}") from None
    return {"mean": [float(m) for m in mean], "std": [float(s) for s in std], "scale": ds.scale,
            "rule": "x / scale (when scale is not null), minus mean, divided by std; per channel of [C, H, W] "
                    "inputs, else one mean and std"}


def _best_rounds(payload: dict) -> list[int] | None:
    """Each client's best-validation round as of the checkpoint (None without ``data.validation``)."""
    if payload.get("best_models") is None:
        return None
    return best_validation(payload.get("history") or []).get("best_validation_rounds")


def _lists(payload: dict, n: int) -> list[list[int] | None]:
    lists = payload.get("final_lists")
    if lists is None:
        return [None] * n
    arr = np.asarray(lists)
    return [[int(j) for j in row if j >= 0] for row in arr]


def _state_models(payload: dict, P: int) -> dict[str, torch.Tensor]:
    """The method's own models: every tensor of its saved state whose last dimension is P (a flat model)."""
    out = {}
    algo = payload.get("algorithm") or {}
    for part in ("clients", "server"):
        for name, value in (algo.get(part) or {}).items():
            if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[-1] == P \
                    and value.is_floating_point():
                out[f"{part}.{name}"] = value.detach().to(torch.float32).contiguous()
    return out


def _stacked(layout, rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Flat rows ``[n, P]`` as each parameter stacked over clients, ``[n, *shape]`` (safetensors stores each
    tensor whole, so each view is copied out)."""
    return {name: view.contiguous() for name, view in layout.views(rows).items()}


def export_run(run_dir: str | Path, out_dir: str | Path) -> dict:
    """Write ``models.safetensors``, ``method_models.safetensors`` (where the method keeps models of its own) and
    ``manifest.json`` into ``out_dir``; returns the manifest."""

    cfg, payload, path = read_run(run_dir)
    layout, arch, shape, classes = _layout(cfg)
    weights = payload["weights"].to(torch.float32)
    n, P = weights.shape
    if P != layout.numel:
        raise OutputError(f"{run_dir}: its checkpoint holds models of {P} numbers, the model {arch} has "
                          f"{layout.numel} parameters: the model's definition changed since the run")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(_stacked(layout, weights), str(out / MODELS),
              metadata={"format": FORMAT, "layout": "parameter -> [clients, *shape]"})
    best = payload.get("best_models")
    if best is not None:   # data.validation: each client's model at its best-validation round
        save_file(_stacked(layout, best.to(torch.float32)), str(out / BEST_MODELS),
                  metadata={"format": FORMAT, "layout": "parameter -> [clients, *shape]"})
    own = _state_models(payload, P)
    if own:
        save_file(own, str(out / METHOD_MODELS), metadata={"format": FORMAT, "layout": "flat rows [..., P]"})
    saved = payload.get("saved") or {}
    truth = saved.get("clusters")
    truth = None if truth is None else [int(c) for c in np.asarray(truth)]
    found = payload.get("final_assignment")
    found = None if found is None else [int(c) for c in torch.as_tensor(found).tolist()]
    lists = _lists(payload, n)
    source = model_source(arch)
    manifest = {
        "format": FORMAT,
        "run_dir": str(Path(run_dir)),
        "checkpoint": path.name,
        "round": int(payload["round"]),
        "complete": bool(payload.get("complete", False)),
        "algorithm": cfg.algorithm.name,
        "seed": cfg.seed,
        "clients": n,
        "model": {"spec": arch, "source": source, "source_sha256": file_sha256(source) if source else None,
                  "input_shape": list(shape), "num_classes": classes, "parameters": layout.numel,
                  "tensors": [{"name": k, "shape": list(s)} for k, s in zip(layout.names, layout.shapes)]},
        "normalization": _normalization(cfg),
        "data": {"name": cfg.data.name, "path": cfg.data.path or None, "clusters": cfg.data.clusters},
        "files": {"models": MODELS, "method_models": METHOD_MODELS if own else None,
                  "best_validation_models": BEST_MODELS if best is not None else None},
        "best_validation_rounds": _best_rounds(payload),
        "method_models": {k: list(v.shape) for k, v in own.items()},
        "client": [{"id": i, "true_cluster": None if truth is None else truth[i],
                    "found_cluster": None if found is None or len(found) != n else found[i],
                    "neighbors": lists[i]} for i in range(n)],
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def load_client_model(path: str | Path, client: int, best: bool = False) -> torch.nn.Module:
    """Client ``client``'s model as a ready ``nn.Module`` (eval mode, on the CPU): from an export directory
    (``manifest.json`` + ``models.safetensors``) or from a run directory (its newest checkpoint).  A user model
    is built from its ``FILE.py:NAME`` / ``module:NAME``, which must still be importable."""
    path = Path(path)
    if (path / MANIFEST).is_file():

        manifest = json.loads((path / MANIFEST).read_text())
        n = int(manifest["clients"])
        _check_client(client, n)
        spec = manifest["model"]["spec"]
        module = _built(spec, tuple(manifest["model"]["input_shape"]), int(manifest["model"]["num_classes"]),
                        int(manifest["seed"]))
        key = "best_validation_models" if best else "models"
        if not manifest["files"].get(key):
            raise OutputError(f"{path}: no best-validation models (the run had no data.validation)")
        stacked = load_file(str(path / manifest["files"][key]))
        state = {name: stacked[name][client] for name in stacked}
    else:
        cfg, payload, _ = read_run(path)
        layout, arch, shape, classes = _layout(cfg)
        weights = payload.get("best_models") if best else payload["weights"]
        if weights is None:
            raise OutputError(f"{path}: no best-validation models (the run had no data.validation)")
        weights = weights.to(torch.float32)
        _check_client(client, weights.shape[0])
        module = _built(arch, shape, classes, cfg.seed)
        state = layout.views(weights[client])
    missing = module.load_state_dict({k: v.clone() for k, v in state.items()}, strict=False)
    if missing.missing_keys and any(k in dict(module.named_parameters()) for k in missing.missing_keys):
        raise OutputError(f"{path}: the saved model lacks parameters {missing.missing_keys}: the model's "
                          "definition changed since the run")
    return module.eval()


def _built(spec: str, shape, classes: int, seed: int) -> torch.nn.Module:
    """The module as the run built it: under its seed, so buffers made at random are the run's."""

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_model(spec, tuple(shape), classes)


def _check_client(client: int, n: int) -> None:
    if not 0 <= int(client) < n:
        raise OutputError(f"client {client}: the run has clients 0..{n - 1}")


def evaluate_run(run_dir: str | Path, data: str | Path | None = None) -> dict:
    """``{"accuracy": mean percent, "client_accuracy": [percent per client], "round": r, "data": ...}`` of the
    run's newest checkpoint: on the run's own test data, or on ``data`` (a natural-form file of test examples,
    client ids of the run)."""

    cfg, payload, _ = read_run(run_dir)
    layout, arch, shape, classes = _layout(cfg)
    weights = payload["weights"].to(torch.float32)
    n = weights.shape[0]
    fed = load_federated(cfg.data, n, cfg.seed, list(range(n)), device=torch.device("cpu"))
    # the engine the run chose on a CPU (auto: the loop for clients of unequal sizes)
    net, _ = make_net(arch, shape, classes, cfg.engine, "cpu", cfg.seed, unequal=fed.train_counts is not None)
    if data is None:
        x, y, counts = fed.test_x, fed.test_y, fed.test_counts
        where = "the run's own test data"
    else:
        ds = dataset(cfg.data)
        if not isinstance(ds, PoolDataSet):
            raise DataError(f"--data {data}: the run's data set {cfg.data.name} makes its own inputs, so new data "
                            "cannot be normalised as the run's: evaluate on the run's own data")
        x, y, counts = _natural_test(Path(data), ds, cfg.data, n, shape, classes)
        where = str(data)
    acc, _ = evaluate(weights, layout, net, x, y, counts=counts)
    per = [round(100.0 * float(a), 2) for a in acc]
    return {"accuracy": 100.0 * float(acc.double().mean()), "client_accuracy": per, "round": int(payload["round"]),
            "data": where}


def _natural_test(path: Path, ds: PoolDataSet, data_cfg, n: int, shape: tuple[int, ...], classes: int):
    """``(x [n, W, *shape], y [n, W], counts [n] | None)`` of a natural-form file's test examples, normalised as
    the run's inputs; every client of the run must have at least one."""
    try:
        with np.load(path) as f:
            arrays = {k: f[k] for k in f.files}
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as an .npz file ({exc})") from None
    missing = [k for k in ("x_test", "y_test", "client_test") if k not in arrays]
    if missing:
        raise DataError(f"{path}: no {', '.join(missing)}: --data takes a file of test examples in the natural "
                        "form (x_test, y_test, client_test: the client id of every example)")
    x = torch.as_tensor(arrays["x_test"])
    y = torch.as_tensor(arrays["y_test"]).to(torch.int64)
    owner = torch.as_tensor(arrays["client_test"]).to(torch.int64)
    if tuple(x.shape[1:]) != tuple(shape):
        raise DataError(f"{path}: x_test's examples have shape {list(x.shape[1:])}, the run's model takes "
                        f"{list(shape)}")
    if len(y) != len(x) or len(owner) != len(x):
        raise DataError(f"{path}: x_test, y_test and client_test must have one entry per example")
    if len(owner) and (int(owner.min()) < 0 or int(owner.max()) >= n):
        raise DataError(f"{path}: client_test holds ids outside the run's clients 0..{n - 1}")
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= classes):
        raise DataError(f"{path}: y_test holds labels outside the run's classes 0..{classes - 1}")
    count = torch.bincount(owner, minlength=n)
    if bool((count == 0).any()):
        raise DataError(f"{path}: clients {(count == 0).nonzero().flatten().tolist()[:10]} have no test example; "
                        "give every client of the run at least one")
    return by_client(x, y, owner, n, torch.arange(n), lambda v: ds.normalize(data_cfg, v))
