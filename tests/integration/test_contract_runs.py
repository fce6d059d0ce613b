"""The whole-run tests of tests/unit/test_contract.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

from __future__ import annotations

import json

import pytest
from record import GOLDEN_OVERRIDES, run_on_one_thread
from test_contract import ALGORITHM_PLUGINS, ROOT, _registered_by  # noqa: E402

from fedclust.algorithms import registry
from fedclust.config import load_config
from fedclust.errors import ConfigError


@pytest.mark.parametrize("path", ALGORITHM_PLUGINS)
def test_every_algorithm_plugin_runs_in_column_blocks_or_is_refused_them(tmp_path, path):
    """exchange_mb=1: an algorithm plug-in that declares column_exchange runs (4 rounds, one process); one that
    does not is refused by the config check, naming exchange_mb; none fails inside a round."""
    names = _registered_by(path)
    assert names, f"{path} registers no algorithm"
    for name in names:
        args = GOLDEN_OVERRIDES + [f"plugins=[{ROOT / path}]", f"algorithm.name={name}", "exchange_mb=1",
                                   "rounds=4", "stage1_rounds=2", "ifca.restart_rounds=1", f"out={tmp_path / name}"]
        if not registry.get(name).column_exchange:
            with pytest.raises(ConfigError) as err:
                load_config(None, args)
            assert err.value.field == "exchange_mb" and "exchange_mb=0" in str(err.value), name
            continue
        run_on_one_thread(load_config(None, args))
        records = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in records] == [1, 2, 3, 4], name
