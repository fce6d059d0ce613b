"""Loading a whole experiment config: plugins first (they add algorithms and
their sections), then the YAML file and the overrides, then every check —
the core keys (:mod:`fedclust.schema`), the chosen algorithm's own and its
sections' (:class:`fedclust.algorithms.base.Algorithm.check`), the data —
before any process group starts or any data is read.

The schema's names (:mod:`fedclust.schema`) and the config file's
(:mod:`fedclust.configfile`) are re-exported here, so ``from fedclust.config
import Config, load_config`` is all a script needs.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import torch

from fedclust.algorithms import registry
from fedclust.algorithms.base import RunFacts
from fedclust.configfile import dump, parse, parse_override, read_yaml, set_key  # noqa: F401
from fedclust.data import check_data, dataset
from fedclust.data.drift import check_drift
from fedclust.data.validation import check_share
from fedclust.dist import (
    available_memory,
    exchange_column_bytes,
    exchange_columns,
    launch_rank,
    resolve_device,
    world_from_env,
)
from fedclust.errors import ConfigError
from fedclust.importing import import_target
from fedclust.models import check_input, is_user_model
from fedclust.models.registry import aliases as model_aliases
from fedclust.models.registry import names as model_names
from fedclust.network import read_availability, read_edge_list
from fedclust.runmodel import RunModel, model_spec, run_model
from fedclust.schema import (  # noqa: F401
    SECTIONS,
    AlgorithmConfig,
    Config,
    DataConfig,
    TrainConfig,
    WandbConfig,
    key_records,
    one_of,
    to_dict,
    valid_keys,
    validate_core,
)


def note(text: str, kind: str = "note") -> None:
    """One line at start-up about the config (a fact a user should know, not an error), from one process only."""
    if launch_rank() == 0:
        print(f"fedclust: {kind}: {text}", file=sys.stderr, flush=True)


def load_plugin(spec: str) -> None:
    """Import a plugin: a module name (``my_lab.algorithms``) or a ``.py``
    file; importing it registers its algorithms and data sets.  Importing twice is a no-op."""
    import_target(spec, "plugins", "give an importable module name or the path of a .py file")


def _plugins_named(raw: dict, overrides) -> list[str]:
    found = raw.get("plugins") or []
    found = [found] if isinstance(found, str) else list(found)
    for text in overrides:
        key, value = parse_override(text)
        if key == "plugins":
            found += [value] if isinstance(value, str) else list(value or [])
    return [str(p) for p in found]


def load_algorithms(raw: dict, overrides=()) -> None:
    """Register the built-in algorithms and the plugins a config names (their sections become valid keys,
    their data sets valid data.name values): before the config is parsed and checked."""
    registry.load_builtin()
    for spec in _plugins_named(raw, overrides):
        load_plugin(spec)


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML file (or start from defaults), apply overrides, validate."""
    raw = read_yaml(path) if path is not None else {}
    load_algorithms(raw, overrides)
    cfg = parse(raw, overrides)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Every check of a parsed config: core keys, the algorithm and its
    sections, the device, the data."""
    validate_core(cfg)
    algorithm = registry.get(cfg.algorithm.name)
    check_no_effect(cfg, algorithm)
    algorithm.check(cfg)
    check_exchange(cfg, algorithm)
    check_network(cfg, algorithm)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", "cuda", "no CUDA device is visible here; use device=cpu or device=auto")
    check_data(cfg.data, cfg.clients)   # data-set plugins were imported with the algorithms' (load_algorithms)
    check_drift(cfg.data, cfg.rounds, dataset(cfg.data))
    share, key = validation_split(cfg, algorithm)
    # a pool's clients hold data.train_size examples each; a file's sizes are checked when the split is carved
    check_share(share, cfg.data.train_size if dataset(cfg.data).kind_of(cfg.data) == "pool" else 2, key or
                "data.validation")
    if not is_user_model(cfg.model):   # FILE.py:NAME / package.module:NAME are checked by building them, below
        one_of("model", cfg.model, {"auto", *model_names()}, aliases=model_aliases())
    arch, shape, _ = model_spec(cfg)
    why = check_input(arch, shape)
    if why:
        raise ConfigError("model", cfg.model, f"the {arch} {why}, but {cfg.data.name}'s inputs have shape "
                          f"{list(shape)}; use model=mlp")
    model = run_model(cfg)
    if is_user_model(arch) or cfg.engine == "loop":   # built, checked and its engine chosen before anything starts
        model.net(cfg.engine, resolve_device(cfg.device))
    facts = run_facts(cfg, model)
    personal_columns(cfg, algorithm, facts.layout)
    algorithm.check_run(cfg, facts)
    warn_cluster_count(cfg, algorithm)


def _changed(cfg: Config, key: str) -> bool:
    """Whether the dotted core key ``key`` differs from its default."""
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name) != getattr(getattr(Config(), section), name)


# (key, when it has an effect, why not otherwise, the fix): a key set away from its default where it has none is
# refused, so that an experiment never quietly runs without the condition it names.
_NO_EFFECT = (
    ("network.path", lambda c: c.network.graph == "file", "is read only with network.graph=file",
     "set network.graph=file to use the edge list, or drop network.path"),
    ("network.degree", lambda c: c.network.graph in ("regular", "small_world"),
     "is a regular or small_world graph's degree", "set network.graph=regular (or small_world), or drop the key"),
    ("network.p_edge", lambda c: c.network.graph == "erdos_renyi", "is an erdos_renyi graph's edge probability",
     "set network.graph=erdos_renyi, or drop the key"),
    ("network.rewire", lambda c: c.network.graph == "small_world", "is a small_world graph's rewiring probability",
     "set network.graph=small_world, or drop the key"),
    ("network.redraw_every", lambda c: c.network.graph in ("regular", "erdos_renyi", "small_world"),
     "draws a random graph again, and only regular, erdos_renyi and small_world graphs are drawn at random (the "
     "complete graph, the ring and a file's are the same every round)", "choose a random network.graph, or drop "
     "the key"),
    ("network.straggler_work", lambda c: c.network.stragglers > 0, "is the share of its steps a straggler "
     "completes, and network.stragglers = 0 makes none", "set network.stragglers > 0, or drop the key"),
    ("attack.kind", lambda c: c.attack.fraction > 0, "chooses the attack, and attack.fraction = 0 makes no "
     "attacker", "set attack.fraction > 0 (e.g. 0.2), or drop the key"),
    ("attack.scale", lambda c: c.attack.fraction > 0 and c.attack.kind != "label_flip",
     "scales a sign_flip or gaussian attack, and this run has none (attack.fraction = 0, or label_flip)",
     "drop the key, or set attack.fraction > 0 with attack.kind=sign_flip or gaussian"),
)


def check_no_effect(cfg: Config, algorithm) -> None:
    """Refuse a key set away from its default where it would change nothing (:data:`_NO_EFFECT`), and a key of
    another algorithm's section (``dac.tau`` with ``algorithm.name=panm_grad``) unless ``other_sections=true``."""
    for key, applies, why, fix in _NO_EFFECT:
        if _changed(cfg, key) and not applies(cfg):
            value = getattr(getattr(cfg, key.split(".")[0]), key.split(".")[1])
            raise ConfigError(key, value, f"has no effect on this run: it {why}; {fix}")
    if cfg.other_sections:
        return
    own = set(algorithm.sections)
    for name, section in cfg.sections.items():
        if name in own:
            continue
        default = dataclasses.asdict(SECTIONS[name]())
        for key, value in dataclasses.asdict(section).items():
            if value != default.get(key):
                readers = ", ".join(sorted(n for n in registry.names() if name in registry.get(n).sections))
                raise ConfigError(f"{name}.{key}", value, f"is read by {readers}, not by algorithm.name = "
                                  f"{cfg.algorithm.name}, so it would have no effect: drop it, or set "
                                  "other_sections=true in a config shared by several algorithms (a sweep)")


