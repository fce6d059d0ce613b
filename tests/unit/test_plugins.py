"""The plug-in boundary: an algorithm defined outside fedclust (the example,
examples/threshold_gossip.py) runs through ``fedclust run`` on 1 and 2
processes; every registered algorithm (taken from the registry) conforms to
the base and runs on 2 processes as on 1; layers import downward only and
nothing in the product imports the tools on top (bench, CLI)."""

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedclust.algorithms import registry
from fedclust.algorithms.base import Algorithm, Context, PeerAlgorithm
from fedclust.config import load_config, run_facts
from fedclust.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = str(ROOT / "examples" / "threshold_gossip.py")           # the example docs/adding-an-algorithm.md points to
FAILING = str(ROOT / "tests" / "plugins" / "failing_gossip.py")    # it, with a rank that raises
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from record import GOLDEN_OVERRIDES  # noqa: E402


def launch(nproc, args):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "fedclust", "run", *args] if nproc == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        "-m", "fedclust", "run", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(x) for x in (Path(args[-1].split("=", 1)[1]) / "metrics.jsonl").read_text().splitlines()]


def test_registry_refuses_duplicates_and_unknown_names():
    with pytest.raises(ValueError, match="registered twice"):
        @registry.register
        class Again(PeerAlgorithm):
            name = "random"
    with pytest.raises(ConfigError) as e:
        registry.get("randm")
    assert e.value.field == "algorithm.name" and "random" in str(e.value)


@pytest.mark.parametrize("name", registry.builtin_names())
def test_every_registered_algorithm_conforms(name):
    cls = registry.get(name)
    assert issubclass(cls, Algorithm) and cls.name == name and cls.topology in ("peer", "server")
    cfg = load_config(None, GOLDEN_OVERRIDES + [f"algorithm.name={name}"])
    for section, section_cls in cls.sections.items():
        assert dataclasses.is_dataclass(section_cls) and isinstance(getattr(cfg, section), section_cls)
        getattr(cfg, section).validate(cfg)
    algo = registry.build(cfg, run_facts(cfg))
    n, P = cfg.clients, 12
    ids = torch.arange(2, 5)
    ctx = Context(n=n, client_ids=ids, clusters=torch.arange(n) % 2, seed=1, stage1_rounds=cfg.stage1_rounds,
                  w0=torch.randn(P, generator=torch.Generator().manual_seed(0)), device=torch.device("cpu"),
                  pair_loss=lambda m, o: m.pow(2).mean(1), pool_loss=lambda m, p: m[p].pow(2).mean(-1))
    if name in ("ifca", "dfca", "fedspd"):   # further cluster models from the model's init: one of P params
        algo.init_model = lambda seed: torch.randn(P, generator=torch.Generator().manual_seed(seed))
    state = algo.init(ctx)
    saved = algo.state_dict(state)
    assert set(saved) == {"clients", "server"}
    for rows in saved["clients"].values():
        assert rows is None or rows.shape[0] == len(ids)
    back = algo.load_state_dict(ctx, saved)
    assert type(back) is type(state)
    if state is not None:
        for f in dataclasses.fields(state):
            a, b = getattr(state, f.name), getattr(back, f.name)
            same = torch.equal(a.isnan() if a.is_floating_point() else a, b.isnan() if b.is_floating_point() else b) \
                and torch.equal(a.nan_to_num(), b.nan_to_num()) if isinstance(a, torch.Tensor) else a == b
            assert same, f.name


# ----------------------------------------------------------------------------
# Layers


LAYERS = [
    {"fedclust.errors", "fedclust.rng", "fedclust.importing", "fedclust.lists", "fedclust.sizes", "fedclust.registry",
     "fedclust.__version__"},
    {"fedclust.schema"},
    {"fedclust.configfile"},                  # reading a config file and overrides into the schema's keys
    # the engine trains a built model (a Net), never names one: below the models
    {"fedclust.engine", "fedclust.dist", "fedclust.identity", "fedclust.metrics", "fedclust.peers", "fedclust.network",
     "fedclust.attack", "fedclust.theory", "fedclust.progress"},
    {"fedclust.models"},                      # the models know nothing of data sets
    {"fedclust.data"},                        # a data set names its default model
    {"fedclust.runmodel"},                    # the run's model: the data set's inputs and classes, built once
    {"fedclust.algorithms"},
    {"fedclust.config", "fedclust.outputs", "fedclust.figures", "fedclust.report", "fedclust.checkpoint",
     "fedclust.tracking", "fedclust.evaluation", "fedclust.stopping", "fedclust.rank", "fedclust.state",
     "fedclust.upgrade", "fedclust.rank0", "fedclust.exchange", "fedclust.export", "fedclust.trust",
     "fedclust.setting"},
    {"fedclust.round"},
    {"fedclust.runner"},
    {"fedclust.bench"},                       # the measurement tools: beside the CLI, above the product
    {"fedclust.cli", "fedclust.__main__"},
]
TOOLS = ("fedclust.bench", "fedclust.cli", "fedclust.__main__")   # the top: nothing in the product imports them


def _layer(module: str) -> int:
    for i, group in enumerate(LAYERS):
        if any(module == g or module.startswith(g + ".") for g in group):
            return i
    raise AssertionError(f"{module} is in no layer of this test")


