"""``fedclust report RUN_DIR ...``: results tables of finished runs, laid out
as the PANM paper's Tables 2-3: one row per label (the run's ``label``, its
algorithm's name unless set), one column per setting, each cell the mean ±
sample standard deviation over the label's seeds in that setting.  A setting
is everything that changes the numbers, read from each run's config.yaml
and summary.json: data set, cluster kind and number, clients, rounds,
training examples per client, model, how the pool is split (data.partition
and its keys, data.quantity_skew, data.cluster_sizes, data.rotations), the
data file (data.path's SHA-256), data.options and a user model's
fingerprint; runs that differ in any of these are never averaged together.
A column is headed by its data setting ("fmnist, rotation 2", "synthetic, 4
clusters"), the split where it is not iid ("dirichlet 0.1"), then what
differs from the paper's setting ("fmnist, rotation 2, dirichlet 0.1, 8
clients, 2 rounds") and what tells it apart from the report's other
settings of its data set ("npz, rotation 2, npz a1b2c3d4", "fmnist, rotation
2, model my_model.py:Net (5e6f7a8b)").  One table per metric: final
accuracy (with the paper's number beside ours only where the setting is
exactly the paper's: the PANM paper's Table 2 for Fashion-MNIST with 2
rotations, the FPFC paper's Table 1 for Synthetic with 4 clusters),
neighbour precision and recall, ARI and models received per client (blank
where a label has none, e.g. ``local`` and ``fedavg`` have no neighbours);
``--metrics`` chooses others, e.g. ``best_test_accuracy`` (each client's
best test round, read from metrics.jsonl, beside the paper's number too).
The standard deviation is shown to its first significant digit at least,
the mean to the same decimal place.  Markdown (default), LaTeX or tidy CSV;
``--curves`` draws the accuracy per round (``--metric``: the mean, the honest
clients' or the worst cluster's), mean over seeds with a shaded band, one
panel per setting."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import statistics
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import numpy as np
import yaml

from fedclust import figures, upgrade
from fedclust.algorithms import registry
from fedclust.data import registry as data_registry
from fedclust.runmodel import default_arch
from fedclust.schema import CORE_KEYS, DataConfig
from fedclust.setting import differing, run_setting

# metric (a summary.json field) -> (title, digits shown)
METRICS = {
    "final_accuracy": ("Final accuracy (%)", 2),
    "best_accuracy": ("Best accuracy (%)", 2),
    # CFL's best model of each client's lineage, picked on its validation split (docs/algorithms.md, "CFL")
    "final_accuracy_best_of_lineage": ("Final accuracy, best model of each client's lineage (%)", 2),
    # the lowest mean accuracy of a true cluster's clients, and the accuracy of the clients that do not attack
    "worst_cluster_accuracy": ("Accuracy of the worst cluster (%)", 2),
    "honest_accuracy": ("Accuracy of the honest clients (%)", 2),
    # by test examples (clients of unequal size), and each client's model at its best-validation round
    "final_weighted_accuracy": ("Final accuracy, weighted by test examples (%)", 2),
    "best_validation_accuracy": ("Accuracy at each client's best-validation round (%)", 2),
    # read from metrics.jsonl: each client's highest test accuracy over the evaluated rounds, mean over clients (a
    # client picking its round by its own test images: optimistic; with x/255 inputs, the reading that comes within
    # 0.61 of the PANM paper's Table 2 on 3 seeds: configs/fmnist_rotation2_unit.yaml, docs/results_fmnist.md)
    "best_test_accuracy": ("Mean of each client's best test accuracy over the rounds (%)", 2),
    "neighbor_precision": ("Neighbour precision", 3),
    "neighbor_recall": ("Neighbour recall", 3),
    "num_clusters": ("Clusters found", 1),
    "ari": ("Adjusted Rand index of the clusters found", 3),
    "models_received_per_client": ("Models received per client (whole run)", 0),
    "max_models_received_per_round": ("Most models one node receives in a round", 0),
    "mean_round_seconds": ("Seconds per round", 2),
    # from neighbors.npz: the share of the honest clients' final list entries that are attackers (attack.fraction)
    "attackers_in_lists": ("Share of honest clients' final list entries that are attackers", 3),
}
# The label whose runs every method's accuracy is compared with (its gap to Random, beside the paper's)
RANDOM = "random"
# the accuracy readings shown beside the paper's number and as a gap to Random (the papers give one accuracy, taken
# in a way they do not say: docs/results_fmnist.md, "The PANM offset")
PAPER_READINGS = ("final_accuracy", "best_test_accuracy")
DEFAULT_METRICS = ("final_accuracy", "neighbor_precision", "neighbor_recall", "ari", "models_received_per_client")
# where the numbers of ``paper_table()`` come from, for the table's caption
PAPER_SOURCES = {("fmnist", "rotation", 2): "PANM paper Table 2 (3 seeds)",
                 ("synthetic", None, 4): "FPFC paper Table 1"}
_LAST = 1000   # column position of a data set that declares none (report_order), or that is not registered here


def _data_position(data: str) -> int:
    """The data set's declared column position (the papers' order: mnist, fmnist, cifar10, synthetic), then
    the rest."""
    ds = data_registry.find(data)
    return _LAST if ds is None or ds.report_order is None else int(ds.report_order)


class ReportError(Exception):
    """A run directory the report cannot use; the message names it and the fix."""


class Setting(NamedTuple):
    """Everything of a run that changes its numbers and that runs are grouped by; a field is None where the
    run does not record it (no config.yaml)."""
    data: str
    kind: str | None          # data.clusters; None for client-kind data (Synthetic, a file's clients): its own
    clusters: int | None      # None: the true clusters are not known (a file without `cluster`)
    clients: int | None
    rounds: int | None
    train_size: int | None    # training examples per client
    model: str | None         # resolved: model=auto is the data set's default architecture
    layout: str | None = None  # data.partition, data.cluster_sizes, data.rotations when given ("dirichlet 0.1, sizes
    #                            70/20/5/5, angles ..."); None: the iid split, near-equal clusters, the papers' angles
    data_file: str | None = None   # data.path's SHA-256 (summary.json's data_sha256); None: no file, or not recorded
    options: str | None = None     # data.options as "split=balanced"; None: none (or not recorded: no config.yaml)
    model_id: str | None = None    # a user model's fingerprint (else its file's SHA-256, older runs); None: a
    #                                built-in, or not recorded
    extra: tuple = ()              # ((key, value), ...): the other setting keys the report's runs differ in
    #                                (network.graph, attack.fraction, train.lr ...), each run's value

    @property
    def data_setting(self) -> tuple:
        """(data set, cluster kind, clusters): the key of the papers' tables."""
        return self.data, self.kind, self.clusters