def warn_cluster_count(cfg: Config, algorithm) -> None:
    """One line at start when the method's number of clusters differs from the data's known number."""
    key = algorithm.cluster_count_key
    if not key or not dataset(cfg.data).has_true_clusters(cfg.data):
        return
    value = functools.reduce(getattr, key.split("."), cfg)
    if value != cfg.data.num_clusters:
        note(f"{key} = {value} but the data has {cfg.data.num_clusters} clusters (data.num_clusters); "
             f"{cfg.algorithm.name} looks for {value}", "warning")


def validation_split(cfg: Config, algorithm) -> tuple[float, str]:
    """``(share, key)`` of the validation split carved from each client's training examples: ``data.validation``
    when > 0, else the algorithm's own (CFL's ``cfl.validation``: ``Algorithm.validation_key``), else ``(0, "")``.
    Both > 0 and different is refused: one split serves both."""
    own_key = algorithm.validation_key
    own = float(functools.reduce(getattr, own_key.split("."), cfg)) if own_key else 0.0
    share = float(cfg.data.validation)
    if share > 0 and own > 0 and share != own:
        raise ConfigError("data.validation", share, f"{cfg.algorithm.name} holds out {own_key} = {own} of each "
                          f"client's examples already; one split serves both: set {own_key}={share} or "
                          "data.validation=0")
    return (share, "data.validation") if share > 0 else (own, own_key)


