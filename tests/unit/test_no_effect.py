"""No key is silently ignored (issue 44, part 2): a key set where it has no effect is refused, naming it, why and
the fix; another algorithm's section is refused unless the config says it is shared (``other_sections``); a
method that looks for another number of clusters than the data has is warned at start."""

from __future__ import annotations

import pytest
import yaml

from fedclust.config import dump, load_config
from fedclust.errors import ConfigError

BASE = ["clients=8", "rounds=40", "stage1_rounds=2", "data.name=synthetic", "algorithm.k=2", "algorithm.l=3"]


@pytest.mark.parametrize("key,value,context,fix", [
    ("network.path", "edges.txt", [], "set network.graph=file"),
    ("network.degree", "3", ["network.graph=ring"], "network.graph=regular"),
    ("network.p_edge", "0.5", ["network.graph=regular"], "network.graph=erdos_renyi"),
    ("network.rewire", "0.3", [], "network.graph=small_world"),
    ("network.redraw_every", "5", [], "choose a random network.graph"),
    ("network.redraw_every", "5", ["network.graph=ring", "algorithm.k=2"], "choose a random network.graph"),
    ("network.straggler_work", "0.3", [], "set network.stragglers > 0"),
    ("attack.kind", "gaussian", [], "set attack.fraction > 0"),
    ("attack.scale", "3", ["attack.fraction=0.2", "attack.kind=label_flip"], "drop the key"),
])
def test_a_network_or_attack_key_without_effect_is_refused(key, value, context, fix):
    args = BASE + ["algorithm.name=random", *context]
    load_config(None, args)                                   # the context alone is valid
    with pytest.raises(ConfigError) as e:
        load_config(None, args + [f"{key}={value}"])
    assert e.value.field == key and "has no effect on this run" in str(e.value) and fix in e.value.fix, str(e.value)


def test_the_same_keys_where_they_have_an_effect_are_taken():
    load_config(None, BASE + ["algorithm.name=random", "network.graph=regular", "network.degree=3",
                              "network.redraw_every=2", "network.stragglers=0.3", "network.straggler_work=0.4",
                              "attack.fraction=0.25", "attack.kind=gaussian", "attack.scale=2"])


@pytest.mark.parametrize("name,key", [("panm_grad", "dac.tau=10"), ("random", "dfca.clusters=4"),
                                      ("fedavg", "fedprox.mu=0.1"), ("ifca", "fedgroup.groups=3")])
def test_another_methods_section_is_refused_unless_the_config_is_shared(name, key):
    with pytest.raises(ConfigError) as e:
        load_config(None, BASE + [f"algorithm.name={name}", key])
    assert e.value.field == key.split("=")[0]
    assert f"not by algorithm.name = {name}" in str(e.value) and "other_sections=true" in str(e.value)
    load_config(None, BASE + [f"algorithm.name={name}", key, "other_sections=true"])


def test_a_section_read_by_the_method_and_a_dumped_config_load(tmp_path):
    """FedGrouProx reads fedgroup and fedprox; config.yaml, which writes every section at its values, loads back
    under another algorithm (its other sections at their defaults)."""
    cfg = load_config(None, BASE + ["algorithm.name=fedgrouprox", "fedgroup.groups=3", "fedprox.mu=0.1"])
    (tmp_path / "config.yaml").write_text(dump(load_config(None, BASE + ["algorithm.name=random"])))
    load_config(str(tmp_path / "config.yaml"), ["algorithm.name=ifca"])
    assert cfg.fedgroup.groups == 3
    assert "ifca" in yaml.safe_load(dump(cfg))


def test_a_cluster_count_unlike_the_datas_is_warned_once(capsys):
    load_config(None, BASE + ["algorithm.name=ifca", "ifca.clusters=4", "data.num_clusters=2"])
    err = capsys.readouterr().err
    assert err.count("warning: ifca.clusters = 4 but the data has 2 clusters (data.num_clusters)") == 1
    for args in (["algorithm.name=ifca", "ifca.clusters=3", "data.num_clusters=3"],
                 ["algorithm.name=dfca", "data.num_clusters=2"]):
        load_config(None, BASE + args)
        assert "warning" not in capsys.readouterr().err
    load_config(None, BASE + ["algorithm.name=facade", "data.num_clusters=4", "model=mlp"])
    assert "facade.heads = 2 but the data has 4 clusters" in capsys.readouterr().err