# what the rest of a setting is named in a column header
_FIELD_TEXT = {"clients": "{} clients", "rounds": "{} rounds", "train_size": "train size {}", "model": "model {}"}


def reference(data: str) -> dict:
    """The papers' setting beside a data set (SPEC sections 2, 3 and 7), as the data set declares it
    (``reference``): Synthetic as the FPFC paper's Table 1 (100 clients, 200 rounds, 100 training examples
    each, logistic regression; the shipped configs/synthetic_cluster4.yaml); the image data sets as the PANM
    paper's Table 2 (100 clients, 100 + 200 rounds, 200 training images each, the data set's model: MLP, CNN
    for CIFAR-10).  {} for a data set without one (yours, or one not registered here)."""
    ds = data_registry.find(data)
    return dict(ds.reference) if ds is not None and ds.reference else {}


def is_reference(key: Setting | None) -> bool:
    """Whether the setting is exactly the papers' for its data set (a field not recorded never is)."""
    ref = reference(key.data) if key is not None else {}
    return (bool(ref) and key is not None and key.layout is None and not key.extra
            and all(getattr(key, f) == v for f, v in ref.items()))


def paper_table() -> dict[tuple, dict[str, tuple[float, float]]]:
    """(data set, cluster kind or None for any, number of clusters) -> {algorithm: (mean, std)}, from
    what each registered algorithm declares (``paper_results``): PANM paper Table 2's Fashion-MNIST column
    (docs/results_fmnist.md), FPFC paper Table 1 (clustered Synthetic, m = 100, L = 4)."""
    table: dict[tuple, dict] = {}
    for cls in registry.classes():
        for key, numbers in cls.paper_results.items():
            table.setdefault(key, {})[cls.name] = numbers
    return table


def _position(name: str) -> float:
    classes = {c.name: c for c in registry.classes()}
    return classes[name].report_position if name in classes else float("inf")


def _order(label: str) -> tuple[float, str]:
    """Row order: the algorithm's declared ``report_position`` (a label's first word names it), then the label."""
    return (_position(label.split()[0].split("[")[0]), label)


# ---------------------------------------------------------------- loading

def _int(x) -> int | None:
    return None if x is None else int(x)


def load_run(d) -> dict:
    """One finished run's summary.json, with ``_dir`` and, from its config.yaml, ``_setting`` (clients,
    rounds, train_size, model resolved; each None where the run does not say) and ``_stage1_rounds`` (T1 of
    a two-stage method, else None); the data setting read from config.yaml for runs from before summary.json
    recorded it.  Raises ReportError when the directory has no summary.json or an unreadable config.yaml."""
    d = Path(d)
    s = _read_summary(d)
    s["_dir"] = str(d)
    s.update(attackers_in_lists(d))
    c = d / "config.yaml"
    s["_full"] = s.get("setting") if isinstance(s.get("setting"), dict) else None
    if not c.is_file():   # hand-made or copied without it: only what summary.json says
        s["_setting"] = dict(clients=_int(s.get("clients")), rounds=_int(s.get("rounds_completed")),
                             train_size=None, model=None,
                             layout=partition_text(s.get("data_partition"), s.get("data_alpha"),
                                                   s.get("data_shards_per_client"), s.get("data_quantity_skew")))
        s["_stage1_rounds"] = None
        return s
    cfg = _read_config(c)
    data = cfg.get("data") or {}
    flat = upgrade.config(cfg)   # today's dotted keys; a key config.yaml lacks reads as runs behaved without it
    if "true_clusters" not in s:   # runs from before summary.json named the data setting
        s.update(data=data.get("name", s.get("data") or flat["data.name"]),
                 data_clusters=flat["data.clusters"], true_clusters=flat["data.num_clusters"])

    def whole(key: str) -> int:
        x = flat[key]
        if isinstance(x, bool) or not isinstance(x, int):
            raise ReportError(f"{c}: {key} is {x!r}, not a whole number; restore the value the run used or "
                              f"move the run away")
        return x

    model = flat["model"]
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise ReportError(f"{c}: data.options is {options!r}, not a mapping; restore the value the run used or "
                          f"move the run away")
    s["_setting"] = dict(clients=whole("clients"), rounds=whole("rounds"), train_size=whole("data.train_size"),
                         model=default_arch(s["data"]) if model == "auto" else str(model),
                         layout=layout_text(data), options=options_text(options) or None)
    algorithm = str((cfg.get("algorithm") or {}).get("name", s.get("algorithm")) or "")
    s["_stage1_rounds"] = figures.stage_one_rounds(algorithm, whole("stage1_rounds"))
    # A run from before summary.json recorded its setting: the same rule on config.yaml.  One recorded before a
    # key existed reads that key as config.yaml gives it (as runs behaved without it): never a difference alone.
    s["_full"] = {**run_setting(cfg, _recorded_inputs(s)), **(s["_full"] or {})}
    return s


def _read_summary(d: Path) -> dict:
    """Run directory ``d``'s summary.json; ReportError when ``d`` or the file is missing, or not JSON."""
    p = d / "summary.json"
    if not d.is_dir():
        raise ReportError(f"{d}: no such run directory")
    if not p.is_file():
        raise ReportError(f"{d}: no summary.json: the run has not finished (it may still be running; a stopped "
                          f"run resumes when its command runs again with the same out=)")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ReportError(f"{p}: not valid JSON ({exc})") from None


