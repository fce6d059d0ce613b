"""CNI, the HNM EM and the PANM algorithm objects (papers/001 §3.2, SPEC §4)."""

import math

import pytest
import torch
from panm_build import make_panm_grad, make_panm_loss

from fedclust import rng
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.cni import cni_step, draw_candidates, top_k_in_mask
from fedclust.algorithms.hnm import (
    VAR_FLOOR_ABS,
    VAR_FLOOR_REL,
    draw_average,
    em_two_gaussians,
    hnm_draw,
    hnm_update,
    pooled_variance,
)
from fedclust.algorithms.panm import PanmState
from fedclust.algorithms.similarity import similarity_matrix
from fedclust.config import Config
from fedclust.errors import ConfigError
from fedclust.peers import as_mask, mask_indices

# ---------------------------------------------------------------- top k, CNI


def plain_top_k(row, allowed, k):
    """Reference: allowed columns sorted by (similarity desc, index asc), first k."""
    cols = [j for j in range(len(row)) if allowed[j]]
    cols.sort(key=lambda j: (-row[j], j))
    return set(cols[:k])


def test_top_k_in_mask_equals_plain_sort_with_ties():
    g = torch.Generator().manual_seed(0)
    sim = torch.randint(0, 4, (30, 12), generator=g).to(torch.float32)   # many ties
    allowed = torch.rand(30, 12, generator=g) < 0.6
    for k in (0, 1, 3, 20):
        got = top_k_in_mask(sim, allowed, k)
        for r in range(30):
            want = plain_top_k(sim[r].tolist(), allowed[r].tolist(), k)
            assert set(torch.nonzero(got[r]).flatten().tolist()) == want


def test_choose_from_mask_in_row_chunks_equals_one_draw(monkeypatch):
    """Chunks of rows bound the keys' memory; every row is still the k allowed items of lowest key."""
    ids = torch.arange(40, 90)
    allowed = torch.rand(50, 70, generator=torch.Generator().manual_seed(2)) < 0.3
    whole = rng.choose_from_mask(4, 3, "candidates", ids, allowed, 5)
    monkeypatch.setattr(rng, "CHOOSE_CHUNK_ELEMENTS", 3 * 70)   # 3 rows a chunk
    assert torch.equal(rng.choose_from_mask(4, 3, "candidates", ids, allowed, 5), whole)
    keys = rng.client_keys(4, 3, "candidates", ids, 70)
    for r in range(50):
        cols = sorted(torch.nonzero(allowed[r]).flatten().tolist(), key=lambda j: float(keys[r, j]))[:5]
        assert set(torch.nonzero(whole[r]).flatten().tolist()) == set(cols)


def test_top_k_in_mask_prefers_allowed_minus_inf_over_disallowed():
    sim = torch.tensor([[5.0, -math.inf, 9.0, math.nan]])
    allowed = torch.tensor([[False, True, False, True]])
    assert top_k_in_mask(sim, allowed, 2).tolist() == [[False, True, False, True]]


def test_candidates_are_l_others():
    ids = torch.arange(10, 20)
    self_mask = torch.zeros(10, 30, dtype=torch.bool)
    self_mask[torch.arange(10), ids] = True
    cand = draw_candidates(3, 7, ids, 30, 4)
    assert (cand.sum(1) == 4).all() and not (cand & self_mask).any()
    assert torch.equal(cand, rng.choose_from_mask(3, 7, "candidates", ids, ~self_mask, 4))   # the plain draw
    assert not torch.equal(cand, draw_candidates(3, 8, ids, 30, 4))   # fresh each round


