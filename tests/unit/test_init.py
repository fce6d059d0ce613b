"""train.init: every client from one model (common, the default) or each from its own (per_client, as
decentralizepy's DAC, DePRL, D-PSGD and Facade nodes start): each row is the model's default init under a seed of
(run seed, client) alone, so it does not depend on the processes; server methods refuse it."""

from __future__ import annotations

import pytest
import torch

from fedclust.algorithms.base import Context
from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.models import initial_weights
from fedclust.runmodel import client_seed, run_model

BASE = ["data.name=synthetic", "clients=6", "model=mlp", "algorithm.k=2"]


def test_client_seeds_are_a_function_of_seed_and_client_alone():
    seeds = [client_seed(3, i) for i in range(50)]
    assert seeds == [client_seed(3, i) for i in range(50)]            # deterministic
    assert len(set(seeds)) == 50 and 3 not in seeds                    # one a client, never the run's own
    assert seeds != [client_seed(4, i) for i in range(50)]
    assert all(0 <= s < 2**32 for s in seeds)


def test_each_client_row_is_the_default_init_under_its_seed_and_any_shard_gives_the_same_rows():
    cfg = load_config(None, BASE + ["algorithm.name=dac", "train.init=per_client", "seed=5"])
    model = run_model(cfg)
    rows = model.client_rows(torch.arange(6))
    for i in range(6):   # the plain rule: build the model under the client's seed
        assert torch.equal(rows[i], initial_weights(model.spec, model.input_shape, model.classes,
                                                    client_seed(5, i))[1])
    assert not torch.equal(rows[0], rows[1]) and not torch.equal(rows[0], model.w0)
    assert torch.equal(model.client_rows(torch.tensor([4, 1])), rows[[4, 1]])   # a process's shard: its rows
    assert model.client_rows(torch.tensor([], dtype=torch.int64)).shape == (0, model.parameters)


def test_the_loop_starts_from_the_given_rows():
    from fedclust.rank import Shard  # noqa: F401  (the state takes a shard)
    from fedclust.state import LoopState

    class Algo:
        def init(self, ctx):
            return None

    class FakeShard:
        client_ids = torch.arange(3)
        device = torch.device("cpu")

    w0 = torch.zeros(4)
    ctx = Context(n=3, client_ids=torch.arange(3), clusters=torch.zeros(3, dtype=torch.int64), seed=0,
                  stage1_rounds=0, w0=w0, device=torch.device("cpu"))
    rows = torch.arange(12.0).reshape(3, 4)
    assert torch.equal(LoopState.fresh(FakeShard(), ctx, Algo(), None, rows).flat, rows)
    assert torch.equal(LoopState.fresh(FakeShard(), ctx, Algo(), None).flat, w0.expand(3, -1))


@pytest.mark.parametrize("name", ["fedavg", "ifca", "cfl"])
def test_server_methods_refuse_per_client_naming_the_key(name):
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + [f"algorithm.name={name}", "train.init=per_client"])
    assert err.value.field == "train.init" and "train.init=common" in str(err.value)


def test_a_bad_value_is_refused_naming_the_choices():
    with pytest.raises(ConfigError) as err:
        load_config(None, BASE + ["algorithm.name=dac", "train.init=random"])
    assert err.value.field == "train.init" and "per_client" in str(err.value)