def run_facts(cfg: Config, model: RunModel | None = None) -> RunFacts:
    """What an algorithm may know of ``cfg``'s run besides the config
    (:class:`fedclust.algorithms.base.RunFacts`): the model's layout and its
    default init under a seed (``model``, the run's :class:`RunModel`; built
    on the CPU when not given), the processes the launcher started, and the
    free memory of the device a rank would use."""
    model = model or run_model(cfg)
    local, nodes = world_from_env()
    return RunFacts(layout=model.layout, init=model.init, world=local * nodes, ranks_per_node=local,
                    free_memory=lambda: available_memory(cfg.device))


def personal_columns(cfg: Config, algorithm, layout) -> tuple[tuple[int, int], ...]:
    """The flat column ranges ``share.personal`` keeps to each client, checked: a peer method whose aggregate
    honours it, names among the model's tensors, and something left to share."""
    names = cfg.share.personal
    if not names:
        return ()
    if not all(isinstance(x, str) and x for x in names):
        raise ConfigError("share.personal", names, "must be a list of parameter names, module prefixes or head, "
                          "e.g. share.personal=[head]")
    if not algorithm.personal_layers:
        able = ", ".join(sorted(n for n in registry.names() if registry.get(n).personal_layers))
        fix = ("its server averages whole models (FPFC's own form: fpfc.fuse=head)" if algorithm.topology != "peer"
               else "it exchanges its own kind of models")
        raise ConfigError("share.personal", names, f"{cfg.algorithm.name} does not keep a personal part: {fix}; "
                          f"use share.personal=[] or one of {able}")
    try:
        tensors = layout.select(names)
    except ValueError as e:
        raise ConfigError("share.personal", names, f"{e}; give names, module prefixes or head") from None
    if len(tensors) == len(layout.names):
        raise ConfigError("share.personal", names, "keeps every parameter personal, so nothing is shared: use "
                          "algorithm.name=local, or name fewer tensors")
    return layout.column_ranges(tensors)


def check_network(cfg: Config, algorithm) -> None:
    """A graph other than ``complete`` fits the run: a peer-to-peer
    algorithm, a graph of this many clients (a file's read and checked
    now), and neighbours enough for the k a client averages with."""
    net, n = cfg.network, cfg.clients
    if net.availability:
        read_availability(net.availability, n)   # refused here, naming what is wrong, before anything starts
    if net.p_drop > 0 and algorithm.topology != "peer":
        raise ConfigError("network.p_drop", net.p_drop, f"{cfg.algorithm.name} talks to a server: lost messages are "
                          "modelled between peers; use network.p_drop=0 (network.p_offline applies to it)")
    if net.graph == "complete":
        return
    if algorithm.topology != "peer":
        raise ConfigError("network.graph", net.graph, f"{cfg.algorithm.name} talks to a server, not to peers: a "
                          "communication graph applies to peer-to-peer algorithms; use network.graph=complete")
    k = cfg.algorithm.k if algorithm.needs_k else 1
    if net.graph in ("regular", "small_world"):
        if not net.degree < n:
            raise ConfigError("network.degree", net.degree, f"must be below clients = {n}")
        if net.graph == "regular" and (n * net.degree) % 2:
            raise ConfigError("network.degree", net.degree, f"a {net.degree}-regular graph of {n} clients does not "
                              "exist (clients x degree must be even); choose an even degree")
        if net.graph == "small_world" and (net.degree % 2 or net.degree < 2):
            raise ConfigError("network.degree", net.degree, "a small_world graph joins each client to its degree/2 "
                              "nearest on each side of a ring: choose an even degree >= 2")
        if net.degree < k:
            raise ConfigError("network.degree", net.degree, f"{cfg.algorithm.name} averages with algorithm.k = {k} "
                              f"peers a round, more than a client's {net.degree} neighbours: raise network.degree "
                              f"to {k} or more, or lower algorithm.k")
    if net.graph == "ring" and k > 2:
        raise ConfigError("algorithm.k", cfg.algorithm.k, f"on a ring each client has 2 neighbours, fewer than the "
                          f"{k} {cfg.algorithm.name} averages with: set algorithm.k=2 or less, or choose another "
                          "network.graph")
    if net.graph == "erdos_renyi" and net.p_edge * (n - 1) < k:
        raise ConfigError("network.p_edge", net.p_edge, f"gives clients {net.p_edge * (n - 1):.3g} neighbours on "
                          f"average, fewer than the algorithm.k = {k} {cfg.algorithm.name} averages with: raise "
                          f"network.p_edge to {k / (n - 1):.3g} or more")
    if net.graph == "file":
        if not net.path:
            raise ConfigError("network.path", net.path, "network.graph=file needs the edge list: network.path=FILE")
        read_edge_list(net.path, n, say=note)   # refused here, naming what is wrong, before anything starts