def test_cni_keeps_previous_neighbours_that_still_rank_best():
    n = 8
    sim = torch.tensor([[0.0, 9, 8, 7, 1, 2, 3, 0.5]])       # client 0; peers 1, 2, 3 are the best
    prev = torch.zeros(1, n, dtype=torch.bool)
    prev[0, [1, 2]] = True
    cand = torch.zeros(1, n, dtype=torch.bool)
    cand[0, [4, 5, 6]] = True                                   # neither 1 nor 2 drawn again
    assert torch.nonzero(cni_step(sim, cand, prev, 2)[0]).flatten().tolist() == [1, 2]
    assert torch.nonzero(cni_step(sim, cand, prev, 3)[0]).flatten().tolist() == [1, 2, 6]
    assert torch.nonzero(cni_step(sim, cand, None, 2)[0]).flatten().tolist() == [5, 6]   # round 1


def test_cni_precision_never_falls_with_a_perfect_similarity():
    """Under Assumption 1 the same-cluster count of every client's list is non-decreasing."""
    n, k, l = 40, 5, 6
    ids = torch.arange(n)
    clusters = ids % 4                                  # 4 interleaved clusters of 10
    self_mask = torch.eye(n, dtype=torch.bool)
    same = (clusters[:, None] == clusters[None, :]) & ~self_mask
    prev, prev_count = None, torch.zeros(n, dtype=torch.int64)
    for t in range(1, 25):
        noise = rng.client_keys(9, t, "init", ids, n).to(torch.float32)   # fresh ranking each round
        sim = same.to(torch.float32) * 10 + noise                          # same-cluster always first
        cand = draw_candidates(9, t, ids, n, l)
        nb = cni_step(sim, cand, prev, k)
        assert (nb.sum(1) == k).all() and not (nb & self_mask).any()
        count = (nb & same).sum(1)
        assert (count >= prev_count).all()
        prev, prev_count = nb, count
    assert (prev_count == k).float().mean() > 0.9


# ---------------------------------------------------------------- EM


def plain_em(ys, init_a, max_steps=100, rel=VAR_FLOOR_REL, abs_=VAR_FLOOR_ABS, tied=False):
    """One client, plain Python: hard-assignment EM for two 1-D Gaussians
    (``tied``: both use the pooled within-component variance)."""
    m = len(ys)
    if m == 0:
        return [], True, []
    mu_all = sum(ys) / m
    floor = rel * sum((y - mu_all) ** 2 for y in ys) / m + abs_

    def stats(member):
        vals = [y for y, z in zip(ys, member) if z]
        if not vals:
            return 0, 0.0, floor
        mu = sum(vals) / len(vals)
        return len(vals), mu, max(sum((v - mu) ** 2 for v in vals) / len(vals), floor)

    def score(y, c, mu, var):
        if c == 0:
            return -math.inf
        return math.log(c / m) - 0.5 * math.log(2 * math.pi * var) - (y - mu) ** 2 / (2 * var)

    a = list(init_a)
    for _ in range(max_steps):
        ca, ma, va = stats(a)
        cb, mb, vb = stats([not z for z in a])
        if tied:
            va = vb = max((ca * va + cb * vb) / m, floor)
        new = [score(y, ca, ma, va) >= score(y, cb, mb, vb) for y in ys]
        if new == a:
            break
        a = new
    ca, ma, _ = stats(a)
    cb, mb, _ = stats([not z for z in a])
    high = a if ma >= mb else [not z for z in a]
    return high, ca == 0 or cb == 0, a


def run_em(rows, inits, variance="separate"):
    m = max(len(r) for r in rows)
    y = torch.zeros(len(rows), m, dtype=torch.float64)
    valid = torch.zeros(len(rows), m, dtype=torch.bool)
    init = torch.zeros(len(rows), m, dtype=torch.bool)
    for i, (r, a) in enumerate(zip(rows, inits)):
        y[i, :len(r)] = torch.tensor(r, dtype=torch.float64)
        valid[i, :len(r)] = True
        init[i, :len(r)] = torch.tensor(a, dtype=torch.bool)
    return em_two_gaussians(y, valid, init, variance=variance), valid


