"""Config loading, overrides and validation errors (field, value, fix)."""

from pathlib import Path

import pytest

from fedclust.config import Config, load_config, parse_override, valid_keys
from fedclust.errors import ConfigError

CONFIGS = sorted(Path(__file__).resolve().parent.parent.joinpath("configs").glob("*.yaml"))
REQUIRED_KEYS = ["algorithm.name", "algorithm.k", "algorithm.l", "data.name", "data.root", "data.clusters",
                 "data.num_clusters", "data.train_size", "data.test_size", "clients", "rounds",
                 "stage1_rounds", "seed", "out", "device"]


def test_required_keys_exist():
    keys = valid_keys()
    for k in REQUIRED_KEYS:
        assert k in keys


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_file_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, Config)
    assert cfg.clients >= 2


def test_fmnist_rotation2_is_the_paper_setting():
    cfg = load_config(Path(__file__).resolve().parent.parent / "configs/fmnist_rotation2.yaml")
    assert (cfg.data.name, cfg.data.clusters, cfg.data.num_clusters) == ("fmnist", "rotation", 2)
    assert (cfg.clients, cfg.algorithm.l, cfg.algorithm.k, cfg.data.train_size) == (100, 10, 5, 200)
    assert (cfg.rounds, cfg.stage1_rounds) == (300, 100)


def test_overrides_are_typed():
    cfg = load_config(None, ["algorithm.k=3", "train.lr=0.1", "data.share_images=true", "algorithm.name=oracle"])
    assert cfg.algorithm.k == 3 and cfg.train.lr == 0.1 and cfg.data.share_images is True
    assert cfg.algorithm.name == "oracle"
    assert parse_override("out=runs/x") == ("out", "runs/x")


def test_unknown_key_names_closest():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algoritm.k=3"])
    assert "algoritm.k" in str(e.value) and "algorithm.k" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["data.train_sise=3"])
    assert "data.train_size" in str(e.value)


def test_unknown_key_in_file(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("algorithm:\n  nme: random\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "algorithm.nme" in str(e.value) and "algorithm.name" in str(e.value)


def test_wrong_type_names_field_and_value():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["clients=many"])
    assert e.value.field == "clients" and e.value.value == "many"


def test_unknown_algorithm_suggests():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=randm"])
    assert "random" in str(e.value) and e.value.field == "algorithm.name"


def test_k_not_smaller_than_clients():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algorithm.name=random", "clients=10", "algorithm.k=10"])
    assert e.value.field == "algorithm.k" and "at most 9" in str(e.value)


def test_l_larger_than_other_clients():
    from fedclust.algorithms import registry

    name = "panm_grad" if "panm_grad" in registry.names() else None
    if name is None:
        pytest.skip("no algorithm using l is registered yet")
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"algorithm.name={name}", "clients=10", "algorithm.l=10", "algorithm.k=3"])
    assert e.value.field == "algorithm.l" and "9" in str(e.value)


def test_cuda_where_there_is_none():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(ConfigError) as e:
        load_config(None, ["device=cuda"])
    assert e.value.field == "device" and "device=cpu" in str(e.value)


def test_missing_config_file():
    with pytest.raises(ConfigError) as e:
        load_config("nope.yaml")
    assert "nope.yaml" in str(e.value)