def _read_config(c: Path) -> dict:
    """A run's config.yaml as a mapping; ReportError naming the file when it is not YAML or not a mapping."""
    try:
        cfg = yaml.safe_load(c.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ReportError(f"{c}: not valid YAML ({exc}); restore the run's config.yaml (the same keys as "
                          f"the run's command gave) or move the run away") from None
    if not isinstance(cfg, dict):
        raise ReportError(f"{c}: not a mapping of config keys; restore the run's config.yaml or move the run "
                          f"away")
    return cfg


def attackers_in_lists(d: Path) -> dict:
    """``{"attackers_in_lists": share, "attacker_entries": count}``: of the entries of the honest clients' final
    neighbour lists (neighbors.npz's ``final_lists``), those that are attackers (its ``attackers``); {} for a run
    without attackers or lists (or a file that cannot be read)."""
    try:
        with np.load(d / "neighbors.npz") as f:
            if "attackers" not in f.files or "final_lists" not in f.files:
                return {}
            bad, lists = f["attackers"], f["final_lists"]
    except (OSError, ValueError):
        return {}
    if lists.ndim != 2:   # an older run's bool [n, n] table
        lists = np.where(lists, np.arange(lists.shape[1])[None, :], -1)
    honest = np.ones(len(lists), dtype=bool)
    honest[bad] = False
    entries = lists[honest]
    entries = entries[entries >= 0]
    count = int(np.isin(entries, bad).sum())
    return {"attackers_in_lists": count / len(entries) if len(entries) else None, "attacker_entries": count}


def _recorded_inputs(summary: dict) -> dict:
    """What an older summary.json recorded of a run's files, in the form of a run's inputs."""
    out = dict(summary.get("inputs") or {})
    if summary.get("data_sha256"):
        out.setdefault("data.path", {"sha256": summary["data_sha256"]})
    ident = summary.get("model_fingerprint") or summary.get("model_source_sha256")
    if ident:
        out.setdefault("model", {"fingerprint": ident})
    return out


def partition_text(partition, alpha=None, shards_per_client=None, quantity_skew=None) -> str | None:
    """A pool's split as a column's words: "dirichlet 0.1", "shards 2/client", then "quantity skew 1.5" where
    the sizes are skewed; None for the iid split of equal sizes (the papers', and every run's before the key) or
    where the run does not say."""
    parts = []
    if partition == "dirichlet":
        parts.append(f"dirichlet {alpha:g}" if isinstance(alpha, (int, float)) else "dirichlet")
    elif partition == "shards":
        parts.append(f"shards {shards_per_client}/client" if shards_per_client is not None else "shards")
    elif partition not in (None, "iid"):
        parts.append(str(partition))
    if isinstance(quantity_skew, (int, float)) and quantity_skew:
        parts.append(f"quantity skew {quantity_skew:g}")
    return ", ".join(parts) or None


def layout_text(data: dict) -> str | None:
    """``data.partition`` (:func:`partition_text`), ``data.cluster_sizes`` and ``data.rotations`` of a run's
    config as a column's words ("dirichlet 0.1, sizes 70/20/5/5, angles 0/180/10/350"); None where none is given
    (the iid split and the default layout).  A key missing from config.yaml (written before it existed) had its
    default."""
    def listed(values) -> str:
        return "/".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
    split = partition_text(data.get("partition", DataConfig.partition), data.get("alpha", DataConfig.alpha),
                           data.get("shards_per_client", DataConfig.shards_per_client),
                           data.get("quantity_skew", DataConfig.quantity_skew))
    parts = [split] if split else []
    if data.get("cluster_sizes"):
        parts.append(f"sizes {listed(data['cluster_sizes'])}")
    if data.get("rotations"):
        parts.append(f"angles {listed(data['rotations'])}")
    return ", ".join(parts) or None


def options_text(options: dict) -> str:
    """``data.options`` as a column's words: ``split=balanced`` (keys in order; "" for none)."""
    def shown(v) -> str:
        return "[" + ",".join(map(str, v)) + "]" if isinstance(v, list) else str(v)
    return ", ".join(f"{k}={shown(options[k])}" for k in sorted(options))


def load_runs(dirs, strict: bool = False, warn=None) -> list[dict]:
    """The runs of ``dirs``.  A path that is a file (``OUT/*`` may match a log) is passed over with a warning,
    and so is a directory without summary.json (an unfinished run), unless ``strict``: then it raises
    ReportError.  A path that does not exist always raises."""
    warn = warn or (lambda msg: print(f"fedclust report: warning: {msg}", file=sys.stderr))
    runs = []
    for d in dirs:
        if Path(d).is_file():
            warn(f"{d}: a file, not a run directory; passed over")
            continue
        try:
            runs.append(load_run(d))
        except ReportError as exc:
            if strict or not Path(d).is_dir():
                raise
            warn(f"{exc}; passed over (--strict makes this an error)")
    return runs


def setting(run: dict) -> Setting | None:
    """The run's :class:`Setting`; the kind is None for client-kind data (Synthetic, a file's own clients:
    data.clusters does not apply), the clusters None where they are not known (a file without `cluster`);
    None where the run does not say which data it used (neither summary.json nor config.yaml names it)."""
    if not run.get("data") or "true_clusters" not in run:
        return None
    ds = data_registry.find(run["data"])
    if (ds is not None and ds.kind == "client") or ("data_clusters" in run and run["data_clusters"] is None):
        kind = None          # the data set's own clusters, or the run says data.clusters did not apply
    else:
        kind = run.get("data_clusters") or "rotation"
        if run["true_clusters"] == 1:
            kind = "rotation"    # one cluster takes no transform: the same data whichever kind was named
    if run["true_clusters"] is None and kind is not None:
        return None          # a pool run that does not say its clusters
    rest = dict(run.get("_setting") or dict(clients=_int(run.get("clients")),
                                            rounds=_int(run.get("rounds_completed")), train_size=None, model=None))
    spec = rest.get("model") or run.get("model")
    user = isinstance(spec, str) and ":" in spec
    # a file or a user model: what summary.json records of it (absent in older runs: not recorded, None)
    return Setting(run["data"], kind, _int(run["true_clusters"]), **rest, data_file=run.get("data_sha256"),
                   model_id=(run.get("model_fingerprint") or run.get("model_source_sha256")) if user else None)


# The fields of a setting named in a column header only where the report's settings of one data set differ in
# them (each a setting's own, beyond the papers' clients, rounds, train size and model): the data file, the
# options, and a user model's fingerprint, which differs among runs of one model name.
_TOLD_APART = ("clients", "rounds", "train_size", "model", "data_file", "options", "model_id")


def _model_text(spec: str, full: bool = False) -> str:
    """A model as a header names it: a built-in's name; a user model's file name and NAME (``my_model.py:Net``;
    the whole spec with ``full``)."""
    target, sep, name = spec.rpartition(":")
    if full or not sep or not target.endswith(".py"):
        return spec
    return f"{Path(target).name}:{name}"


def setting_text(key: Setting | None, vary=frozenset(), full: bool = False) -> str:
    """'fmnist, rotation 2', 'cifar10, label swap 4', 'synthetic, 4 clusters', then what differs from the
    papers' setting: 'fmnist, rotation 2, 8 clients, 2 rounds'; fields the run does not record are named
    ('..., train size, model not recorded').  ``vary``: the fields of :data:`_TOLD_APART` that other settings
    of the report differ in (:func:`setting_texts`), named too: the data file ('npz a1b2c3d4'), the options
    ('options split=balanced'), a user model and its fingerprint ('model my_model.py:Net (5e6f7a8b)'), and
    for a data set without a paper setting its clients, rounds, train size and model."""
    if key is None:
        return "setting unknown"
    data, kind, k = key.data_setting
    if k is None:
        text = f"{data}, clusters unknown"
    elif k == 1 and kind is not None:    # no transform: rotation and label swap alike
        text = f"{data}, 1 cluster"
    else:
        text = f"{data}, {k} clusters" if kind is None else f"{data}, {kind.replace('_', ' ')} {k}"
    ref = reference(data)
    differ, unknown = [], []
    for f in _TOLD_APART[:4]:
        v = getattr(key, f)
        if f in ref and v is None:
            unknown.append(_FIELD_TEXT[f].format("").strip())
            continue
        shown = (v != ref[f] if f in ref else f in vary) or (f == "model" and "model_id" in vary)
        if shown and v is None:
            unknown.append(_FIELD_TEXT[f].format("").strip())
        elif shown and f == "model":
            ident = (f" ({key.model_id[:8]})" if key.model_id else " (fingerprint not recorded)") \
                if "model_id" in vary else ""
            differ.append(_FIELD_TEXT[f].format(_model_text(v, full)) + ident)
        elif shown:
            differ.append(_FIELD_TEXT[f].format(v))
    data_parts = [key.layout] if key.layout else []
    if "data_file" in vary:
        data_parts.append(f"{data} {key.data_file[:8]}" if key.data_file else f"{data} file not recorded")
    if "options" in vary:
        data_parts.append(f"options {key.options}" if key.options else "no options")
    extra = [f"{k}={v}" for k, v in key.extra]
    return ", ".join([text] + data_parts + differ + extra + ([f"{', '.join(unknown)} not recorded"] if unknown
                                                            else []))


def setting_texts(keys) -> dict:
    """Each setting's column header (:func:`setting_text`), naming beyond today's fields what tells it apart
    from the report's other settings of its data set: the data file, the options, and (for a data set without
    a paper setting) its clients, rounds, train size and model; a user model's fingerprint where settings of
    the same model name differ in it.  Settings that differ in none of these keep the headers they always had.
    Where two headers would still read alike (two files of one name), the model is named by its whole spec."""
    def vary(key: Setting) -> frozenset:
        same = [o for o in keys if o is not None and o.data == key.data]
        out = {f for f in _TOLD_APART[:-1] if any(getattr(o, f) != getattr(key, f) for o in same)}
        if any(o.model == key.model and o.model_id != key.model_id for o in same):
            out.add("model_id")
        return frozenset(out)

    texts = {key: setting_text(key, vary(key) if key is not None else frozenset()) for key in keys}
    alike = {t for t in texts.values() if list(texts.values()).count(t) > 1}
    return {key: setting_text(key, vary(key), full=True) if text in alike and key is not None else text
            for key, text in texts.items()}


def _setting_order(key: Setting | None) -> tuple:
    """Columns: the paper's data set order, then rotation before label swap, then fewer clusters first, then
    the paper's own setting before others, then by clients, rounds, train size and model (unknown last)."""
    if key is None:
        return (_LAST + 1, "", 1, "", 0, 1)
    data, kind, k = key.data_setting
    rest = tuple((getattr(key, f) is None, getattr(key, f) or 0) for f in ("clients", "rounds", "train_size"))
    return (_data_position(data), data,
            int(kind not in (None, "rotation")), kind or "", k or 0,
            int(not is_reference(key))) + rest + (key.model or "", key.layout or "", key.data_file or "",
                                                  key.options or "", key.model_id or "", key.extra)


def paper_numbers(key: Setting | None) -> dict:
    """The paper's {algorithm: (mean, std)} for a setting: {} where no paper reports its data setting or the
    run's clients, rounds, train size or model are not the paper's."""
    if key is None or not is_reference(key):
        return {}
    data, kind, k = key.data_setting
    papers = paper_table()
    return papers.get((data, kind, k)) or papers.get((data, None, k)) or {}


# ---------------------------------------------------------------- grouping

def value(run: dict, metric: str) -> float | None:
    """The run's value of a metric, None where it has none.  Recall counts as none where precision is none:
    every client's neighbour list is empty (``local`` records recall 0 of its empty lists).  A metric read from
    the records (``best_test_accuracy``) is read once, on first use."""
    if metric == "neighbor_recall" and run.get("neighbor_precision") is None:
        return None
    if metric == "best_test_accuracy" and metric not in run:
        run[metric] = best_test_accuracy(Path(run["_dir"])) if "_dir" in run else None
    x = run.get(metric)
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def best_test_accuracy(d: Path) -> float | None:
    """Mean over clients of each client's highest test accuracy over the rounds run ``d``'s metrics.jsonl
    evaluates (``client_accuracy``; a round recorded twice counts once, as its last line); a client with no
    value in any round (absent throughout) is left out.  None where the run has no metrics.jsonl or no round
    with per-client accuracies."""
    p = d / "metrics.jsonl"
    if not p.is_file():
        return None
    by_round: dict = {}
    for line in p.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue   # a line torn by a kill: the run rewrites it when it resumes
        if isinstance(r, dict) and r.get("client_accuracy") is not None:
            by_round[r.get("round")] = r["client_accuracy"]
    best = [max(x) for x in ([a for a in accs if a is not None] for accs in zip(*by_round.values())) if x]
    return statistics.fmean(best) if best else None


# Setting keys a column header already names through a field of Setting (data, clusters, clients, rounds, train
# size, model and fingerprint, the split, the data file, the options).
_IN_SETTING = ("data.name", "data.clusters", "data.num_clusters", "clients", "rounds", "data.train_size", "model",
               "model_fingerprint", "data.partition", "data.alpha", "data.shards_per_client", "data.quantity_skew",
               "data.cluster_sizes", "data.rotations", "data.path", "data.options.")


def _is_method_key(key: str) -> bool:
    """A key of the run's method: its section's, ``algorithm.*`` or ``stage1_rounds`` (rows differ in them)."""
    return key.split(".", 1)[0] not in CORE_KEYS or key.startswith("algorithm.") or key == "stage1_rounds"


def _shown(value) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_shown(v) for v in value) + "]"
    if isinstance(value, str) and value.startswith("sha256:"):
        return value[7:15]
    return f"{value:g}" if isinstance(value, float) else str(value)


