"""Partial sharing (config ``share.personal``): which tensors a name,
prefix or ``head`` picks, the checks that refuse what cannot run, and a
peer round that averages the shared columns and leaves each client its own
trained personal columns, against the mean written plainly."""

from __future__ import annotations

import pytest
import torch

from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.random_peers import RandomPeers
from fedclust.config import load_config, run_facts
from fedclust.errors import ConfigError
from fedclust.peers import as_mask

SMALL = ["data.name=synthetic", "clients=8", "model=mlp"]


def layout(model="mlp"):
    return run_facts(load_config(None, [f"model={model}"])).layout


def test_names_prefixes_and_head_pick_tensors():
    mlp = layout()
    assert mlp.select(["head"]) == (4, 5)                          # fc3.weight, fc3.bias
    assert mlp.select(["fc1.bias", "fc3"]) == (1, 4, 5)
    assert layout("cnn").select(["head"]) == (8, 9)                # fc2
    with pytest.raises(ValueError, match="'fc9' names none"):
        mlp.select(["fc9"])
    off, size = mlp.offsets, mlp.sizes
    assert mlp.column_ranges((4, 5)) == ((off[4], off[5] + size[5]),)                  # adjacent: one range
    assert mlp.column_ranges((1, 4)) == ((off[1], off[1] + size[1]), (off[4], off[4] + size[4]))


@pytest.mark.parametrize("extra,why", [
    (["share.personal=[fc9]"], "names none"),
    (["share.personal=[fc1,fc2,fc3]"], "nothing is shared"),
    (["share.personal=[head]", "algorithm.name=fedavg"], "fpfc.fuse=head"),
    (["share.personal=[head]", "algorithm.name=dfca"], "does not keep a personal part"),
])
def test_what_cannot_run_is_refused_naming_the_field(extra, why):
    with pytest.raises(ConfigError) as e:
        load_config(None, SMALL + extra)
    assert e.value.field == "share.personal" and why in str(e.value)


def test_a_peer_round_averages_the_shared_columns_and_keeps_the_personal_ones():
    n, P, k = 6, 10, 2
    personal = ((2, 4), (8, 10))
    algo = RandomPeers(k=k)
    after = torch.randn(n, P, generator=torch.Generator().manual_seed(0))
    ctx = Context(n=n, client_ids=torch.arange(n), clusters=None, seed=1, stage1_rounds=1, w0=torch.zeros(P),
                  device=torch.device("cpu"), personal=personal)
    _, result = algo.aggregate(None, ctx, RoundView(round=1, before=None, after=after, all_after=after))
    own = torch.zeros(P, dtype=torch.bool)
    for a, b in personal:
        own[a:b] = True
    for i, row in enumerate(as_mask(result.averaged)):
        peers = [i, *row.nonzero().flatten().tolist()]
        assert len(peers) == k + 1
        assert torch.allclose(result.models[i, ~own], after[peers][:, ~own].mean(0), atol=1e-6)
        assert torch.equal(result.models[i, own], after[i, own])


def test_a_run_with_a_personal_head_differs_from_one_sharing_everything(tmp_path):
    import json

    from fedclust.runner import prepare, run

    got = {}
    for name, extra in (("all", []), ("head", ["share.personal=[head]"])):
        cfg = load_config(None, SMALL + ["algorithm.name=random", "algorithm.k=2", "rounds=3", "stage1_rounds=1",
                                         "data.train_size=20", "data.test_size=10", "progress=false",
                                         "figures=false", f"out={tmp_path / name}"] + extra)
        run(cfg, prepare(cfg))
        got[name] = [json.loads(x)["accuracy"] for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    assert got["all"] != got["head"]
