"""PENS (SPEC §4) with hand-made losses, against a plain per-client loop."""

import math

import pytest
import torch

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.peer_counts import counted_more_than, counts_matrix, from_matrix
from fedclust.algorithms.pens import PENS, PensState, fixed_list, pens_reference_threshold, pens_threshold
from fedclust.config import Config
from fedclust.errors import ConfigError
from fedclust.peers import as_mask


def make_pens(cfg):
    PENS.check(cfg)
    return PENS.from_config(cfg)


N, T1, L, K, SEED = 12, 6, 4, 2, 11


def loss_table():
    """F_i(w_j): client i's loss of peer j's model, hand-made.  Client 0's
    loss grows with the peer's index; other rows are fixed random values."""
    g = torch.Generator().manual_seed(2)
    table = 1.0 + torch.rand(N, N, generator=g, dtype=torch.float64)
    table[0] = torch.tensor([9.0, 0.1, 0.2, 0.3] + [5.0 + j for j in range(N - 4)], dtype=torch.float64)
    return table


def make_ctx(ids):
    ids = torch.as_tensor(ids)
    table = loss_table()

    def pair_loss(models, local_index):
        # model of peer j is the j-th unit vector: read j back from it
        return table[ids[local_index], models.argmax(1)].to(torch.float32)

    return Context(n=N, client_ids=ids, clusters=torch.zeros(N, dtype=torch.int64), seed=SEED,
                   stage1_rounds=T1, w0=torch.zeros(N), device=torch.device("cpu"), pair_loss=pair_loss)


def config(count="selected", empty_list="last_topk", stage2=0, k=K, T1_=T1):
    cfg = Config()
    cfg.algorithm.k, cfg.algorithm.l = k, L
    cfg.stage1_rounds = T1_
    cfg.clients = N
    cfg.pens.count, cfg.pens.empty_list, cfg.pens.stage2_neighbours = count, empty_list, stage2
    return cfg


def run(ids, rounds, count="selected", empty_list="last_topk", stage2=0, k=K):
    alg = make_pens(config(count, empty_list, stage2, k))
    ctx = make_ctx(ids)
    models = torch.eye(N)
    state = alg.init(ctx)
    out = []
    for t in range(1, rounds + 1):
        view = RoundView(round=t, before=models[ctx.client_ids], after=models[ctx.client_ids], all_after=models)
        state, chosen = alg.select(state, ctx, view)
        out.append((state, as_mask(chosen), as_mask(alg.neighbor_list(state, chosen))))   # either form, as masks
    return out


def plain_pens_lists(count="selected", empty_list="last_topk", k=K):
    """Reference, one client at a time: stage-one top k, counts and the fixed list.
    ``reference`` keeps the peers picked (at least once and) more than
    k·T1/(n−1) − 1 times, in floating point as the PENS reference code writes it;
    the others more than ceil(T1·(l+k)/n) times."""
    K = k
    table = loss_table()
    tops, lists, fell = [], [], []
    for i in range(N):
        counts = [0] * N
        per_round = []
        for t in range(1, T1 + 1):
            allowed = torch.ones(1, N, dtype=torch.bool)
            allowed[0, i] = False
            cand = torch.nonzero(rng.choose_from_mask(SEED, t, "candidates", torch.tensor([i]), allowed, L)[0])
            cand = sorted(cand.flatten().tolist(), key=lambda j: (-1.0 / float(table[i, j].float()), j))
            top = set(cand[:K])
            for j in top:
                counts[j] += 1
            if count == "drawn_and_selected":
                for j in cand:
                    counts[j] += 1
            per_round.append(top)
        if count == "reference":
            cut_off = K * T1 / (N - 1) - 1
            chosen = {j for j in range(N) if counts[j] > 0 and counts[j] > cut_off}
        else:
            thr = math.ceil(T1 * (L + K) / N)
            chosen = {j for j in range(N) if counts[j] > thr}
        tops.append(per_round)
        lists.append(chosen or (set() if empty_list == "alone" else per_round[-1]))
        fell.append(not chosen)
    return tops, lists, fell


