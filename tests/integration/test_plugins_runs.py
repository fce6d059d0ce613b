"""The whole-run tests of tests/unit/test_plugins.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import subprocess
import sys
from pathlib import Path

import pytest
from run_files import FAULTED_ON_TWO, RESUMED_ON_TWO, golden, golden_here, metrics, results

from fedclust.algorithms import registry
from fedclust.config import load_config, run_facts
from fedclust.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))

from test_plugins import FAILING, PLUGIN, ROOT  # noqa: E402


@pytest.mark.xdist_group("one_and_two")   # launched with the other 1-and-2-process runs (conftest.py)
def test_an_outside_algorithm_runs_on_one_and_two_processes(one_and_two):
    one, two = (metrics(one_and_two[n] / "outside" / "threshold_gossip") for n in (1, 2))
    assert [r["round"] for r in one] == list(range(1, 9))
    for a, b in zip(one, two):
        assert a["neighbor_precision"] == pytest.approx(b["neighbor_precision"], abs=1e-12)
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=0.01)
    assert any(r["models_received_total"] > 0 for r in one)    # it did average with someone
    # its section is a config section like any other: listed, typed, validated, saved
    out = subprocess.run([sys.executable, "-m", "fedclust", "check", "--keys", f"plugins=[{PLUGIN}]"], cwd=ROOT,
                         capture_output=True, text=True).stdout.split()
    assert "threshold_gossip.threshold" in out
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"plugins=[{PLUGIN}]", "algorithm.name=threshold_gossip", "threshold_gossip.threshold=2",
                           "data.name=synthetic"])
    assert e.value.field == "threshold_gossip.threshold"
    saved = load_config(one_and_two[1] / "outside" / "threshold_gossip" / "config.yaml")
    assert saved.threshold_gossip.threshold == 0.3


def test_a_plugin_may_build_on_another():
    """The failing test plug-in subclasses the example: loading both (in
    either order, twice) registers each once; it shares the example's section."""
    for plugins in (f"[{FAILING},{PLUGIN}]", f"[{PLUGIN},{FAILING}]"):
        cfg = load_config(None, [f"plugins={plugins}", "algorithm.name=failing_gossip", "data.name=synthetic",
                                 "threshold_gossip.threshold=0.2", "failing_gossip.rank=1", "failing_gossip.round=3"])
        algo = registry.build(cfg, run_facts(cfg))
        assert isinstance(algo, registry.get("threshold_gossip")) and algo.gathers_before
        assert (algo.threshold_gossip.threshold, algo.failing_gossip.rank, algo.failing_gossip.round) == (0.2, 1, 3)
    assert {"threshold_gossip", "failing_gossip"} <= set(registry.names())


@pytest.mark.xdist_group("one_and_two")   # launched with the other 1-and-2-process runs (conftest.py)
@pytest.mark.parametrize("name", [n for n in registry.builtin_names()
                                  if n not in RESUMED_ON_TWO and n not in FAULTED_ON_TWO])
def test_every_registered_algorithm_runs_on_two_processes_as_on_one(one_and_two, name):
    """On 2 processes, one thread each, a run equals the golden (1-process) files bit for bit where they were
    recorded with this torch and CPU. The algorithms in RESUMED_ON_TWO are compared so by test_resume.py,
    after a kill and a resume on 2 processes; those in FAULTED_ON_TWO by test_network.py, on 1 and 2 processes
    under several network faults at once."""
    two = one_and_two[2] / "golden" / name
    if golden_here():
        assert results(two) == golden(name)
        return
    golden_records, two = golden(name)[0], results(two)[0]
    assert len(two) == len(golden_records)
    for a, b in zip(golden_records, two):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=0.01), a["round"]
        assert a["models_received_total"] == b["models_received_total"]
        for key in ("neighbor_precision", "neighbor_recall", "num_clusters", "ari"):
            assert a.get(key) == pytest.approx(b.get(key), abs=1e-9), (key, a["round"])
