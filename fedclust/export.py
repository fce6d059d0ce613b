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
import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from fedclust import checkpoint, upgrade
from fedclust.algorithms import registry
from fedclust.config import load_algorithms, run_facts
from fedclust.configfile import parse
from fedclust.data import dataset, load_federated
from fedclust.data.base import PoolDataSet
from fedclust.data.drift import clusters_at
from fedclust.data.partition import label_tables, rotation_angles
from fedclust.data.sets.npz import by_client, read_new_clients, read_test_clients
from fedclust.engine.train import evaluate
from fedclust.errors import DataError, OutputError
from fedclust.evaluation import best_validation
from fedclust.models import (
    build_model,
    definition_sha256,
    file_sha256,
    is_user_model,
    make_net,
    model_fingerprint,
    model_source,
)
from fedclust.runmodel import model_spec, run_model
from fedclust.schema import CORE_KEYS, SECTIONS, Config
from fedclust.trust import check_fingerprint, check_model_file, code_in_config, require_trust

FORMAT = "fedclust-export-2"   # 2: each file's SHA-256 in the manifest, checked on load
FORMATS = ("fedclust-export-1", FORMAT)   # 1 (read with a warning): before file checksums
MANIFEST = "manifest.json"
MODELS = "models.safetensors"
METHOD_MODELS = "method_models.safetensors"
BEST_MODELS = "best_validation_models.safetensors"
MODEL_SOURCE = "model_source.py"   # a user model's file, carried so that the export loads anywhere


def _run_config(raw: dict) -> Config:
    """The config a run saved, parsed: its plugins loaded first; a section no algorithm registered here
    declares (a plug-in the writing process had loaded for another test or run) is not the run's algorithm's, so
    it is left out."""
    load_algorithms(raw)
    known = set(CORE_KEYS) | set(SECTIONS)
    return parse({k: v for k, v in raw.items() if k in known})