def test_em_splits_two_separated_groups_exactly():
    ys = [0.91, 0.95, 1.0, 0.97, 0.93, 0.12, 0.2, 0.15, 0.1, 0.18]
    res, _ = run_em([ys], [[True] * 5 + [False] * 5])
    assert res.high[0].tolist() == [True] * 5 + [False] * 5 and not res.empty[0]
    # started the other way round, the higher-mean side is still the first group
    res, _ = run_em([ys], [[False] * 5 + [True] * 5])
    assert res.high[0].tolist() == [True] * 5 + [False] * 5 and not res.empty[0]


def test_em_drops_outliers_started_in_s_and_takes_good_candidates():
    s_vals = [0.9, 0.95, 0.92, 0.2, 0.15]       # last two are outliers in S
    c_vals = [0.1, 0.94, 0.18, 0.12, 0.93]      # two good candidates
    res, _ = run_em([s_vals + c_vals], [[True] * 5 + [False] * 5])
    assert res.high[0].tolist() == [True, True, True, False, False, False, True, False, False, True]


def test_em_degenerate_cases_flag_empty():
    res, _ = run_em([[0.5] * 6, [0.7], [0.3, 0.9, 0.4]], [[True] * 3 + [False] * 3, [True], [True] * 3])
    assert res.empty.tolist() == [True, True, True]   # all equal; one element; C empty from the start


def test_pooled_variance_by_hand():
    # (2 * 0.5 + 3 * 2.0) / 5 = 1.4; the floor wins where it is larger
    got = pooled_variance(torch.tensor([2.0, 2.0]), torch.tensor([0.5, 0.5]), torch.tensor([3.0, 3.0]),
                          torch.tensor([2.0, 2.0]), torch.tensor([0.1, 3.0]))
    assert torch.allclose(got, torch.tensor([1.4, 3.0]))


# Recorded in a 4-rotation PANMGrad run (seed 0, round 163, client 79, values rounded): S are ten
# same-cluster neighbours, C ten other-cluster candidates; the seventh candidate's update cosine was
# 0.18 by chance.  The same-cluster values are spread by the update-cosine term, the candidates'
# are tight, so with one variance per component the wide component takes the candidate (2.6 of its
# standard deviations from its mean, 10 from the other candidates'); with a pooled variance the
# boundary lies between the two means.
RECORDED_S = [0.530, 0.552, 0.437, 0.572, 0.591, 0.451, 0.608, 0.348, 0.495, 0.362]
RECORDED_C = [0.154, 0.158, 0.170, 0.157, 0.151, 0.156, 0.278, 0.143, 0.159, 0.123]


def test_separate_variances_take_the_recorded_wrong_candidate_tied_do_not():
    init = [[True] * 10 + [False] * 10]
    sep, _ = run_em([RECORDED_S + RECORDED_C], init, "separate")
    tied, _ = run_em([RECORDED_S + RECORDED_C], init, "tied")
    assert sep.high[0].tolist() == [True] * 10 + [False] * 6 + [True] + [False] * 3
    assert tied.high[0].tolist() == [True] * 10 + [False] * 10
    # the plain loop agrees on both
    assert plain_em(RECORDED_S + RECORDED_C, init[0])[0] == sep.high[0].tolist()
    assert plain_em(RECORDED_S + RECORDED_C, init[0], tied=True)[0] == tied.high[0].tolist()


def assert_batched_equals_plain(rows, inits, variance):
    """The batched EM against :func:`plain_em`, row by row."""
    res, valid = run_em(rows, inits, variance)
    for i, (ys, a) in enumerate(zip(rows, inits)):
        high, empty, assign = plain_em(ys, a, tied=variance == "tied")
        assert bool(res.empty[i]) == empty, i
        assert res.assign_a[i, :len(ys)].tolist() == assign, i
        if not empty:
            assert res.high[i, :len(ys)].tolist() == high, i
        assert not (res.high[i] & ~valid[i]).any()