def check_exchange(cfg: Config, algorithm) -> None:
    """``exchange_mb > 0`` needs an algorithm that reads the gathered models
    in column blocks, and (under a launcher that says how many processes)
    a budget of at least one column."""
    if cfg.exchange_mb <= 0:
        return
    if not algorithm.column_exchange:
        able = ", ".join(sorted(n for n in registry.names() if registry.get(n).column_exchange))
        raise ConfigError("exchange_mb", cfg.exchange_mb,
                          f"{cfg.algorithm.name} reads whole models of other clients (their losses on a client's "
                          f"data, a server's averages, pairs of models), so its exchange cannot go in column "
                          f"blocks; set exchange_mb=0, or use one of: {able}")
    local, nodes = world_from_env()
    world, parts = local * nodes, 2 if algorithm.gathers_before else 1
    if exchange_columns(cfg.exchange_mb, cfg.clients, world, parts) < 1:
        need = exchange_column_bytes(cfg.clients, world, parts) / 2**20
        raise ConfigError("exchange_mb", cfg.exchange_mb,
                          f"a column block of {cfg.clients} clients' models needs {need:.3g} MiB on each of the "
                          f"{world} processes; raise exchange_mb to at least that, or 0 to gather all at once")


REFERENCE_COMMAND = "fedclust check --reference > docs/config.md"


def reference_markdown() -> str:
    """docs/config.md: every key of the core sections and of each built-in
    algorithm's section, from the schema's declarations (type or choices,
    default, meaning, whether a continued run may change it), so that the
    reference cannot drift from the code (tests/unit/test_docs.py)."""
    registry.load_builtin()

    def table(rows: list[dict]) -> list[str]:
        out = ["| key | default | values | meaning |", "| --- | --- | --- | --- |"]
        for r in rows:
            values = ", ".join(f"`{c}`" if c else '`""`' for c in r["choices"]) if r["choices"] else r["type"]
            meaning = (r["doc"] or r["help"]).replace("|", "\\|")
            if r["resumable"]:
                meaning += " *(may change when a run continues)*"
            out.append(f"| `{r['key']}` | `{r['default']}` | {values} | {meaning} |")
        return out

    lines = ["# Config reference", "",
             f"Generated from the config schema (`{REFERENCE_COMMAND}`); `tests/unit/test_docs.py` checks that it is",
             "current. Every key, its default, the values it takes and its meaning; `fedclust check --keys` prints",
             "the same keys with one-line meanings (and a plugin's, given `plugins=`). A config sets them in a YAML",
             "file or as `KEY=VALUE` overrides ([Running](running.md)). Ranges are checked before anything runs;",
             "an algorithm's section is checked when that algorithm runs. Keys marked *may change when a run",
             "continues* are the run length and output keys: any other key must keep its checkpoint's value",
             "([Runs that survive](running.md#runs-that-survive-checkpoints-and-resume)).", "",
             "## Core keys", ""]
    lines += table(key_records(Config))
    readers: dict[str, list[str]] = {}
    for cls in registry.classes():
        if cls.__module__.startswith("fedclust.algorithms."):
            for section in cls.sections:
                readers.setdefault(section, []).append(cls.name)
    for section in sorted(readers):
        lines += ["", f"## `{section}`", "", f"Read by {', '.join(f'`{n}`' for n in sorted(readers[section]))}.", ""]
        lines += table(key_records(SECTIONS[section], section + "."))
    return "\n".join(lines) + "\n"
