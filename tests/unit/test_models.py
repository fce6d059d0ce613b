"""Built-in models are plug-ins (fedclust/models/, one file each, found by a
registry): each gives the engine what it declares, its functional forwards
equal its reference module's, the config's choices come from the registry,
and a model added by one file trains through the engine with nothing else."""

import json

import pytest
import torch
from torch.func import functional_call

from fedclust.config import load_config
from fedclust.engine.layout import ParamLayout
from fedclust.errors import ConfigError
from fedclust.models import MODELS, build_model, builtin
from fedclust.runner import prepare, run

SHAPES = {"cnn": (3, 32, 32)}   # the others take any input: a small image


def _shape(name):
    return SHAPES.get(name, (1, 6, 6))


@pytest.mark.parametrize("name", MODELS.builtin_names())
def test_every_builtin_model_gives_the_engine_what_it_declares(name):
    m, shape, classes = builtin(name), _shape(name), 4
    assert m.name == name and builtin(name) is m                 # one shared object per model
    module = build_model(name, shape, classes)
    layout = ParamLayout.from_module(module)
    g = torch.Generator().manual_seed(0)
    flat = torch.randn(3, layout.numel, generator=g) * 0.1      # three clients' weights
    x = torch.randn(3, 5, *shape, generator=g)
    params = layout.views(flat)
    batched = m.batched_forward(params, x)
    for c in range(3):   # the reference module with client c's weights: a plain, independent path
        own = {k: v[c] for k, v in params.items()}
        want = functional_call(module, own, (x[c],))
        torch.testing.assert_close(m.forward(own, x[c]), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(batched[c], want, rtol=1e-4, atol=1e-5)   # grouped convolutions round apart
    assert m.activation_bytes(shape, 4) > 4 * torch.Size(shape).numel()
    assert m.cpu_chunk is None or m.cpu_chunk >= 1
    if m.dense_layers:   # the hand-written backward's layers are the module's linear layers, in order
        linears = [n for n, sub in module.named_modules() if isinstance(sub, torch.nn.Linear)]
        assert list(m.dense_layers) == linears
    assert m.check_input(shape) is None


def test_the_cnn_says_what_inputs_it_needs():
    assert "18x18" in builtin("cnn").check_input((1, 12, 12))
    with pytest.raises(ConfigError, match="18x18"):
        build_model("cnn", (1, 12, 12), 10)


def test_the_config_takes_its_model_choices_and_aliases_from_the_registry():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model=logistic", "data.name=synthetic"])
    assert e.value.field == "model" and "did you mean 'logreg'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["model=resnet", "data.name=synthetic"])
    assert all(n in str(e.value) for n in MODELS.builtin_names())


def test_a_model_added_by_one_file_trains_through_the_engine(tmp_path):
    plugin = "tests/plugins/tiny_model.py"
    cfg = load_config(None, [f"plugins=[{plugin}]", "model=tinynet", "data.name=synthetic", "clients=4", "rounds=2",
                             "stage1_rounds=1", "data.train_size=20", "data.test_size=10", "algorithm.name=local",
                             "progress=false", "figures=false", f"out={tmp_path / 'r'}"])
    assert "tinynet" in MODELS.names() and "tinynet" not in MODELS.builtin_names()
    summary = run(cfg, prepare(cfg))
    assert summary["model"] == "tinynet" and summary["model_engine"] == "hand-written"
    records = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert records[1]["train_loss"] < records[0]["train_loss"]    # it learns
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"plugins=[{plugin}]", "model=tiny", "data.name=synthetic"])
    assert "did you mean 'tinynet'" in str(e.value)