def _imports(path: Path):
    """(imported fedclust module, at top level?) of a source file."""
    tree = ast.parse(path.read_text())
    top = set(id(n) for n in tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedclust"):
            names = [f"{node.module}.{a.name}" for a in node.names]
            for full in names:
                path = full.replace(".", "/")   # a module, or a package (its __init__.py)
                known = f"{path}.py" in _FILES or f"{path}/__init__.py" in _FILES or any(full in g for g in LAYERS)
                yield (full if known else node.module), id(node) in top
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("fedclust"):
                    yield a.name, id(node) in top


_FILES = {str(p.relative_to(ROOT)).replace(os.sep, "/") for p in (ROOT / "fedclust").rglob("*.py")}


def test_layers_import_downward_only_and_never_inside_functions():
    for rel in sorted(_FILES):
        module = rel[:-3].replace("/", ".").removesuffix(".__init__")
        if module == "fedclust":
            continue   # the package's own __init__ (a docstring and the version)
        here = _layer(module)
        for target, at_top in _imports(ROOT / rel):
            if module == "fedclust.cli" or (module, target) == ("fedclust.algorithms.registry", "fedclust.algorithms"):
                continue   # the CLI imports subcommands when called; the registry walks its own package
            assert at_top, f"{module} imports {target} inside a function"
            assert _layer(target) <= here, f"{module} (layer {here}) imports {target} (layer {_layer(target)})"


FORBIDDEN_IN_ALGORITHMS = ("torch.distributed", "fedclust.dist", "fedclust.models")


def test_no_algorithm_touches_the_transport_or_builds_a_model():
    """Algorithms get the round's models through the view, collectives through ``ctx.all_reduce`` and the model
    through RunFacts: none imports (or names) torch.distributed, fedclust.dist or fedclust.models."""
    for path in sorted((ROOT / "fedclust" / "algorithms").rglob("*.py")):   # an algorithm's package too (fpfc/)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                assert not _in(name, FORBIDDEN_IN_ALGORITHMS), f"{path.name} imports {name}"
        assert "torch.distributed" not in path.read_text(), path.name


def _in(module: str, packages) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


# The modules of fedclust.algorithms that the rest of fedclust may import: the contract (base), the registry, and
# the math several methods share.  Every other module there is one algorithm's, or a part of one (the fpfc
# package): the core names no algorithm (a checkpoint's older state is the algorithm's own upgrade_state).
SHARED_ALGORITHM_MODULES = (
    "fedclust.algorithms",               # the package itself (the registry walks it)
    "fedclust.algorithms.base",          # Algorithm, PeerAlgorithm, Context, RoundView, RunFacts, ...
    "fedclust.algorithms.registry",
    "fedclust.algorithms.aggregation",   # participation, averages, the gossip
    "fedclust.algorithms.peer_counts",   # stage-one counts (the loop state keeps them)
    "fedclust.algorithms.similarity",    # PANM's similarities (fedclust bench-scale sizes their blocks)
    "fedclust.algorithms.cluster_models",   # several models per client or cluster (IFCA, DFCA, Facade, FedSPD)
    "fedclust.algorithms.heads",         # a personal head and a graph of a method's own (DePRL, Facade, FedSPD)
)


def test_no_module_outside_the_algorithms_imports_a_specific_algorithm():
    """Outside fedclust/algorithms/ (the runner, checkpoints, upgrade, report, bench, CLI, launch) only the
    shared modules are imported; a module that defines a registered algorithm is never one of them."""
    registry.load_builtin()
    defining = {cls.__module__ for cls in registry.classes() if cls.__module__.startswith("fedclust.algorithms.")}
    assert len(defining) >= 15 and not any(_in(m, SHARED_ALGORITHM_MODULES[1:]) for m in defining), defining
    outside = [p for p in sorted((ROOT / "fedclust").rglob("*.py")) + sorted((ROOT / "launch").rglob("*.py"))
               if not _in(str(p.relative_to(ROOT))[:-3].replace(os.sep, "."), ("fedclust.algorithms",))]
    assert len(outside) > 50
    for path in outside:
        for target, _ in _imports(path):
            if _in(target, ("fedclust.algorithms",)):
                assert target in SHARED_ALGORITHM_MODULES, \
                    f"{path.relative_to(ROOT)} imports {target}, a specific algorithm's module: give the core a " \
                    "hook on Algorithm instead (as upgrade_state), or move what it needs into a shared module"


def test_nothing_in_the_product_imports_the_tools():
    """The bench tools and the CLI sit on top: the runner, engine, algorithms,
    data, ... import neither, not even inside a function."""
    for rel in sorted(_FILES):
        module = rel[:-3].replace("/", ".").removesuffix(".__init__")
        if _in(module, TOOLS):
            continue
        for target, _ in _imports(ROOT / rel):
            assert not _in(target, TOOLS), f"{module} imports {target}, a tool above the product"


def test_a_file_is_read_afresh_in_each_process_and_leaves_no_bytecode_beside_it(tmp_path):
    """An edit that keeps the file's size and modification second (what a .pyc's check compares) is seen by the
    next process: a named file is compiled from its text, never from a cached .pyc, and none is written."""
    path = tmp_path / "mine.py"
    read = ("import sys; sys.dont_write_bytecode = False\nfrom fedclust.importing import import_target\n"
            f"print(import_target({str(path)!r}, 'plugins', 'fix').VALUE)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    seen = []
    for value in (1, 2):
        path.write_text(f"VALUE = {value}\n")
        os.utime(path, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
        seen.append(subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, env=env,
                                   cwd=Path(__file__).resolve().parents[2], timeout=60).stdout.strip())
    assert seen == ["1", "2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.py"]