def test_batched_tied_em_equals_plain_loop():
    g = torch.Generator().manual_seed(7)
    rows, inits = [], []
    for c in range(60):
        m = int(torch.randint(1, 21, (1,), generator=g))
        gap = float(torch.rand(1, generator=g)) * 3
        hi = torch.rand(m, generator=g) < 0.5
        scale = 1 + 4 * hi.to(torch.float64)                  # unequal spreads: where tying matters
        vals = torch.randn(m, generator=g, dtype=torch.float64) * scale + gap * hi
        rows.append([float(v) for v in vals])
        inits.append([bool(v) for v in (torch.rand(m, generator=g) < 0.5)])
    assert_batched_equals_plain(rows, inits, "tied")


def test_batched_em_equals_plain_loop():
    g = torch.Generator().manual_seed(5)
    rows, inits = [], []
    for c in range(60):
        m = int(torch.randint(0, 21, (1,), generator=g))
        gap = float(torch.rand(1, generator=g)) * 3
        vals = [float(v) for v in torch.randn(m, generator=g, dtype=torch.float64)]
        hi = torch.rand(m, generator=g) < 0.5
        vals = [v + gap * float(h) for v, h in zip(vals, hi)]
        init = [bool(v) for v in (torch.rand(m, generator=g) < 0.5)]
        if c % 10 == 0 and m:
            vals = [1.25] * m                                # degenerate: all equal
        rows.append(vals)
        inits.append(init)
    rows[1] = []                                             # no values at all
    inits[1] = []
    assert_batched_equals_plain(rows, inits, "separate")


# ---------------------------------------------------------------- HNM step


def test_hnm_update_replaces_outliers_and_adds_matches():
    n = 14
    neighbors = torch.zeros(1, n, dtype=torch.bool)
    neighbors[0, 1:7] = True                                  # N = {1..6}
    cand = torch.zeros(1, n, dtype=torch.bool)
    cand[0, 7:13] = True                                      # C = {7..12}
    sample = neighbors.clone()                                # |N| <= l: S = N
    sim = torch.full((1, n), -math.inf)
    sim[0, 1:7] = torch.tensor([0.9, 0.92, 0.95, 0.91, 0.1, 0.12])   # 5, 6 are outliers
    sim[0, 7:13] = torch.tensor([0.11, 0.93, 0.14, 0.94, 0.13, 0.1])  # 8, 10 are matches
    new, failed = hnm_update(neighbors, cand, sample, sim)
    assert not failed[0]
    assert torch.nonzero(new[0]).flatten().tolist() == [1, 2, 3, 4, 8, 10]


def test_hnm_update_keeps_unsampled_neighbours_and_leaves_failed_rows():
    n = 10
    neighbors = torch.zeros(2, n, dtype=torch.bool)
    neighbors[:, 1:6] = True
    sample = torch.zeros(2, n, dtype=torch.bool)
    sample[:, 1:3] = True                                     # S = {1, 2}; 3, 4, 5 not sampled
    cand = torch.zeros(2, n, dtype=torch.bool)
    cand[:, 6:9] = True
    sim = torch.tensor([[0, 0.9, 0.95, 0, 0, 0, 0.1, 0.15, 0.96, 0],
                        [0, 0.5, 0.5, 0, 0, 0, 0.5, 0.5, 0.5, 0]])     # row 1: all equal
    new, failed = hnm_update(neighbors, cand, sample, sim)
    assert failed.tolist() == [False, True]
    assert torch.nonzero(new[0]).flatten().tolist() == [1, 2, 3, 4, 5, 8]
    assert torch.equal(new[1], neighbors[1])


