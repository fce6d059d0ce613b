"""The round's exchange in column blocks (config ``exchange_mb``): the gossip
average, FedAvg's average and PANMGrad's similarity read the gathered models a block at a
time and give what the whole models give; the block size follows the
budget; algorithms that need whole peer models are refused; and runs with
blocks are identical on 1 and 2 processes, resume exactly, and equal runs without."""

from __future__ import annotations

import pytest
import torch

from fedclust.algorithms.aggregation import gossip, gossip_view, sparse_gossip
from fedclust.algorithms.base import RoundView
from fedclust.algorithms.similarity import POOL_BLOCK, grad_similarity, grad_similarity_pool
from fedclust.config import load_config
from fedclust.dist import ColumnBlocks, OneProcess, exchange_column_bytes, exchange_columns
from fedclust.errors import ConfigError


def _models(n, P, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, P, generator=g), torch.randn(n, P, generator=g)


def _mask(C, n, k, seed=1, offset=0):
    """[C, n] bool with k random True entries per row, never the row's own column (offset + row)."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.rand(C, n, generator=g)
    keys[torch.arange(C), torch.arange(C) + offset] = 2.0
    out = torch.zeros(C, n, dtype=torch.bool)
    out.scatter_(1, keys.topk(k, dim=1, largest=False).indices, True)
    return out


def _own(C, offset=0):
    return torch.arange(C) + offset


def gossip_columns(nbr, own_ids, blocks):
    """The peer algorithms' gossip over an exchange in column blocks (what PeerAlgorithm.aggregate runs)."""
    C = len(own_ids)
    view = RoundView(round=1, before=None, after=torch.zeros(C, blocks.width), columns=blocks)
    return gossip_view(nbr, own_ids, view)


@pytest.mark.parametrize("columns", [1, 7, 64, 1000, 5000])
def test_gossip_in_column_blocks_equals_the_whole_models_bit_for_bit(columns):
    n, P = 30, 1000
    after, _ = _models(n, P)
    nbr, me = _mask(n, n, 4), _own(n)
    blocks = ColumnBlocks(OneProcess("cpu"), {"after": after}, n, columns)
    got = gossip_columns(nbr, me, blocks)
    assert torch.equal(got, sparse_gossip(nbr, me, after))
    torch.testing.assert_close(got, gossip(nbr, me, after, path="dense"), rtol=1e-6, atol=1e-6)
    # a plain reference: the mean of each client's own and its neighbours' rows
    ref = torch.stack([after[[c] + nbr[c].nonzero().flatten().tolist()].mean(0) for c in range(n)])
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    assert blocks.passes == pytest.approx(1.0)
    # the whole models read through the same view: the dense product of few clients, as before blocks
    whole = RoundView(round=1, before=None, after=after, all_after=after)
    assert torch.equal(gossip_view(nbr, me, whole), gossip(nbr, me, after))


def test_a_shard_of_rows_gossips_from_blocks_like_the_whole():
    """Rows 10..19 of 30 (a rank's shard): the same rows as the whole run's, bit for bit."""
    n, P = 30, 300
    after, _ = _models(n, P)
    nbr = _mask(n, n, 3)
    whole = gossip_columns(nbr, _own(n), ColumnBlocks(OneProcess("cpu"), {"after": after}, n, 50))
    shard = gossip_columns(nbr[10:20], _own(10, offset=10),
                           ColumnBlocks(OneProcess("cpu"), {"after": after}, n, 50))
    assert torch.equal(shard, whole[10:20])


@pytest.mark.parametrize("columns,exact", [(POOL_BLOCK, True), (2 * POOL_BLOCK, True), (5000, False)])
def test_grad_similarity_from_blocks_equals_the_pool_path(columns, exact):
    """Blocks whose width is a multiple of POOL_BLOCK sum the same pieces in the same order: bit for bit; any
    other width equals it to rounding.  Both equal the dense similarity on the pool's entries."""
    n, P = 12, 2 * POOL_BLOCK + 3000
    after, before = _models(n, P)
    w0 = torch.randn(P, generator=torch.Generator().manual_seed(5))
    pool = _mask(n, n, 4, seed=7)
    full = torch.zeros(n, dtype=torch.bool)
    full[0] = True
    want = grad_similarity_pool(after, before, w0, 0.5, pool, full_rows=full)
    blocks = ColumnBlocks(OneProcess("cpu"), {"after": after, "before": before}, n, columns)
    from fedclust.algorithms.similarity import grad_similarity_blocks
    got = grad_similarity_blocks(blocks.blocks(("after", "before")), n, w0, 0.5, pool, full_rows=full)
    assert torch.equal(got.isnan(), want.isnan())
    if exact:
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
    else:
        torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), rtol=1e-5, atol=1e-6)
    dense = grad_similarity(after, before, w0, 0.5)
    torch.testing.assert_close(got[pool], dense[pool], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[0, 1:], dense[0, 1:], rtol=1e-5, atol=1e-6)   # client 0's whole row
    assert blocks.passes == pytest.approx(2.0)   # two parts, once each


def test_the_block_size_follows_the_budget():
    # 2 processes, 10 clients: padded shards of 5; 2 parts; received buffer + split copies, float32
    assert exchange_column_bytes(10, 2, 2) == 2 * 2 * 5 * 2 * 4
    assert exchange_columns(1.0, 10, 2, 2) == 2**20 // 160
    assert exchange_column_bytes(9, 2, 1) == 2 * 2 * 5 * 1 * 4   # 9 clients: shards of 5 and 4, padded to 5
    assert exchange_columns(1e-6, 10, 2, 2) == 0


def test_algorithms_that_need_whole_peer_models_are_refused():
    for name in ("panm_loss", "pens", "cfl", "fedgroup", "fpfc"):
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"algorithm.name={name}", "exchange_mb=64", "data.name=synthetic", "clients=40"])
        assert err.value.field == "exchange_mb" and "exchange_mb=0" in str(err.value) and "random" in str(err.value)
    for name in ("panm_grad", "fedavg", "fedprox", "ifca"):
        load_config(None, [f"algorithm.name={name}", "exchange_mb=64", "data.name=synthetic", "clients=40"])


def test_a_budget_below_one_column_is_refused(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.name=random", "exchange_mb=0.00001", "data.name=synthetic", "clients=40"])
    need = 2 * 2 * 20 * 1 * 4 / 2**20   # received shards of 20 rows, and the split copies
    assert err.value.field == "exchange_mb" and f"{need:.3g} MiB" in str(err.value)


