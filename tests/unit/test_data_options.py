"""data.options: keyword arguments of a torchvision:NAME class (EMNIST's split), given in YAML or on the command
line, passed to the class, checked against its signature, refused for data sets that take none, and part of
the run's identity (config.yaml, resume).  The torchvision class is a fake set on torchvision.datasets."""

from __future__ import annotations

import pytest
import torch
import yaml

from fedclust import checkpoint
from fedclust.configfile import dump, parse
from fedclust.data import check_data, load_federated, registry
from fedclust.errors import ConfigError
from fedclust.schema import DataConfig, to_dict


class FakeBase:
    """As torchvision's MNIST: root, train, transform, download."""

    def __init__(self, root, train=True, transform=None, download=False):
        self.root, self.train = root, train


class FakeEMNIST(FakeBase):
    """As torchvision's EMNIST: a required split, the rest passed on to the base; a split of its own number of
    classes, images 6x6."""

    splits = ("balanced", "letters")
    calls: list[dict] = []

    def __init__(self, root, split, **kwargs):
        if split not in self.splits:
            raise ValueError(f"Unknown value '{split}' for argument split. Valid values are {self.splits}.")
        super().__init__(root, **kwargs)
        FakeEMNIST.calls.append(dict(split=split, train=self.train))
        classes = 4 if split == "balanced" else 3
        n = (12 if self.train else 6) * classes
        g = torch.Generator().manual_seed(classes + 10 * self.train)
        self.data = torch.randint(0, 256, (n, 6, 6), generator=g, dtype=torch.uint8)
        self.targets = torch.arange(n) % classes


class Opaque:
    """A constructor whose signature says nothing (``*args, **kwargs``): only calling it finds a wrong keyword."""

    def __init__(self, root, *args, **kwargs):
        FakeBase.__init__(self, root, *args, **kwargs)


@pytest.fixture
def fake(monkeypatch):
    from torchvision import datasets

    monkeypatch.setattr(datasets, "FakeEMNIST", FakeEMNIST, raising=False)
    monkeypatch.setattr(datasets, "Opaque", Opaque, raising=False)
    FakeEMNIST.calls = []
    return FakeEMNIST


def cfg_of(tmp_path, name="torchvision:FakeEMNIST", **options) -> DataConfig:
    return DataConfig(name=name, root=str(tmp_path), download=False, train_size=4, test_size=2,
                      options=dict(options))


def test_options_from_yaml_and_the_command_line_merge_and_are_recorded_in_config_yaml():
    cfg = parse({"data": {"name": "torchvision:EMNIST", "options": {"split": "balanced"}}})
    assert cfg.data.options == {"split": "balanced"}
    assert yaml.safe_load(dump(cfg))["data"]["options"] == {"split": "balanced"}      # config.yaml keeps them
    assert parse({}, ["data.options.split=letters"]).data.options == {"split": "letters"}
    assert parse({}, ["data.options={split: letters, compat: false}"]).data.options == {"split": "letters",
                                                                                       "compat": False}
    both = parse({"data": {"options": {"split": "balanced", "compat": True}}}, ["data.options.split=digits"])
    assert both.data.options == {"split": "digits", "compat": True}          # a key given replaces its value
    assert parse({"data": {"options": {"split": "x", "compat": True}}},
                 ["data.options.compat=null"]).data.options == {"split": "x"}  # null drops a key
    assert parse({"data": {"options": {"split": "x"}}}, ["data.options={}"]).data.options == {}
    assert DataConfig().options == {} and parse({}).data.options == {}
    for bad, field in (("data.options=balanced", "data.options"), ("data.options.split={a: 1}", "data.options.split"),
                       ("data.options={1: a}", "data.options")):
        with pytest.raises(ConfigError) as e:
            parse({}, [bad])
        assert e.value.field == field, bad


def test_the_options_reach_the_torchvision_class_and_key_its_cache(tmp_path, fake):
    letters = cfg_of(tmp_path, split="letters")
    d = load_federated(letters, 3, 0)
    assert {(c["split"], c["train"]) for c in fake.calls} == {("letters", True), ("letters", False)}
    assert d.num_classes == 3 and d.train_x.shape == (3, 4, 1, 6, 6)
    ds = registry.get(letters.name)
    balanced = cfg_of(tmp_path, split="balanced")                 # same class and root: another split
    assert ds.num_classes(balanced) == 4 and ds.num_classes(letters) == 3
    assert ("balanced", True) in {(c["split"], c["train"]) for c in fake.calls}


@pytest.mark.parametrize("options, words", [
    ({}, ["needs the argument 'split'", "balanced, letters", "data.options.split=VALUE"]),
    ({"splt": "letters"}, ["takes no argument 'splt'", "did you mean 'split'?", "split"]),
    ({"split": "nope"}, ["refused them", "ValueError", "Unknown value 'nope'"]),
    ({"split": "letters", "root": "/x"}, ["'root' is not an option", "data.root"]),
    ({"split": "letters", "transform": "x"}, ["'transform' is not an option", "no transform applies"]),
])
def test_a_wrong_option_names_data_options_and_the_class(tmp_path, fake, options, words):
    with pytest.raises(ConfigError) as e:
        check_data(cfg_of(tmp_path, **options), 3)
    assert e.value.field == "data.options" and e.value.value == options
    assert "torchvision.datasets.FakeEMNIST" in str(e.value)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_a_keyword_only_the_call_can_refuse_still_names_data_options(tmp_path, fake):
    with pytest.raises(ConfigError) as e:
        check_data(cfg_of(tmp_path, "torchvision:Opaque", colour="red"), 3)
    assert e.value.field == "data.options" and "torchvision.datasets.Opaque refused them" in str(e.value)
    assert "colour" in str(e.value)


@pytest.mark.parametrize("name, extra", [("fmnist", {}), ("mnist", {}), ("synthetic", {}),
                                         ("npz", {"path": "nowhere.npz"})])
def test_data_sets_that_take_no_options_refuse_them_before_reading(tmp_path, name, extra):
    cfg = DataConfig(name=name, root=str(tmp_path / "empty"), download=False, options={"split": "balanced"},
                     **extra)
    with pytest.raises(ConfigError) as e:
        check_data(cfg, 4)
    assert e.value.field == "data.options" and e.value.value == {"split": "balanced"}
    assert f"data set '{name}' takes no options" in str(e.value) and "drop data.options" in str(e.value)


def test_options_are_part_of_the_run_identity_on_resume():
    a = parse({"data": {"name": "torchvision:EMNIST", "options": {"split": "balanced"}}})
    b = parse({"data": {"name": "torchvision:EMNIST", "options": {"split": "letters"}}})
    assert checkpoint.config_differences(to_dict(a), to_dict(b)) == ["data.options.split"]
    assert checkpoint.config_differences(to_dict(a), to_dict(a)) == []
    old = to_dict(parse({}))
    del old["data"]["options"]                                    # a checkpoint from before the key
    assert checkpoint.config_differences(old, to_dict(parse({}))) == []
