"""A run's setting: every resolved config key that can change its numbers (docs/reports.md, "What a setting
is"), in one place.  ``summary.json`` records it (``setting``), and ``fedclust report`` never averages runs whose
settings differ.

The setting is config.yaml's keys, flattened and read as today's (:func:`fedclust.upgrade.config`), except

- the keys that cannot change a run's numbers (:data:`NOT_SETTING`, each with why);
- the keys of sections and needs the run's algorithm does not read (another algorithm's section, ``algorithm.k``
  of a method that takes no k, ``stage1_rounds`` of a method without stages);
- a file named by a path (``data.path``, ``network.path``, ``network.availability``) stands as its SHA-256 where
  the run recorded it, and a user model as its file's name, ``NAME`` and fingerprint: the same file anywhere is
  the same setting, another file under one path is another.
"""

from __future__ import annotations

from pathlib import Path

from fedclust import upgrade
from fedclust.algorithms import registry

# Keys (a dotted key, or a section followed by ".") that cannot change a run's numbers, and why.
NOT_SETTING = {
    "out": "where the run is written",
    "seed": "the repetition a table averages over",
    "label": "the run's name in tables",
    "progress": "what is printed", "figures": "what is drawn", "wandb.": "where the run is tracked",
    "checkpoint_every": "when the state is saved (a resumed run equals one never stopped)",
    "collective_timeout": "how long a rank waits", "startup_timeout": "how long a rank waits",
    "resume": "whether an earlier run is continued", "overwrite": "whether an earlier run is replaced",
    "plugins": "where code is found (the algorithm's name and keys are in the setting)",
    "other_sections": "whether other methods' sections may be present (they are not read)",
    "data.root": "where the data is read from (summary.json's data_source)", "data.download": "the same",
    "device": "where it computes: the same numbers, up to the order of float sums on another device",
    "engine": "how the model is batched: the same numbers, up to the order of float sums",
    "exchange_mb": "how the round's models travel: the same numbers (column blocks gather the same values)",
}
# A key naming a file: the setting holds the file's SHA-256 (its key in a run's inputs) instead of its path.
FILE_KEYS = ("data.path", "network.path", "network.availability")


def _skipped(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in NOT_SETTING)


def _method_keys(flat: dict) -> set[str]:
    """The keys of ``flat`` that the run's algorithm does not read: other algorithms' sections, and k, l, stage
    one where it takes none.  An algorithm not registered here (a plug-in not loaded) keeps them all."""
    registry.load_builtin()
    name = str(flat.get("algorithm.name"))
    if name not in registry.names():
        return set()
    algo = registry.get(name)
    sections = {s for other in registry.classes() for s in other.sections}
    drop = {k for k in flat if k.split(".", 1)[0] in sections - set(algo.sections)}
    drop |= {k for k, needed in (("algorithm.k", algo.needs_k), ("algorithm.l", algo.needs_l),
                                 ("stage1_rounds", algo.needs_stages)) if not needed}
    return drop


def run_setting(config: dict, inputs: dict | None = None) -> dict:
    """The setting of a run (module docstring) from its config (:func:`fedclust.schema.to_dict`'s form, of any
    version) and what it recorded of its files: ``inputs`` maps a key (``data.path``, ``model``,
    ``network.path``...) to ``{"sha256": ..., "fingerprint": ...}`` (a checkpoint's inputs, or summary.json's).
    A file not recorded stands as its path, prefixed ``path:``."""
    flat = upgrade.config(config)
    drop = _method_keys(flat)
    out = {k: v for k, v in sorted(flat.items()) if not _skipped(k) and k not in drop}
    inputs = inputs or {}
    for key in FILE_KEYS:
        if out.get(key):
            sha = (inputs.get(key) or {}).get("sha256")
            out[key] = f"sha256:{sha}" if sha else f"path:{out[key]}"
    model = str(out.get("model", ""))
    if ":" in model:
        target, _, name = model.rpartition(":")
        record = inputs.get("model") or {}
        out["model"] = f"{Path(target).name}:{name}" if target.endswith(".py") else model
        ident = record.get("fingerprint") or record.get("sha256")
        out["model_fingerprint"] = ident if ident else "not recorded"
    return out


def differing(settings: list[dict]) -> list[str]:
    """The keys whose values are not the same in all of ``settings`` (a key one lacks counts as differing)."""
    keys = sorted({k for s in settings for k in s})
    return [k for k in keys if len({repr(s.get(k, "<absent>")) for s in settings}) > 1]