def with_extras(runs: list[dict]) -> list[Setting | None]:
    """Each run's :class:`Setting`, with ``extra`` the keys of their full settings (:mod:`fedclust.setting`) that
    runs of its data set differ in and that the other fields do not name (the network, the attack, the sharing,
    the training, ...): runs that differ in any of them land in different columns.  A run that does not record
    its full setting (no config.yaml) is told apart by "setting not recorded" where others differ."""
    keys = [setting(r) for r in runs]
    by_data: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        if key is not None:
            by_data.setdefault(key.data, []).append(i)
    for members in by_data.values():
        known = [runs[i]["_full"] for i in members if runs[i].get("_full") is not None]
        vary = [k for k in differing(known) if not _is_method_key(k)
                and not any(k == f or (f.endswith(".") and k.startswith(f)) for f in _IN_SETTING)]
        unknown = len(known) < len(members)
        for i in members:
            full = runs[i].get("_full")
            if full is None:
                extra: tuple = (("setting", "not recorded"),) if (vary or (unknown and known)) else ()
            else:
                extra = tuple((k, _shown(full.get(k))) for k in vary)
            key = keys[i]
            if key is not None:
                keys[i] = key._replace(extra=extra)
    return keys


class Results:
    """Runs grouped by (label, setting): the rows, the columns and each cell's mean, std and seeds."""

    def __init__(self, runs: list[dict]):
        # (label, setting): the setting None where the run does not say which data it used
        self.groups: dict[tuple[str, Setting | None], list[dict]] = {}
        self.kept_apart: list[str] = []   # what the report did with runs of one label that differ in a method key
        keys = with_extras(runs)
        for r, key in zip(runs, keys):
            self.groups.setdefault((r.get("label") or r["algorithm"], key), []).append(r)
        self.settings: list[Setting | None] = sorted({key for _, key in self.groups}, key=_setting_order)
        self.headers = setting_texts(self.settings)   # each setting's column header
        self._split_rows()
        self.labels = sorted({label for label, _ in self.groups}, key=_order)

    def header(self, key: Setting | None) -> str:
        return self.headers[key] if key in self.headers else setting_text(key)

    def _split_rows(self) -> None:
        """Runs of one label and column that differ in a key of their method (its section, algorithm.*,
        stage1_rounds) are never averaged: each value gets its own row, named by the label and what differs,
        and :attr:`kept_apart` says so."""
        for (label, key), rs in list(self.groups.items()):
            known = [r for r in rs if r.get("_full") is not None]
            keys = [k for k in differing([r["_full"] for r in known]) if _is_method_key(k)]
            if not keys and len(known) in (0, len(rs)):
                continue
            del self.groups[(label, key)]
            parts: dict[str, list[dict]] = {}
            for r in rs:
                full = r.get("_full")
                name = (f"{label} [{', '.join(f'{k}={_shown(full.get(k))}' for k in keys)}]" if full is not None
                        else f"{label} [setting not recorded]")
                parts.setdefault(name, []).append(r)
            for name, group in parts.items():
                self.groups[(name, key)] = group
            self.kept_apart.append(f"{label} ({self.header(key)}): its runs differ in "
                                   f"{', '.join(keys) or 'whether they record their setting'}, so they are kept "
                                   f"apart as {'; '.join(sorted(parts))}; give each variant its own label= to name "
                                   "its row")

    def repeated_seeds(self) -> list[str]:
        """Warnings for groups that hold one seed twice (two directories of the same run)."""
        out = []
        for (label, key), rs in self.groups.items():
            seeds = [r.get("seed") for r in rs]
            twice = sorted({s for s in seeds if s is not None and seeds.count(s) > 1})
            if twice:
                out.append(f"{label} ({self.header(key)}) has seed {', '.join(map(str, twice))} more than once "
                           f"({', '.join(r['_dir'] for r in rs if r.get('seed') in twice)}); each run counts")
        return out

    def seeds(self, label: str) -> list[int]:
        """The numbers of runs of the label, one per setting it ran in."""
        return sorted({len(rs) for (lab, _), rs in self.groups.items() if lab == label})

    def cell(self, label: str, key: Setting | None, metric: str) -> tuple[float, float | None, int] | None:
        """(mean, sample std or None for one seed, seeds with a value), None where no run has a value."""
        xs = [x for r in self.groups.get((label, key), []) if (x := value(r, metric)) is not None]
        if not xs:
            return None
        return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else None), len(xs)

    def paper(self, label: str, key: Setting | None) -> tuple[float, float] | None:
        """The paper's number for the label's algorithm in this setting (a variant label is compared with its
        algorithm's number); None where the paper does not report that algorithm in that setting."""
        algorithms = {r["algorithm"] for r in self.groups.get((label, key), [])}
        if len(algorithms) != 1:
            return None
        return paper_numbers(key).get(algorithms.pop())

    def paper_settings(self) -> list[Setting]:
        """The settings where the paper gives a number (never the unknown one)."""
        return [k for k in self.settings if k is not None and any(self.paper(label, k) for label in self.labels)]

    def gap_to_random(self, label: str, key: Setting | None, metric: str = "final_accuracy") -> float | None:
        """The label's mean ``metric`` (final accuracy unless said) minus Random's (the runs labelled ``random``)
        in this setting: the comparison that carries over from a paper to fedclust when both share an offset in
        the base setting (docs/results_fmnist.md); None for Random itself or where either has no value."""
        mine, base = self.cell(label, key, metric), self.cell(RANDOM, key, metric)
        return None if label == RANDOM or mine is None or base is None else mine[0] - base[0]

    def paper_gap_to_random(self, label: str, key: Setting | None) -> float | None:
        """The paper's number for the label minus the paper's Random, in the paper's own setting; None where the
        paper gives either none."""
        mine, base = self.paper(label, key), paper_numbers(key).get(RANDOM)
        algorithms = {r["algorithm"] for r in self.groups.get((label, key), [])}
        return None if algorithms == {RANDOM} or mine is None or base is None else mine[0] - base[0]

    def random_settings(self, metric: str = "final_accuracy") -> list[Setting | None]:
        """The settings where Random ran: the final accuracy table gives every label's gap to it there."""
        return [k for k in self.settings if self.cell(RANDOM, k, metric) is not None]

    def empty(self, metric: str) -> bool:
        return all(self.cell(label, k, metric) is None for label in self.labels for k in self.settings)