def test_hnm_update_equals_the_mask_rule_on_random_rows():
    """Written by index, the update equals where(empty, N, (N \\ S) ∪ H) on whole masks, H from the EM itself."""
    g = torch.Generator().manual_seed(11)
    C, n, l = 40, 50, 6
    ids = torch.arange(C)
    neighbors = torch.rand(C, n, generator=g) < 0.3
    neighbors[ids, ids] = False
    cand, sample = hnm_draw(2, 5, ids, neighbors, l)
    sim = torch.rand(C, n, generator=g, dtype=torch.float64)
    sim[:5] = 0.5                                              # equal values: EM finds no split there
    new, failed = hnm_update(neighbors, cand, sample, sim)
    idx, valid = mask_indices(cand | sample)
    res = em_two_gaussians(sim.gather(1, idx), valid, sample.gather(1, idx) & valid)
    high = torch.zeros_like(neighbors)
    high[torch.arange(C)[:, None].expand_as(idx)[res.high & valid], idx[res.high & valid]] = True
    want = torch.where(res.empty[:, None], neighbors, (neighbors & ~sample) | high)
    assert torch.equal(new, want) and torch.equal(failed, res.empty)
    assert failed[:5].all() and not failed.all()


def test_hnm_draws():
    n, C = 30, 6
    ids = torch.arange(12, 18)
    self_mask = torch.zeros(C, n, dtype=torch.bool)
    self_mask[torch.arange(C), ids] = True
    neighbors = rng.choose_from_mask(1, 0, "fixed", ids, ~self_mask, 8)
    neighbors[0] = False
    neighbors[0, :3] = True                                   # a client with only 3 neighbours
    cand, sample = hnm_draw(4, 11, ids, neighbors, 5)
    assert (cand.sum(1) == 5).all() and not (cand & (neighbors | self_mask)).any()
    assert not (sample & ~neighbors).any()
    assert torch.equal(sample[0], neighbors[0])              # all of N when |N| <= l
    assert (sample[1:].sum(1) == 5).all()
    # the plain draws over whole [C, n] masks pick the same
    assert torch.equal(cand, rng.choose_from_mask(4, 11, "hnm_candidates", ids, ~neighbors & ~self_mask, 5))
    assert torch.equal(sample, rng.choose_from_mask(4, 11, "hnm_sample", ids, neighbors, 5))
    avg = draw_average(4, 11, ids, neighbors, 4).mask()
    assert not (avg & ~neighbors).any() and avg[0].sum() == 3 and (avg[1:].sum(1) == 4).all()
    assert torch.equal(avg, rng.choose_from_mask(4, 11, "neighbors", ids, neighbors, 4))


# ---------------------------------------------------------------- PANM objects


def world(n, P, round_, clusters, dtype=torch.float32):
    """Every client's models before/after local training in a given round:
    each cluster moves along its own direction, plus noise."""
    g = torch.Generator().manual_seed(1000 + round_)
    base = torch.Generator().manual_seed(7)
    w0 = torch.randn(P, generator=base, dtype=dtype)
    centers = 2 * torch.randn(int(clusters.max()) + 1, P, generator=base, dtype=dtype)
    before = w0 + 0.5 * centers[clusters] + 0.5 * torch.randn(len(clusters), P, generator=g, dtype=dtype)
    after = before + 0.5 * centers[clusters] + 0.5 * torch.randn(len(clusters), P, generator=g, dtype=dtype)
    return w0, before, after, w0 + centers[clusters]


def make_ctx(ids, n, clusters, P, T1, seed=5):
    ids = torch.as_tensor(ids)
    w0, _, _, targets = world(n, P, 0, clusters)

    def pair_loss(models, local_index):
        return ((models - targets[ids[local_index]]) ** 2).mean(1) + 0.1

    return Context(n=n, client_ids=ids, clusters=clusters, seed=seed, stage1_rounds=T1, w0=w0,
                   device=torch.device("cpu"), pair_loss=pair_loss)


