"""The plug-in contract is safe by default (docs/adding-an-algorithm.md):
an algorithm opts in to the exchange in column blocks, and one that has not
is refused ``exchange_mb`` by the config check; the whole models of a round
that came in blocks raise a clear error rather than being None; the view
carries every client's reported training loss; a Context's loss function
that was not given raises naming it; an algorithm converts its own state of
an older checkpoint (``Algorithm.upgrade_state``, called for a plug-in as
for a built-in); and every algorithm plug-in of the examples and the tests
runs under ``exchange_mb`` or is refused by the config check, never fails
inside a round."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from fedclust import upgrade
from fedclust.algorithms import registry
from fedclust.algorithms.base import Algorithm, Context, LossNotGiven, PeerAlgorithm, RoundView, loss_given
from fedclust.config import load_config, load_plugin
from fedclust.dist import Collectives, ColumnBlocks, OneProcess
from fedclust.errors import ConfigError
from fedclust.exchange import exchange
from fedclust.rank import Shard

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "golden"))

LOWEST_LOSS = str(ROOT / "tests" / "plugins" / "lowest_loss.py")   # a method of view.all_loss, from the guide
# the files of the examples and the tests' plug-ins that define algorithms
ALGORITHM_PLUGINS = sorted(str(p.relative_to(ROOT)) for p in [*ROOT.glob("examples/*.py"),
                                                               *ROOT.glob("tests/plugins/*.py")]
                           if "fedclust.algorithms" in p.read_text())

# The built-ins that read the round's models in column blocks (config exchange_mb), each by declaring
# column_exchange = True (itself, or a base that reads blocks: KPeers, FedAvg); the others are refused it.
IN_BLOCKS = ["deprl", "dfca", "epidemic", "facade", "fedavg", "fedprox", "fedspd", "fixtopology", "ifca", "local",
             "oracle", "panm_grad", "random"]


def test_the_exchange_in_column_blocks_is_opt_in():
    assert Algorithm.column_exchange is False and PeerAlgorithm.column_exchange is False

    class Plain(PeerAlgorithm):   # a plug-in that declares nothing reads whole models
        name = "plain_peer"

    assert Plain.column_exchange is False
    assert sorted(n for n in registry.builtin_names() if registry.get(n).column_exchange) == IN_BLOCKS


def test_the_reference_of_exchange_mb_names_exactly_the_algorithms_that_opt_in():
    """docs/config.md's ``exchange_mb`` row (the docstring under the field) lists the built-ins that declare
    column_exchange, no more and no fewer."""
    import re

    from fedclust.schema import Config, field_doc

    doc = field_doc(Config, "exchange_mb")
    named = sorted(set(re.findall(r"`([a-z_]+)`", doc)) & set(registry.builtin_names()))
    assert named == IN_BLOCKS, doc


def test_a_plugin_reading_whole_models_is_refused_blocks_by_the_config_check():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["plugins=[examples/threshold_gossip.py]", "algorithm.name=threshold_gossip",
                           "exchange_mb=1", "data.name=synthetic"])
    assert err.value.field == "exchange_mb" and "exchange_mb=0" in str(err.value)
    load_config(None, ["plugins=[examples/threshold_gossip.py]", "algorithm.name=threshold_gossip",
                       "data.name=synthetic"])


def test_whole_models_of_a_round_in_blocks_raise_a_clear_error():
    n, C, P = 6, 2, 11
    g = torch.Generator().manual_seed(0)
    after, before = torch.randn(n, P, generator=g), torch.randn(n, P, generator=g)
    blocks = ColumnBlocks(OneProcess("cpu"), {"after": after[:C], "before": before[:C]}, C, 4)
    view = RoundView(round=1, before=before[:C], after=after[:C], columns=blocks)
    for read in (lambda: view.all_after, lambda: view.all_before, view.whole_after):
        with pytest.raises(ValueError, match="came in column blocks .*column_exchange"):
            read()
    assert [(a, b) for a, b, _ in view.blocks(("after", "before"))] == [(0, 4), (4, 8), (8, 11)]
    whole = RoundView(round=1, before=before[:C], after=after[:C], all_after=after, all_before=before)
    assert whole.all_after is after and whole.whole_after() is after and whole.all_before is before
    whole.drop_before()
    assert whole.all_before is None and whole.before is None
    with pytest.raises(ValueError, match="gives all_after="):   # a view made by hand without the models
        _ = RoundView(round=1, before=None, after=after[:C]).all_after


@pytest.mark.parametrize("columns", [0, 3])
def test_the_view_carries_every_clients_reported_training_loss(columns):
    """fedclust.exchange puts the gathered training losses into view.all_loss, whole or in column blocks: the
    algorithm's own copy (the round checks the losses it returns for divergence)."""
    n, P = 4, 7
    shard = Shard(fabric=OneProcess("cpu"), rank=0, world=1, device=torch.device("cpu"), n=n,
                  client_ids=torch.arange(n), comm=Collectives(0, 1, 60.0))
    flat = torch.randn(n, P, generator=torch.Generator().manual_seed(1))
    loss = torch.tensor([0.5, math.nan, 1.5, 0.25])   # client 1 did not train
    view, all_loss, _ = exchange(shard, columns, 3, flat, None, loss, torch.zeros(n, 1))
    assert view.round == 3 and view.whole == (columns == 0)
    assert torch.equal(view.all_loss.isnan(), loss.isnan())
    assert torch.equal(view.all_loss.nan_to_num(), loss.nan_to_num())
    assert view.all_loss is not all_loss and torch.equal(all_loss.nan_to_num(), loss.nan_to_num())
    with pytest.raises(ValueError, match="all_loss="):   # a view made by hand without the losses
        _ = RoundView(round=1, before=None, after=flat).all_loss