def read_run(run_dir: str | Path, trust_code: bool = False) -> tuple[Config, dict, Path]:
    """``(config, checkpoint payload, its path)`` of a run directory's newest checkpoint that reads back whole.
    The code its config names (plugins, a user model) is imported only with ``trust_code``, and a user model only
    when it is the run's (:mod:`fedclust.trust`); otherwise :class:`fedclust.trust.UntrustedCode` names it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise OutputError(f"{run_dir} is not a directory: give a run directory (the out= of a run)")
    found = checkpoint.newest(run_dir)
    if found is None:
        raise OutputError(f"{run_dir} holds no checkpoint that reads back whole ({checkpoint.directory(run_dir)}): "
                          "run it (or run it again) to write one")
    path, payload = found
    raw = payload["config"]
    where = f"run {run_dir} (checkpoint {path.name})"
    require_trust(where, code_in_config(raw), trust_code)
    record = (payload.get("inputs") or {}).get("model")
    if isinstance(raw.get("model"), str) and is_user_model(raw["model"]):
        check_model_file(raw["model"], record, where)           # before its file is imported
    cfg = _run_config(raw)
    if is_user_model(cfg.model):
        arch, shape, classes = _model_facts(cfg)
        check_fingerprint(arch, shape, classes, record, where)   # once built: its definition and shapes
    return cfg, payload, path


def _model_facts(cfg) -> tuple[str, tuple[int, ...], int]:
    try:
        return model_spec(cfg)
    except (OSError, DataError) as exc:
        raise DataError(f"the run's data ({cfg.data.name}) is needed to know its inputs and is not readable: {exc}; "
                        "give the data back at its path (data.root / data.path)") from None


def _layout(cfg):
    arch, shape, classes = _model_facts(cfg)
    return run_model(cfg).layout, arch, shape, classes


def _normalization(cfg) -> dict | None:
    """What the run did to its inputs (a pool data set's normalisation); None: a data set that makes its own
    inputs (Synthetic, a plug-in's) records none."""

    ds = dataset(cfg.data)
    if not isinstance(ds, PoolDataSet):
        return None
    try:
        mean, std = ds.input_normalization(cfg.data)
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


def export_run(run_dir: str | Path, out_dir: str | Path, trust_code: bool = False) -> dict:
    """Write ``models.safetensors``, ``method_models.safetensors`` (where the method keeps models of its own) and
    ``manifest.json`` into ``out_dir``; returns the manifest.  The export is written into a folder beside
    ``out_dir`` and renamed into place, the manifest last (with each file's SHA-256): a killed export leaves the
    earlier export or none.  ``out_dir`` must be absent, empty or an earlier export (:func:`_replaceable`)."""

    cfg, payload, path = read_run(run_dir, trust_code)
    layout, arch, shape, classes = _layout(cfg)
    weights = payload["weights"].to(torch.float32)
    n, P = weights.shape
    if P != layout.numel:
        raise OutputError(f"{run_dir}: its checkpoint holds models of {P} numbers, the model {arch} has "
                          f"{layout.numel} parameters: the model's definition changed since the run")
    out = Path(out_dir)
    _replaceable(out)
    tensors = {MODELS: (_stacked(layout, weights), "parameter -> [clients, *shape]")}
    best = payload.get("best_models")
    if best is not None:   # data.validation: each client's model at its best-validation round
        tensors[BEST_MODELS] = (_stacked(layout, best.to(torch.float32)), "parameter -> [clients, *shape]")
    own = _state_models(payload, P)
    if own:
        tensors[METHOD_MODELS] = (own, "flat rows [..., P]")
    manifest = _manifest(cfg, payload, path, run_dir, layout, (arch, shape, classes), n, own, best is not None)
    source = manifest["model"]["source"]

    def write(folder: Path) -> None:
        mode = 0o666 & ~_umask()
        for name, (content, form) in tensors.items():
            save_file(content, str(folder / name), metadata={"format": FORMAT, "layout": form})
            os.chmod(folder / name, mode)   # safetensors creates its files 0600; the rest of an export follows umask
        written = list(tensors)
        if source:   # the user model's file, as the run read it (checked against its record when loaded)
            (folder / MODEL_SOURCE).write_bytes(Path(source).read_bytes())
            written.append(MODEL_SOURCE)
        manifest["sha256"] = {name: file_sha256(str(folder / name)) for name in written}
        _write_synced(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")   # last: names what is whole

    _write_folder(out, write)
    return manifest


def _manifest(cfg, payload: dict, path: Path, run_dir, layout, model: tuple, n: int, own: dict,
              best: bool) -> dict:
    """The manifest of an export (every entry but the files' checksums)."""
    arch, shape, classes = model
    saved = payload.get("saved") or {}
    truth = saved.get("clusters")
    truth = None if truth is None else [int(c) for c in np.asarray(truth)]
    found = payload.get("final_assignment")
    found = None if found is None else [int(c) for c in torch.as_tensor(found).tolist()]
    lists = _lists(payload, n)
    source = model_source(arch)
    return {
        "format": FORMAT,
        "run_dir": str(Path(run_dir)),
        "checkpoint": path.name,
        "round": int(payload["round"]),
        "total_rounds": cfg.rounds,
        # whether the run had finished (its last round) when exported; a run still going is exported as it stands
        "complete": int(payload["round"]) >= cfg.rounds,
        "algorithm": cfg.algorithm.name,
        "seed": cfg.seed,
        "clients": n,
        "model": {"spec": arch, "source": source, "source_sha256": file_sha256(source) if source else None,
                  "definition_sha256": (definition_sha256(source, arch.rpartition(":")[2]) if source else None),
                  "fingerprint": model_fingerprint(arch, shape, classes) if is_user_model(arch) else None,
                  "input_shape": list(shape), "num_classes": classes, "parameters": layout.numel,
                  "tensors": [{"name": k, "shape": list(s)} for k, s in zip(layout.names, layout.shapes)]},
        "normalization": _normalization(cfg),
        "data": {"name": cfg.data.name, "path": cfg.data.path or None, "clusters": cfg.data.clusters,
                 "transforms": _transforms(cfg, classes)},
        "files": {"models": MODELS, "method_models": METHOD_MODELS if own else None,
                  "best_validation_models": BEST_MODELS if best else None,
                  "model_source": MODEL_SOURCE if source else None},
        "best_validation_rounds": _best_rounds(payload),
        "method_models": {k: list(v.shape) for k, v in own.items()},
        "client": [{"id": i, "true_cluster": None if truth is None else truth[i],
                    "found_cluster": None if found is None or len(found) != n else found[i],
                    "neighbors": lists[i]} for i in range(n)],
    }


def _transforms(cfg, classes: int) -> list[dict] | None:
    """Each true cluster's transform of a pool's examples (what new test data of that cluster needs):
    ``{"cluster": c, "rotation_degrees": a}`` (counter-clockwise) or ``{"cluster": c, "labels": [new label of each
    label]}``; None where the data takes none (a file's own clients, Synthetic, a plug-in's)."""
    if dataset(cfg.data).kind_of(cfg.data) != "pool":
        return None
    k = cfg.data.num_clusters
    if cfg.data.clusters == "rotation":
        return [{"cluster": c, "rotation_degrees": a} for c, a in enumerate(rotation_angles(k, cfg.data.rotations))]
    table = label_tables(k, classes)
    return [{"cluster": c, "labels": [int(v) for v in table[c]]} for c in range(k)]


EXPORT_FILES = (MANIFEST, MODELS, METHOD_MODELS, BEST_MODELS, MODEL_SOURCE)


def _replaceable(out: Path) -> None:
    """``out`` may take an export: absent, an empty folder, or an earlier export holding nothing but its files.
    Anything else is refused, naming up to five of its entries: an export replaces only an export."""
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputError(f"{out} is a file: give a folder for the export (OUT_DIR)")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    foreign = [e for e in entries if e not in EXPORT_FILES]
    if MANIFEST in entries and not foreign:
        return
    shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
    what = ("is not an export (no manifest.json)" if MANIFEST not in entries
            else "holds files an export does not write")
    raise OutputError(f"{out} {what}: {shown}; an export replaces only an earlier export: give another OUT_DIR (a new "
                      "or empty folder)")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass


def _write_folder(out: Path, write) -> None:
    """``write(folder)`` into a new folder beside ``out`` (made under the user's umask), then renamed to ``out``
    (an earlier export there moved aside first and removed after): a reader, or an export killed midway, sees the
    earlier folder whole, the new one whole, or none.  Folders a killed export left beside ``out`` go first."""
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(f".{out.name}.export-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = parent / f".{out.name}.export-new{os.getpid()}"
    tmp.mkdir()
    try:
        write(tmp)
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if out.exists():
            old = parent / f".{out.name}.export-old{os.getpid()}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
        _fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read_manifest(path: Path) -> dict:
    """An export's manifest, checked: a known format, file names inside the export folder."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise OutputError(f"{path / MANIFEST} cannot be read as JSON ({exc}); export the run again") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise OutputError(f"{path / MANIFEST}: format {got!r} is not a fedclust export ({', '.join(FORMATS)})")
    for key, name in (manifest.get("files") or {}).items():
        if name is not None and not _inside(path, name):
            raise OutputError(f"{path / MANIFEST}: files.{key} = {name!r} is not a file name inside the export "
                              "folder; an export names only its own files (export the run again)")
    return manifest


def _inside(folder: Path, name) -> bool:
    """Whether ``name`` is a plain file name that stays inside ``folder`` (no separator, no ``..``)."""
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or os.sep in name:
        return False
    return (folder / name).resolve().parent == folder.resolve()


def _verified(path: Path, manifest: dict, name: str) -> Path:
    """``path/name``, its SHA-256 checked against the manifest's (an export before checksums: a warning)."""
    file = path / name
    sums = manifest.get("sha256")
    if sums is None:
        warnings.warn(f"{path} is an export of an earlier fedclust ({manifest.get('format')}), without checksums: "
                      f"{name} is used unverified", stacklevel=3)
        return file
    if not file.is_file():
        raise OutputError(f"{file} is missing: the export is not whole; export the run again")
    got = file_sha256(str(file))
    if got != sums.get(name):
        raise OutputError(f"{file} is not what was exported: its SHA-256 is {got[:12]}..., the manifest records "
                          f"{str(sums.get(name))[:12]}... (the file was changed or damaged); export the run again")
    return file


def load_client_model(path: str | Path, client: int, best: bool = False, trust_code: bool = False) -> torch.nn.Module:
    """Client ``client``'s model as a ready ``nn.Module`` (eval mode, on the CPU): from an export directory
    (``manifest.json`` + ``models.safetensors``, each file checked against the manifest's SHA-256) or from a run
    directory (its newest checkpoint).  A user model is built from its ``FILE.py:NAME`` / ``module:NAME`` only with
    ``trust_code`` and when it is the run's (:mod:`fedclust.trust`)."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        manifest = _read_manifest(path)
        n = int(manifest["clients"])
        _check_client(client, n)
        model = manifest["model"]
        spec, shape, classes = model["spec"], tuple(model["input_shape"]), int(model["num_classes"])
        carried = (manifest["files"].get("model_source") if is_user_model(spec) else None)
        if carried:   # the export's own copy of the model's file: it loads wherever the export is
            spec = f"{_verified(path, manifest, carried)}:{spec.rpartition(':')[2]}"
        if is_user_model(spec):
            where = f"export {path}"
            require_trust(where, [("model", spec)], trust_code)
            record = {"sha256": model.get("source_sha256"), "definition_sha256": model.get("definition_sha256"),
                      "fingerprint": model.get("fingerprint")}
            check_model_file(spec, record, where)
            check_fingerprint(spec, shape, classes, record, where)
        module = _built(spec, shape, classes, int(manifest["seed"]))
        key = "best_validation_models" if best else "models"
        if not manifest["files"].get(key):
            raise OutputError(f"{path}: no best-validation models (the run had no data.validation)")
        stacked = load_file(str(_verified(path, manifest, manifest["files"][key])))
        state = {name: stacked[name][client] for name in stacked}
    else:
        cfg, payload, _ = read_run(path, trust_code)
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


def evaluate_run(run_dir: str | Path, data: str | Path | None = None, trust_code: bool = False,
                 best: bool = False, warn=None) -> dict:
    """``{"accuracy": mean percent, "client_accuracy": [percent per client], "round": r, "data": ...}`` of the
    run's newest checkpoint: on the run's own test data, or on ``data`` (a natural-form file of test examples,
    client ids of the run; ``warn`` is told in one line when its inputs' range is not the run's raw range).
    ``best``: each client's best-validation model (``data.validation``) instead of its last.  ``trust_code``:
    as :func:`read_run`."""

    cfg, payload, _ = read_run(run_dir, trust_code)
    layout, arch, shape, classes = _layout(cfg)
    weights = payload.get("best_models") if best else payload["weights"]
    if weights is None:
        raise OutputError(f"{run_dir}: no best-validation models (the run had no data.validation); evaluate "
                          "without --best")
    weights = weights.to(torch.float32)
    n = weights.shape[0]
    # with drift (data.drift_round), the test data of the checkpoint's round: each client under its cluster then
    held = clusters_at(cfg.data, n, cfg.seed, int(payload["round"]))
    fed = load_federated(cfg.data, n, cfg.seed, list(range(n)), device=torch.device("cpu"), held=held)
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
        x, y, counts = _natural_test(Path(data), ds, cfg.data, n, shape, classes, warn)
        where = str(data)
    acc, _ = evaluate(weights, layout, net, x, y, counts=counts)
    per = [round(100.0 * float(a), 2) for a in acc]
    return {"accuracy": 100.0 * float(acc.double().mean()), "client_accuracy": per, "round": int(payload["round"]),
            "data": where, "models": "best-validation" if best else "last"}


def evaluate_unseen(run_dir: str | Path, data: str | Path, trust_code: bool = False, warn=None) -> dict:
    """FLUX's unseen-client protocol (``fedclust evaluate RUN --data FILE --unseen``): each client of ``data`` (the
    natural form's test arrays, any client ids: clients the run never saw) takes, of the models the method offers
    a new client (:meth:`fedclust.algorithms.base.Algorithm.unseen_candidates`: its cluster models, banks or
    heads; a peer method's client models), the one of lowest mean loss on the first half of its examples (its
    first ``floor(N / 2)`` in the file's order; the first of ties), and is scored on the rest.  ``{"accuracy",
    "client_accuracy", "clients" (the file's ids, sorted), "choice" (each client's model, an index into the
    candidates), "candidates" (how many), "round", "data", "models": "unseen"}``."""
    cfg, payload, _ = read_run(run_dir, trust_code)
    layout, arch, shape, classes = _layout(cfg)
    ds = dataset(cfg.data)
    if not isinstance(ds, PoolDataSet):
        raise DataError(f"--data {data}: the run's data set {cfg.data.name} makes its own inputs, so new clients' "
                        "data cannot be normalised as the run's: --unseen needs a run on a pool or a file")
    x, y, owner, ids = read_new_clients(str(data), shape, classes)
    why = range_mismatch(x, ds.raw(cfg.data).train_x, data)
    if why:
        (warn or (lambda m: warnings.warn(m, stacklevel=2)))(why)
    m = len(ids)
    xs, ys, counts = by_client(x, y, owner, m, torch.arange(m), lambda v: ds.normalize(cfg.data, v))
    total = torch.bincount(owner, minlength=m) if counts is None else counts
    algo = registry.build(cfg, run_facts(cfg, run_model(cfg)))
    weights = payload["weights"].to(torch.float32)
    models = algo.unseen_candidates(upgrade.checkpoint(payload, algo)["algorithm"], weights).to(torch.float32)
    net, _ = make_net(arch, shape, classes, cfg.engine, "cpu", cfg.seed, unequal=True)
    half = total // 2
    losses = torch.stack([evaluate(model.expand(m, -1).contiguous(), layout, net, xs, ys, counts=half)[1]
                          for model in models])                   # [candidates, m] on each first half
    choice = losses.argmin(dim=0)                                  # [m]: the first of ties
    rest = half[:, None] + torch.arange(int((total - half).max()))[None, :]
    rest = rest.clamp_max(xs.shape[1] - 1)
    rows = torch.arange(m)[:, None]
    acc, _ = evaluate(models[choice], layout, net, xs[rows, rest], ys[rows, rest], counts=total - half)
    return {"accuracy": 100.0 * float(acc.double().mean()),
            "client_accuracy": [round(100.0 * float(a), 2) for a in acc], "clients": [int(i) for i in ids],
            "choice": [int(c) for c in choice], "candidates": len(models),
            "round": int(payload["round"]), "data": str(data), "models": "unseen"}


def range_mismatch(new: torch.Tensor, raw: torch.Tensor, path) -> str | None:
    """One line when the new inputs' range is not the run's raw training inputs' (images already divided by 255
    given to a run of 0..255 images, say); None when it is.  The new range counts as another when its largest
    magnitude is under a fifth or over 5x the raw one's, or it holds negatives where the raw inputs have none."""
    lo, hi = float(new.min()), float(new.max())
    rlo, rhi = float(raw.min()), float(raw.max())
    top, rtop = max(abs(lo), abs(hi)), max(abs(rlo), abs(rhi))
    if rtop == 0 or (rtop / 5 <= top <= 5 * rtop and not (lo < 0 <= rlo)):
        return None
    return (f"--data {path}: its inputs lie in [{lo:.4g}, {hi:.4g}], the run's raw training inputs in [{rlo:.4g}, "
            f"{rhi:.4g}]; fedclust normalises them as the run's (x / scale, minus mean, divided by std), so give "
            "inputs as the run's data stores them (e.g. images as 0..255, not already divided by 255)")


def _natural_test(path: Path, ds: PoolDataSet, data_cfg, n: int, shape: tuple[int, ...], classes: int, warn=None):
    """``(x [n, W, *shape], y [n, W], counts [n] | None)`` of a natural-form file's test examples, checked as a
    training file is (:func:`fedclust.data.sets.npz.read_test_clients`), normalised as the run's inputs; ``warn``
    told when their range is not the run's raw range (:func:`range_mismatch`)."""
    x, y, owner = read_test_clients(str(path), n, shape, classes)
    why = range_mismatch(x, ds.raw(data_cfg).train_x, path)
    if why:
        (warn or (lambda m: warnings.warn(m, stacklevel=3)))(why)
    return by_client(x, y, owner, n, torch.arange(n), lambda v: ds.normalize(data_cfg, v))