def test_threshold():
    assert pens_threshold(100, 10, 5, 100) == 15
    assert pens_threshold(6, 4, 2, 12) == 3
    assert pens_threshold(3, 4, 2, 20) == 1     # ceil(18/20)
    assert pens_threshold(10, 4, 1, 50) == 1


def test_reference_threshold():
    # the setting: k = 5, T1 = 100, n = 100: cut-off 500/99 - 1 = 4.05, so 5 picks keep a peer
    assert pens_reference_threshold(100, 5, 100) == 4
    assert pens_reference_threshold(6, 2, 12) == 0           # 12/11 - 1 = 0.09: one pick is enough
    assert pens_reference_threshold(20, 2, 200) == 0         # 40/199 - 1 < 0: every peer picked at least once
    assert pens_reference_threshold(99, 1, 100) == 0         # 99/99 - 1 = 0 exactly: more than 0
    assert pens_reference_threshold(198, 1, 100) == 1        # 2 - 1 = 1 exactly: strict, 2 picks needed
    for T1_ in range(1, 40):   # the integer form equals the float rule c > k*T1/(n-1) - 1 (and c >= 1)
        for k in range(1, 7):
            for n in range(2, 30):
                thr = pens_reference_threshold(T1_, k, n)
                for c in range(0, T1_ * k + 1):
                    assert (c > thr) == (c >= 1 and c > k * T1_ / (n - 1) - 1), (T1_, k, n, c)


def test_fixed_list_and_fallback():
    counts = torch.tensor([[0, 4, 3, 5], [1, 0, 2, 3], [0, 0, 0, 0]])
    last = torch.tensor([[False, True, False, False], [True, False, True, False], [False, False, False, True]])
    peers, listed = from_matrix(counts)                    # the lists PENS keeps: [[1, 2, 3], [0, 2, 3], []]
    assert peers.tolist() == [[1, 2, 3], [0, 2, 3], [-1, -1, -1]] and listed.tolist()[0] == [4, 3, 5]
    chosen = counted_more_than(peers, listed, 3, 4)
    assert torch.equal(chosen, counts > 3)
    got, fell = fixed_list(chosen, last)
    assert got.tolist() == [[False, True, False, True], [True, False, True, False], [False, False, False, True]]
    assert fell.tolist() == [False, True, True]
    got, fell = fixed_list(chosen, last, "alone")
    assert got.tolist() == [[False, True, False, True], [False] * 4, [False] * 4]
    assert fell.tolist() == [False, True, True]


@pytest.mark.parametrize("count,empty_list,k", [("reference", "last_topk", K), ("reference", "alone", 4),
                                                ("selected", "last_topk", K), ("selected", "alone", K),
                                                ("drawn_and_selected", "last_topk", K)])
def test_pens_equals_plain_loop(count, empty_list, k):
    K = k
    tops, lists, fell = plain_pens_lists(count, empty_list, k)
    if count == "selected":
        assert any(fell) and not all(fell)      # the data exercise both branches
    if count == "reference":                    # the most-picked peer is always above the mean, less one
        assert not any(fell)
        assert pens_reference_threshold(T1, k, N) == (1 if k == 4 else 0)   # 24/11 - 1 = 1.18; 12/11 - 1
    steps = run(range(N), T1 + 5, count, empty_list, k=k)
    for t, (state, mask, nl) in enumerate(steps, start=1):
        assert isinstance(state, PensState)
        assert not mask.diagonal().any() and not nl.diagonal().any()
        if t <= T1:
            for i in range(N):
                assert set(torch.nonzero(mask[i]).flatten().tolist()) == tops[i][t - 1], (t, i)
            assert torch.equal(mask, nl) and not state.formed
        else:
            assert state.formed and state.fell_back.tolist() == fell
            for i in range(N):
                assert set(torch.nonzero(nl[i]).flatten().tolist()) == lists[i], (t, i)
                picked = set(torch.nonzero(mask[i]).flatten().tolist())
                assert picked <= lists[i] and len(picked) == min(K, len(lists[i]))
    # client 0's loss grows with the peer's index: its top k are its k lowest-numbered candidates
    for state, mask, _ in steps[:T1]:
        cand = torch.nonzero(state.pool[0]).flatten().tolist()
        assert torch.nonzero(mask[0]).flatten().tolist() == sorted(cand)[:K]
    counts = steps[T1 - 1][0].counts
    assert counts.sum(1).eq(T1 * (K + L if count == "drawn_and_selected" else K)).all()