def test_peers_of_lowest_reported_loss_are_chosen_from_the_view():
    load_plugin(LOWEST_LOSS)
    algo = registry.get("lowest_loss")(k=2)
    n = 6
    ctx = Context(n=n, client_ids=torch.arange(2, 5), clusters=None, seed=0, stage1_rounds=1, w0=torch.zeros(3),
                  device=torch.device("cpu"))
    loss = torch.tensor([0.9, 0.2, 0.3, math.nan, 0.1, 0.8])   # client 3 did not train
    view = RoundView(round=1, before=None, after=torch.zeros(3, 3), all_loss=loss)
    _, chosen = algo.select(None, ctx, view)
    assert [row.nonzero().flatten().tolist() for row in chosen] == [[1, 4], [1, 4], [1, 2]]


def test_a_context_loss_function_not_given_raises_naming_it():
    def ctx(**given):
        return Context(n=4, client_ids=torch.arange(2), clusters=None, seed=0, stage1_rounds=1, w0=torch.zeros(3),
                       device=torch.device("cpu"), **given)

    for c in (ctx(), ctx(pair_loss=None, pool_loss=None, sample_loss=None)):
        for name in ("pair_loss", "pool_loss", "sample_loss"):
            fn = getattr(c, name)
            assert isinstance(fn, LossNotGiven) and not loss_given(fn)
            with pytest.raises(ValueError, match=f"ctx.{name} was not given"):
                fn(torch.zeros(2, 3), torch.arange(2))
    given = ctx(pair_loss=lambda m, o: m.sum(1))
    assert loss_given(given.pair_loss) and not loss_given(given.pool_loss)
    assert torch.equal(given.pair_loss(torch.ones(2, 3), torch.arange(2)), torch.full((2,), 3.0))


def test_an_algorithm_converts_its_own_older_state_plugin_or_built_in():
    """fedclust.upgrade.checkpoint hands the algorithm's saved state to its upgrade_state (the core names no
    algorithm): a plug-in that renamed a field reads its older checkpoint; the default changes nothing."""
    calls = []

    class Renamed(PeerAlgorithm):
        name = "renamed_state"

        def upgrade_state(self, clients: dict, server: dict, n: int) -> None:
            calls.append(n)
            if "old" in clients:
                clients["new"] = clients.pop("old")
            server.setdefault("version", 2)

    rows = torch.arange(5)
    payload = {"stage1_peers": torch.zeros(5, 0, dtype=torch.int64), "stage1_counts": torch.zeros(5, 0),
               "final_lists": None, "history": [], "run_seconds": 0.0, "starts": 1, "weights": torch.zeros(5, 3),
               "algorithm": {"clients": {"old": rows}, "server": {}}}
    got = upgrade.checkpoint(payload, Renamed())
    assert calls == [5]
    assert got["algorithm"] == {"clients": {"new": rows}, "server": {"version": 2}}
    assert payload["algorithm"] == {"clients": {"old": rows}, "server": {}}   # the checkpoint as read is kept
    plain = upgrade.algorithm_state({"clients": {"old": rows}, "server": {"x": 1}}, Algorithm(), 5)
    assert plain == {"clients": {"old": rows}, "server": {"x": 1}}


def _registered_by(path: str) -> list[str]:
    """The algorithms the plug-in file ``path`` defines (loading it, once)."""
    load_plugin(str(ROOT / path))
    here = (ROOT / path).resolve()
    return sorted(n for n in registry.names()
                  if Path(sys.modules[registry.get(n).__module__].__file__ or "").resolve() == here)


def test_the_plugins_under_test_are_the_ones_expected():
    assert ALGORITHM_PLUGINS == ["examples/threshold_gossip.py", "tests/plugins/failing_gossip.py",
                                 "tests/plugins/lowest_loss.py", "tests/plugins/stalling_ifca.py"]


def test_an_algorithm_package_registers_once_and_keeps_its_names():
    """FPFC is a package (fedclust/algorithms/fpfc/): the registry's walk imports it, and importing every one of
    its modules again registers nothing twice; its names stay fedclust.algorithms.fpfc.NAME."""
    import fedclust.algorithms.fpfc as fpfc
    from fedclust.importing import import_submodules

    registry.load_builtin()
    import_submodules("fedclust.algorithms.fpfc")   # each part once more: no "registered twice"
    assert registry.get("fpfc") is fpfc.Fpfc and "fpfc" in registry.builtin_names()
    for name in ("Fpfc", "FpfcConfig", "FpfcState", "shard_sweep_", "server_update_", "from_literal", "scad",
                 "clusters_from_theta", "check_fpfc_memory", "head_layers", "pair_index", "CHUNK_ELEMENTS"):
        assert hasattr(fpfc, name), name
    assert set(fpfc.__all__) <= set(dir(fpfc))


def test_no_function_in_fedclust_is_over_sixty_lines():
    """A function of the package reads on one screen: none is over 60 lines, decorators and docstring in."""
    import ast

    long = []
    for path in sorted((ROOT / "fedclust").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                if node.end_lineno - start + 1 > 60:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not long, long