# ---------------------------------------------------------------- formats

def decimals(std: float | None, digits: int) -> int:
    """Decimal places for a mean ± std: the metric's ``digits``, more where the std needs them to show its
    first significant digit (0.27 with 0 digits: 1 place, '0.3'), so that a non-zero spread never prints
    as 0."""
    if std is None or std == 0 or not math.isfinite(std):
        return digits
    return max(digits, -math.floor(math.log10(abs(std))))


def _number(mean, std, digits, pm=" ± ") -> str:
    d = decimals(std, digits)
    return f"{mean:.{d}f}" + ("" if std is None else f"{pm}{std:.{d}f}")


def _seeds_text(seeds: list[int], dash="–") -> str:
    return str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}{dash}{seeds[-1]}"


def _grid(res: Results, metric: str, fmt, dash="–") -> tuple[list[str], list[list[str]]]:
    """Header and rows of one metric's table, each cell written by ``fmt(mean, std, digits)``; a cell whose
    number of seeds differs from the row's one number of seeds adds (n=...)."""
    digits = METRICS[metric][1]
    accuracy = metric in PAPER_READINGS
    with_paper = res.paper_settings() if accuracy else []
    with_gap = res.random_settings(metric) if accuracy else []
    with_paper_gap = [k for k in with_paper if k in with_gap and paper_numbers(k).get(RANDOM) is not None]
    head = ["method", "seeds"]
    for k in res.settings:
        head += ([res.header(k)] + (["vs random"] if k in with_gap else []) + (["paper"] if k in with_paper else [])
                 + (["paper vs random"] if k in with_paper_gap else []))
    rows = []
    for label in res.labels:
        seeds = res.seeds(label)
        row = [label, _seeds_text(seeds, dash)]
        for k in res.settings:
            c = res.cell(label, k, metric)
            text = ""
            if c is not None:
                text = fmt(c[0], c[1], digits) + (f" (n={c[2]})" if len(seeds) > 1 or c[2] != seeds[0] else "")
            row.append(text)
            if k in with_gap:
                row.append(_signed(res.gap_to_random(label, k, metric), digits))
            if k in with_paper:
                p = res.paper(label, k)
                row.append(fmt(p[0], p[1], digits) if p else "")
            if k in with_paper_gap:
                row.append(_signed(res.paper_gap_to_random(label, k), digits))
        rows.append(row)
    return head, rows