def run(alg, ctx, rounds, n, P, clusters):
    state = alg.init(ctx)
    out = []
    for t in range(1, rounds + 1):
        w0, before, after, _ = world(n, P, t, clusters)
        ids = ctx.client_ids
        view = RoundView(round=t, before=before[ids], after=after[ids], all_after=after,
                         all_before=before if alg.gathers_before else None)
        state, chosen = alg.select(state, ctx, view)
        out.append((state, as_mask(chosen), as_mask(alg.neighbor_list(state, chosen))))   # either form, as masks
    return out


def config(k=3, l=5, tau=1, T1=4, alpha=0.5):
    cfg = Config()
    cfg.algorithm.k, cfg.algorithm.l, cfg.panm.tau, cfg.panm.alpha = k, l, tau, alpha
    cfg.stage1_rounds = T1
    return cfg


def test_factories_and_refusals():
    loss, grad = make_panm_loss(config()), make_panm_grad(config())
    assert (loss.name, loss.gathers_before) == ("panm_loss", False)
    assert (grad.name, grad.gathers_before) == ("panm_grad", True)
    from fedclust.config import load_config

    with pytest.raises(ConfigError) as exc:      # tau is PANM's key: checked with its section
        load_config(None, ["algorithm.name=panm_loss", "panm.tau=0"])
    assert exc.value.field == "panm.tau"
    with pytest.raises(ConfigError) as exc:      # its old name says where it went
        load_config(None, ["algorithm.name=panm_loss", "algorithm.tau=2"])
    assert exc.value.field == "algorithm.tau" and "now panm.tau" in str(exc.value)
    for field, cfg in [("stage1_rounds", config(T1=0)),
                       ("algorithm.k", config(k=0)), ("algorithm.l", config(l=0))]:
        try:
            make_panm_loss(cfg)
        except ConfigError as exc:
            assert exc.field == field
        else:
            raise AssertionError(f"{field} accepted")


def test_select_for_all_clients_equals_two_halves():
    n, P, T1 = 20, 12, 3
    clusters = torch.arange(n) // 10
    for make, tau in ((make_panm_loss, 1), (make_panm_grad, 2)):
        alg = make(config(T1=T1, tau=tau))
        whole = run(alg, make_ctx(range(n), n, clusters, P, T1), 8, n, P, clusters)
        low = run(alg, make_ctx(range(0, 8), n, clusters, P, T1), 8, n, P, clusters)
        high = run(alg, make_ctx(range(8, n), n, clusters, P, T1), 8, n, P, clusters)
        for (sw, mw, lw), (sl, ml, ll), (sh, mh, lh) in zip(whole, low, high):
            assert torch.equal(mw, torch.cat([ml, mh]))
            assert torch.equal(lw, torch.cat([ll, lh]))
            assert torch.allclose(similarity_matrix(sw.pool, sw.similarity),
                                  torch.cat([similarity_matrix(x.pool, x.similarity) for x in (sl, sh)]), equal_nan=True)
            assert torch.allclose(sw.similarity_client0, sl.similarity_client0, equal_nan=True)
            assert sh.similarity_client0 is None   # client 0 is on the low half
            assert torch.equal(sw.hnm_failed, torch.cat([sl.hnm_failed, sh.hnm_failed]))


def test_panm_masks_and_state_over_both_stages():
    n, P, T1, k = 20, 12, 4, 3
    clusters = torch.arange(n) // 10
    ctx = make_ctx(range(n), n, clusters, P, T1)
    eye = torch.eye(n, dtype=torch.bool)
    for make in (make_panm_loss, make_panm_grad):
        steps = run(make(config(T1=T1, k=k)), ctx, 10, n, P, clusters)
        for t, (state, mask, nl) in enumerate(steps, start=1):
            assert isinstance(state, PanmState) and state.similarity_round == t
            assert not (mask & eye).any() and not (nl & eye).any()
            if t <= T1:
                assert torch.equal(mask, nl) and (mask.sum(1) == k).all()
            else:
                assert not (mask & ~nl).any()
                assert torch.equal(mask.sum(1), nl.sum(1).clamp(max=k))
            # kept where computed, the pool: never the client itself, NaN elsewhere
            sims = similarity_matrix(state.pool, state.similarity)
            assert not (state.pool & eye).any() and torch.equal(~torch.isnan(sims), state.pool)
            assert torch.isnan(state.similarity_client0[0])
        first = steps[0][0]   # round 1 ranks the l = 5 candidates alone
        assert first.pool.sum(1).eq(5).all()
        row0 = ~torch.isnan(first.similarity_client0)
        # client 0's row for the figure: PANMGrad computes all of it, PANMLoss its pool
        assert torch.equal(row0, ~eye[0] if make is make_panm_grad else first.pool[0])