def test_candidates_are_fresh_each_round():
    steps = run(range(N), T1)
    seen = [s.pool for s, _, _ in steps]
    assert all(int(x.sum(1).max()) == L and int(x.sum(1).min()) == L for x in seen)
    assert not all(torch.equal(seen[0], x) for x in seen[1:])


def test_all_clients_equal_two_halves():
    whole, low, high = run(range(N), T1 + 4), run(range(0, 5), T1 + 4), run(range(5, N), T1 + 4)
    for (sw, mw, lw), (sl, ml, ll), (sh, mh, lh) in zip(whole, low, high):
        assert torch.equal(mw, torch.cat([ml, mh])) and torch.equal(lw, torch.cat([ll, lh]))
        assert torch.equal(sw.counts, torch.cat([sl.counts, sh.counts]))
        assert torch.equal(sw.count_peers, torch.cat([sl.count_peers, sh.count_peers]))


def test_drawn_and_selected_counts_by_hand():
    """Counting draws too adds exactly each round's candidates to the counts."""
    sel = run(range(N), T1, "selected")
    both = run(range(N), T1, "drawn_and_selected")
    drawn = sum(s.pool.to(torch.int64) for s, _, _ in sel)
    table = [counts_matrix(s.count_peers, s.counts, N) for s in (both[-1][0], sel[-1][0])]
    assert torch.equal(table[0], table[1] + drawn)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(sel, both))   # stage one picks the same top k


def test_refuses_no_stage_one():
    cfg = config()
    cfg.stage1_rounds = 0
    try:
        make_pens(cfg)
    except ConfigError as exc:
        assert exc.field == "stage1_rounds"
    else:
        raise AssertionError("stage1_rounds=0 accepted")
    alg = make_pens(config())
    assert (alg.name, alg.gathers_before) == ("pens", False)


def test_default_is_reference_count():
    cfg = Config()
    assert (cfg.pens.count, cfg.pens.empty_list, cfg.pens.stage2_neighbours) == ("reference", "last_topk", 0)
    alg = make_pens(cfg)
    assert (alg.pens.count, alg.pens.empty_list, alg.pens.stage2_neighbours) == ("reference", "last_topk", 0)


@pytest.mark.parametrize("stage2", [1, 3, 7])
def test_stage2_neighbours_draws_that_many_from_the_list(stage2):
    """As the reference code's stage two: min(stage2_neighbours, |list|) uniform list members."""
    _, lists, _ = plain_pens_lists("reference")
    steps = run(range(N), T1 + 4, "reference", stage2=stage2)
    for state, mask, nl in steps[T1:]:
        for i in range(N):
            picked = set(torch.nonzero(mask[i]).flatten().tolist())
            assert picked <= lists[i] and len(picked) == min(stage2, len(lists[i]))
    assert any(len(x) > 3 for x in lists)    # the list is longer than some of the draws


@pytest.mark.parametrize("field,value", [("pens.count", "drawn"), ("pens.empty_list", "none"),
                                         ("pens.stage2_neighbours", -1), ("pens.stage2_neighbours", N)])
def test_refuses_bad_pens_section(field, value):
    cfg = config()
    setattr(cfg.pens, field.split(".")[1], value)
    with pytest.raises(ConfigError) as err:
        make_pens(cfg)
    assert err.value.field == field