def _signed(x: float | None, digits: int) -> str:
    """A gap with its sign ('+0.92', '-10.40'); blank for none."""
    return "" if x is None else f"{x:+.{digits}f}"


def _paper_setting_text(key: Setting) -> str:
    ref = reference(key.data)
    return (f"{ref['clients']} clients, {ref['rounds']} rounds, train size {ref['train_size']}, "
            f"model {ref['model']}")


def _caption(res: Results, metric: str) -> tuple[str, str]:
    """The metric's title and, for an accuracy reading (PAPER_READINGS), where the paper column comes from."""
    sources = [f"{PAPER_SOURCES.get(k.data_setting, 'the paper')} for {res.header(k)}: {_paper_setting_text(k)}"
               for k in (res.paper_settings() if metric in PAPER_READINGS else [])]
    return METRICS[metric][0], (f"paper: {'; '.join(sources)}" if sources else "")


def markdown(res: Results, metrics=DEFAULT_METRICS) -> str:
    out = ["Mean ± sample standard deviation over seeds (`seeds`: runs per setting; a cell with another number "
           "says n=...); blank: the label has no such value there. A column header names what differs from the "
           "paper's setting (clients, rounds, train size, model) and what tells it apart from the other columns "
           "of its data set (the data file, data.options, a model of your own and its fingerprint); the paper's "
           "number is shown only in the paper's own setting. `vs random`: the method's mean final accuracy (in "
           "the best-test table, its best-test reading) minus Random's in the same setting; `paper vs random`: "
           "the same difference of the paper's numbers."]
    for metric in metrics:
        if res.empty(metric):
            continue
        head, rows = _grid(res, metric, _number)
        title, note = _caption(res, metric)
        out += ["", f"**{title}**" + (f" ({note})" if note else ""), "", "| " + " | ".join(head) + " |",
                "|" + "---|" * len(head)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _latex_escape(text: str) -> str:
    special = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
               "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
    return "".join(special.get(ch, ch) for ch in text)


def latex(res: Results, metrics=DEFAULT_METRICS) -> str:
    """One tabular per metric, a comment line above it naming the metric."""
    out = []
    for metric in metrics:
        if res.empty(metric):
            continue
        head, rows = _grid(res, metric, lambda m, s, d: "$" + _number(m, s, d, pm=r" \pm ") + "$", dash="--")
        title, note = _caption(res, metric)
        out += [f"% {title}: mean $\\pm$ sample std over seeds" + (f"; {note}" if note else ""),
                r"\begin{tabular}{ll" + "c" * (len(head) - 2) + "}", r"\hline",
                " & ".join(_latex_escape(h) for h in head) + r" \\", r"\hline"]
        out += [" & ".join([_latex_escape(r[0])] + r[1:]) + r" \\" for r in rows]
        out += [r"\hline", r"\end{tabular}", ""]
    return "\n".join(out)


def tidy(res: Results, metrics=DEFAULT_METRICS) -> list[dict]:
    """One record per label x setting x metric that has a value: label, setting, metric, mean, std (empty for
    one seed), seeds; the paper's number as metric ``paper_final_accuracy`` (seeds empty); a label's gap to
    Random as ``gap_to_random`` (``best_test_accuracy_gap_to_random`` by that reading) and the paper's as
    ``paper_gap_to_random`` (std and seeds empty)."""
    recs = []
    for key in res.settings:
        for label in res.labels:
            for metric in metrics:
                c = res.cell(label, key, metric)
                if c is not None:
                    recs.append(dict(label=label, setting=res.header(key), metric=metric, mean=c[0],
                                     std="" if c[1] is None else c[1], seeds=c[2]))
                if metric not in PAPER_READINGS:
                    continue
                first = metric == next(m for m in metrics if m in PAPER_READINGS)   # the paper's, once
                if first and (p := res.paper(label, key)):
                    recs.append(dict(label=label, setting=res.header(key), metric="paper_final_accuracy",
                                     mean=p[0], std=p[1], seeds=""))
                gaps = [("gap_to_random" if metric == "final_accuracy" else f"{metric}_gap_to_random",
                         res.gap_to_random(label, key, metric))]
                for name, gap in gaps + ([("paper_gap_to_random", res.paper_gap_to_random(label, key))]
                                         if first else []):
                    if gap is not None:
                        recs.append(dict(label=label, setting=res.header(key), metric=name, mean=gap, std="",
                                         seeds=""))
    return recs


def csv_text(res: Results, metrics=DEFAULT_METRICS) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, ["label", "setting", "metric", "mean", "std", "seeds"], lineterminator="\n")
    w.writeheader()
    w.writerows(tidy(res, metrics))
    return buf.getvalue()