def test_panm_finds_the_clusters_in_a_clear_world():
    n, P, T1 = 20, 12, 4
    clusters = torch.arange(n) // 10
    same = (clusters[:, None] == clusters[None, :]) & ~torch.eye(n, dtype=torch.bool)
    ctx = make_ctx(range(n), n, clusters, P, T1)
    for make in (make_panm_loss, make_panm_grad):
        state = run(make(config(T1=T1)), ctx, 20, n, P, clusters)[-1][0]
        nb = state.neighbors
        precision = (nb & same).sum(1) / nb.sum(1)
        recall = (nb & same).sum(1) / same.sum(1)
        assert precision.mean() > 0.95, (make.__name__, precision.mean())
        assert recall.mean() > 0.7, (make.__name__, recall.mean())
        assert not state.hnm_failed.any()


def test_hnm_alpha_weights_the_update_cosine_of_stage_two_only():
    from fedclust.algorithms.similarity import grad_similarity

    n, P, T1 = 20, 12, 2
    clusters = torch.arange(n) // 10
    ctx = make_ctx(range(n), n, clusters, P, T1)
    eye = torch.eye(n, dtype=torch.bool)
    for hnm_alpha in (0.0, 0.5, 1.0):
        cfg = config(T1=T1, alpha=0.3)
        cfg.panm.hnm_alpha = hnm_alpha
        steps = run(make_panm_grad(cfg), ctx, 4, n, P, clusters)
        for t, (state, _, _) in enumerate(steps, start=1):
            w0, before, after, _ = world(n, P, t, clusters)
            want = grad_similarity(after, before, w0, 0.3 if t <= T1 else hnm_alpha).float()
            got = similarity_matrix(state.pool, state.similarity)
            assert torch.allclose(got[state.pool], want[state.pool], atol=1e-6), (hnm_alpha, t)
            assert torch.allclose(state.similarity_client0[1:], want[0, 1:], atol=1e-6), (hnm_alpha, t)
    cfg = config()
    cfg.panm.hnm_alpha = 1.5
    with pytest.raises(ConfigError) as exc:
        make_panm_grad(cfg)
    assert exc.value.field == "panm.hnm_alpha"


def test_top_k_of_pool_with_a_k_per_row_keeps_each_rows_best_that_many():
    from fedclust.algorithms.cni import top_k_of_pool

    g = torch.Generator().manual_seed(4)
    C, n, k = 6, 12, 4
    allowed = torch.rand(C, n, generator=g) < 0.6
    sim = torch.rand(C, n, generator=g)
    idx, valid = mask_indices(allowed)
    row_k = torch.tensor([0, 1, 2, 4, 3, 9])          # 9: at most k
    got = top_k_of_pool(sim.gather(1, idx), idx, valid, k, n, row_k)
    for i in range(C):                                  # the plain rule: each row's min(row_k, k) best allowed
        cols = sorted(allowed[i].nonzero().flatten().tolist(), key=lambda j: (-float(sim[i, j]), j))
        assert got[i].nonzero().flatten().tolist() == sorted(cols[:min(int(row_k[i]), k)]), i
    assert torch.equal(top_k_of_pool(sim.gather(1, idx), idx, valid, k, n, torch.full((C,), k)),
                       top_k_in_mask(sim, allowed, k))