def table(runs: list[dict], metrics=DEFAULT_METRICS) -> str:
    """The default Markdown tables of some loaded runs."""
    return markdown(Results(runs), metrics)


# ---------------------------------------------------------------- curves

def _warn(msg: str) -> None:
    print(f"fedclust report: warning: {msg}", file=sys.stderr)


# --curves --metric: the record field drawn -> the y axis's words
CURVE_METRICS = {"accuracy": "mean test accuracy (%)",
                 "honest_accuracy": "honest clients' accuracy (%)",
                 "worst_cluster_accuracy": "worst cluster's accuracy (%)",
                 "joiner_accuracy": "late joiners' accuracy (%)",
                 "incumbent_accuracy": "accuracy of the clients present from the start (%)"}


def read_curve(run: dict, warn=_warn, metric: str = "accuracy") -> dict[int, float]:
    """round -> the record field ``metric`` (mean test accuracy by default) of a run's metrics.jsonl, the rounds
    where it is a number; a line that is not a record is skipped and ``warn`` names its file and line."""
    p = Path(run["_dir"]) / "metrics.jsonl"
    if not p.is_file():
        raise ReportError(f"{run['_dir']}: no metrics.jsonl for --curves")
    recs = figures.read_records(p, warn)
    return {x["round"]: v for x in recs if (v := figures._number(x.get(metric))) is not None}


def mean_curves(runs: list[dict], band: str = "std", warn=_warn,
                metric: str = "accuracy") -> dict[Setting | None, dict[str, tuple]]:
    """setting -> label -> (rounds, mean of ``metric``, low, high, seeds), on the rounds every run of the label
    in that setting recorded it; the band is mean ± sample std (``std``; none for one seed) or min-max.  A
    label with no such round is left out, and ``warn`` names it."""
    res = Results(runs)
    out: dict[Setting | None, dict[str, tuple]] = {}
    for key in res.settings:
        for label in res.labels:
            rs = res.groups.get((label, key))
            if not rs:
                continue
            curves_ = [read_curve(r, warn, metric) for r in rs]
            rounds = sorted(set.intersection(*(set(c) for c in curves_)))
            if not rounds:
                warn(f"{label} in {res.headers.get(key, setting_text(key))}: no round where every run "
                     f"({', '.join(r['_dir'] for r in rs)}) records {metric}; left out of the curves")
                continue
            at = [[c[t] for c in curves_] for t in rounds]
            mean = [statistics.fmean(xs) for xs in at]
            if band == "minmax":
                low, high = [min(xs) for xs in at], [max(xs) for xs in at]
            else:
                sd = [statistics.stdev(xs) if len(xs) > 1 else 0.0 for xs in at]
                low, high = [m - s for m, s in zip(mean, sd)], [m + s for m, s in zip(mean, sd)]
            out.setdefault(key, {})[label] = (rounds, mean, low, high, len(rs))
    return out


def stage_lines(runs: list[dict]) -> dict[Setting | None, dict[int, list[str]]]:
    """setting -> {T1: the labels of two-stage methods whose stage one ends after round T1}."""
    res = Results(runs)
    out: dict[Setting | None, dict[int, list[str]]] = {}
    for (label, key), rs in res.groups.items():
        for t1 in sorted({t for r in rs if (t := r.get("_stage1_rounds")) is not None}):
            out.setdefault(key, {}).setdefault(t1, []).append(label)
    return {k: {t1: sorted(labels, key=_order) for t1, labels in v.items()} for k, v in out.items()}


# the labels' line styles, cycled beside the tab10 colours from 8 labels on: (colour, style) pairs stay distinct up
# to 30 labels, then markers tell them apart too; no style is "--", the stage-two line's
CURVE_STYLES = ("-", ":", "-.")
CURVE_MARKERS = ("o", "s", "^", "v", "D")
MANY_LABELS = 8
LEGEND_WRAP = 22   # characters of a legend entry's line in two columns under a one-column panel


def curve_looks(count: int) -> list[dict]:
    """Line keywords (colour, linestyle, marker) for ``count`` labels: tab10 colours, solid below 8 labels;
    from 8 on each label also takes one of three line styles, so that no two labels look alike."""
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    out = []
    for i in range(count):
        look: dict = {"color": cmap(i % 10), "ls": "-" if count < MANY_LABELS else CURVE_STYLES[i % 3]}
        if i >= 30:
            look.update(marker=CURVE_MARKERS[(i // 30 - 1) % len(CURVE_MARKERS)], markevery=0.2, ms=3)
        out.append(look)
    return out


class _CurvePanels:
    """How :func:`curves` lays out its panels: one per setting, a look per label (colours, then line styles
    from 8 labels on), the legend's columns and entries, each panel's stage lines."""

    def __init__(self, runs: list[dict], data: dict, metric: str):
        self.data, self.metric = data, metric
        self.headers = Results(runs).headers
        self.stages = stage_lines(runs)
        labels = sorted({label for per in data.values() for label in per}, key=_order)
        self.look = dict(zip(labels, curve_looks(len(labels))))
        self.cols = min(len(data), 3)
        self.rows = -(-len(data) // self.cols)
        self.width = figures.WIDTH if self.cols == 1 else figures.WIDE
        # two legend columns where a panel is wide enough (one or two panels a row), each entry broken to fit
        self.ncols = 2 if len(labels) >= MANY_LABELS and self.cols <= 2 else 1
        most = max((self._legend_lines(key, per) for key, per in data.items()), default=1)
        self.height = 2.1 + 0.16 * most   # the axes and, below them, the legend's lines

    def _entry(self, text: str) -> str:
        return "\n".join(textwrap.wrap(text, LEGEND_WRAP)) if self.ncols == 2 else text

    def _stage_label(self, t1: int, which: list[str], per: dict) -> str:
        return self._entry(f"stage two from round {t1 + 1}" + ("" if set(which) == set(per)
                                                                else f" ({', '.join(which)})"))

    def _seeds_label(self, label: str, seeds: int) -> str:
        return self._entry(f"{label} ({seeds} seed{'s' if seeds > 1 else ''})")

    def _legend_lines(self, key, per: dict) -> int:
        texts = ([self._seeds_label(label, c[4]) for label, c in per.items()]
                 + [self._stage_label(t1, which, per) for t1, which in self.stages.get(key, {}).items()])
        return -(-sum(t.count("\n") + 1 for t in texts) // self.ncols)

    def draw(self, ax, key, per: dict) -> None:
        """One setting's panel: each label's mean with its band, the stage lines, the legend below."""
        last = max((max(r[0], default=0) for r in per.values()), default=None)
        for label, (rounds, mean, low, high, seeds) in per.items():
            ax.plot(rounds, mean, lw=1, **self.look[label], label=self._seeds_label(label, seeds))
            if seeds > 1:
                ax.fill_between(rounds, low, high, color=self.look[label]["color"], alpha=0.2, lw=0)
        for t1, which in self.stages.get(key, {}).items():
            line = figures.mark_stage_two(ax, t1, last, self._stage_label(t1, which, per))
            if line is not None and len(which) == 1 and set(which) != set(per):
                line.set_color(self.look[which[0]]["color"])
        ax.set_title("\n".join(textwrap.wrap(self.headers.get(key, setting_text(key)), 40 if self.cols == 1 else 30)))
        ax.set_xlabel("round")
        ax.set_ylabel(CURVE_METRICS[self.metric])
        figures.integer_ticks(ax.xaxis)
        # below the panel, where it covers no curve
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=self.ncols, frameon=False,
                  columnspacing=0.8, handlelength=2.0, handletextpad=0.5)


def curves(runs: list[dict], path: Path, band: str = "std", warn=_warn, metric: str = "accuracy"):
    """One panel per setting, one line per label: the record field ``metric`` (CURVE_METRICS: mean test
    accuracy by default) averaged over its seeds per round, shaded band; whole-number round ticks and, for
    two-stage methods, a dashed line where stage two starts.  Drawn at print size (one column, 3.3 in, for
    one panel; both columns, 6.8 in, for more); from 8 labels on, line styles besides colours and a legend
    of two columns.  The folder of ``path`` is made where missing.  Returns the Figure; raises ReportError
    when no run records ``metric`` or the file cannot be written."""
    if metric not in CURVE_METRICS:
        raise ReportError(f"--metric {metric}: not a field the curves draw; use one of {', '.join(CURVE_METRICS)}")
    path = Path(path)
    data = {key: per for key, per in mean_curves(runs, band, warn, metric).items() if per}
    if not data:
        raise ReportError(f"no run records {metric} per round (its metrics.jsonl has no such numbers): no "
                          f"curves to draw; --metric accuracy draws the mean accuracy")
    panels = _CurvePanels(runs, data, metric)
    with figures.print_style():
        fig = figures.new_figure(panels.width, panels.height * panels.rows)
        axes = fig.subplots(panels.rows, panels.cols, squeeze=False)
        for ax in axes.flat[len(data):]:
            ax.set_visible(False)
        for ax, (key, per) in zip(axes.flat, data.items()):
            panels.draw(ax, key, per)
        fig.suptitle("mean over seeds; shaded: " + ("min–max over seeds" if band == "minmax" else
                                                     "± 1 sample std over seeds"))
        _save_curves(fig, path)
    return fig


def _save_curves(fig, path: Path) -> None:
    """The figure at ``path``, its folder made where missing; ReportError in one line where it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReportError(f"--curves {path}: cannot make its folder {path.parent} ({exc.strerror or exc})") from None
    try:
        fig.savefig(path, dpi=figures.DPI)
    except (OSError, ValueError) as exc:   # not writable; a name matplotlib has no format for
        raise ReportError(f"--curves {path}: cannot write it ({exc}); give a writable path ending in .png, "
                          f".pdf or .svg") from None


# ---------------------------------------------------------------- command line

def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="fedclust report", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="A run directory without summary.json (still running, stopped or failed) is passed over with a "
               "warning on stderr naming it, and so is a file among the paths (OUT/* may match logs); --strict "
               "makes an unfinished run an error.  The seeds column says how many runs each row averages.  Exit "
               "status 2 when a path does not exist, --strict meets an unfinished run, or no run is finished.")
    p.add_argument("runs", nargs="+", help="run directories (each with summary.json; metrics.jsonl for --curves)")
    p.add_argument("--format", choices=("markdown", "csv", "latex"), default="markdown",
                   help="markdown: one table per metric (default); csv: tidy, one line per label, setting and "
                        "metric (label,setting,metric,mean,std,seeds; the paper's as paper_final_accuracy, the "
                        "gaps to Random as gap_to_random and paper_gap_to_random); "
                        "latex: one tabular per metric, cells $mean \\pm std$")
    p.add_argument("--metrics", default=",".join(DEFAULT_METRICS),
                   help=f"comma-separated summary.json fields, or 'all' ({', '.join(METRICS)}); "
                        f"default {','.join(DEFAULT_METRICS)}")
    p.add_argument("--curves", metavar="PNG", help="write the accuracy curves here: one panel per setting, one "
                                                   "line per label, mean over seeds with a shaded band (the "
                                                   "folder is made where missing)")
    p.add_argument("--metric", choices=tuple(CURVE_METRICS), default=None,
                   help="the record field --curves averages and draws: accuracy (the mean over clients, default), "
                        "honest_accuracy (the clients that do not attack), worst_cluster_accuracy (the lowest "
                        "true cluster's mean), or with late joiners (network.join_round) joiner_accuracy and "
                        "incumbent_accuracy (the clients present from the start)")
    p.add_argument("--band", choices=("std", "minmax"), default="std",
                   help="the curves' band: ± 1 sample std over seeds (default) or min-max")
    p.add_argument("--strict", action="store_true",
                   help="stop with an error at a run directory without summary.json instead of passing over it")
    args = p.parse_args(argv)
    metrics = list(METRICS) if args.metrics == "all" else [m.strip() for m in args.metrics.split(",") if m.strip()]
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        p.error(f"unknown metric {', '.join(unknown)}; use {', '.join(METRICS)} or all")
    if args.metric is not None and not args.curves:
        p.error("--metric chooses what --curves draws: give --curves PNG too (--metrics chooses the tables)")
    try:
        runs = load_runs(args.runs, strict=args.strict)
        if not runs:
            raise ReportError("no finished run (summary.json) among the given paths")
        res = Results(runs)
        for msg in res.kept_apart + res.repeated_seeds():
            print(f"fedclust report: warning: {msg}", file=sys.stderr)
        print({"markdown": markdown, "csv": csv_text, "latex": latex}[args.format](res, metrics), end="")
        if args.curves:
            curves(runs, Path(args.curves), args.band, metric=args.metric or "accuracy")
    except ReportError as exc:
        print(f"fedclust report: error: {exc}", file=sys.stderr)
        return 2
    return 0
