"""FPFC's compact, sharded pair state (fedclust.algorithms.fpfc, issue 20)
against Algorithm 1's literal form (``server_update_``/``zeta``, tested in
tests/unit/test_fpfc_math.py against a plain [n, n, P] loop): θ and one scalar c
per pair (v = c·θ) instead of θ and v; pairs split between clients' rows; ζ
summed exactly, so that any number of ranks computes the same bits."""

import dataclasses

import pytest
import torch

from fedclust import upgrade
from fedclust.algorithms import fpfc
from fedclust.algorithms.aggregation import participants
from fedclust.algorithms.base import Context, RoundView
from fedclust.config import load_config, run_facts
from fedclust.dist import shard_bounds
from fedclust.errors import ConfigError

LAM, A, XI, RHO = 1.0, 3.7, 0.2, 12.0
# the four pieces of theta_shrink: r <= xi + lam/rho, <= lam + lam/rho, <= a*lam, beyond
KNOTS = (XI + LAM / RHO, LAM + LAM / RHO, A * LAM)


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, as launched runs (OMP_NUM_THREADS=1): the bit-for-bit comparisons here hold per thread
    count, and small kernels do not wait for a second thread on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def piece(r):
    """Which piece of theta_shrink each r falls in: 0..3."""
    return sum((r > k).long() for k in KNOTS)


# ----------------------------------------------------------------------------
# Layout


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 100])
def test_every_pair_is_kept_once_and_clients_keep_equal_shares(n):
    owner, partner = fpfc.slot_pairs(n)
    E, K, D = fpfc.n_pairs(n), fpfc.row_slots(n), fpfc.diametric_pairs(n)
    assert owner.numel() == E == n * K + D and D == (n // 2 if n % 2 == 0 else 0)
    pairs = {(min(a, b), max(a, b)) for a, b in zip(owner.tolist(), partner.tolist())}
    assert pairs == {(i, j) for i in range(n) for j in range(i + 1, n)}
    assert torch.equal(torch.bincount(owner[:n * K], minlength=n), torch.full((n,), K))
    index, sign = fpfc.slot_literal_index(n)
    i, j = fpfc.pair_index(n)
    assert torch.equal(torch.sort(index).values, torch.arange(E))
    assert torch.equal(torch.where(sign > 0, owner, partner), i[index])
    assert torch.equal(torch.where(sign > 0, partner, owner), j[index])


# ----------------------------------------------------------------------------
# The algebra: after a step v is c·θ


def test_after_a_step_v_is_a_multiple_of_theta_and_zero_with_theta():
    """v' = ρ(δ − θ') = ρ(1 − t)δ and θ' = tδ, so v' = ρ(1 − t)/t·θ' for δ ≠ 0 (t > 0 on every piece);
    for δ = 0, θ' = v' = 0.  Float64, every piece, and δ = 0."""
    g = torch.Generator().manual_seed(0)
    P = 6
    direction = torch.randn(P, generator=g, dtype=torch.float64)
    direction /= direction.norm()
    wi = torch.stack([direction * r for r in (0.0, 0.1, 0.5, 2.0, 6.0)])
    v = torch.randn(5, P, generator=g, dtype=torch.float64) * 0.01
    v[0] = 0                                      # δ = 0: θ' = v' = 0
    wj = torch.zeros_like(wi)
    theta, v_new = fpfc.pair_update(wi, wj, torch.zeros_like(wi), v, LAM, A, XI, RHO)
    delta = wi - wj + v / RHO
    assert piece(delta.norm(dim=1))[1:].tolist() == [0, 1, 2, 3]
    t, _ = fpfc.shrink_factor(delta, LAM, A, XI, RHO)
    assert (t[1:] > 0).all() and t[0] == 0
    c = RHO * (1 - t[1:]) / t[1:]
    assert torch.allclose(v_new[1:], c[:, None] * theta[1:], rtol=0, atol=1e-14)
    assert torch.equal(theta[0], torch.zeros(P, dtype=torch.float64)) and torch.equal(v_new[0], theta[0])
    # the compact step gives the same θ', c' and ||θ'|| from (θ, c) with v = c·θ
    th, cc, norm = fpfc.compact_pair_update(wi[1:], wj[1:], theta[1:], c, LAM, A, XI, RHO)
    th_ref, v_ref = fpfc.pair_update(wi[1:], wj[1:], theta[1:], v_new[1:], LAM, A, XI, RHO)
    assert torch.allclose(th, th_ref, rtol=0, atol=1e-13)
    assert torch.allclose(cc[:, None] * th, v_ref, rtol=0, atol=1e-13)
    assert torch.allclose(norm, th_ref.norm(dim=1), rtol=0, atol=1e-13)


# ----------------------------------------------------------------------------
# Compact against literal, several rounds


def _rounds(n, P, dtype, seed):
    """ω sequences and participation masks that step every piece of theta_shrink, keep θ = 0 pairs (two
    clients with one ω, then both absent) and move them later."""
    g = torch.Generator().manual_seed(seed)
    direction = torch.randn(P, generator=g, dtype=dtype)
    direction /= direction.norm()
    spots = torch.tensor([0.0, 0.0, 0.15, 0.6, 2.0, 5.0, 9.0, 1.2, 3.0, 0.3][:n], dtype=dtype)
    first = spots[:, None] * direction + 0.01 * torch.randn(n, P, generator=g, dtype=dtype)
    first[1] = first[0]                          # δ_01 = 0: θ_01 = v_01 = 0
    out = [(first, None)]
    absent01 = torch.ones(n, dtype=torch.bool)
    absent01[:2] = False                         # pair (0, 1) kept at θ = 0, the others stepped
    out.append((first + 0.3 * torch.randn(n, P, generator=g, dtype=dtype), absent01))
    for k in range(4):
        active = torch.rand(n, generator=g) < 0.5
        active[k % n] = True
        omega = out[-1][0] + (0.2 + k) * torch.randn(n, P, generator=g, dtype=dtype) / P**0.5
        out.append((omega, active))
    return out


def _literal_and_compact(n, P, dtype, seed=0):
    """Both paths over the same rounds: yields (literal θ, v, ζ, pieces stepped) and the compact state's
    literal view, ζ and norms after each round."""
    theta, v = fpfc.init_pair_state(n, P, dtype)
    K, D, E = fpfc.row_slots(n), fpfc.diametric_pairs(n), fpfc.n_pairs(n)
    rows, diam = torch.zeros(n, K, P, dtype=dtype), torch.zeros(D, P, dtype=dtype)
    ratio, norms = torch.zeros(E, dtype=torch.float64), torch.zeros(E, dtype=torch.float64)
    i, j = fpfc.pair_index(n)
    for omega, active in _rounds(n, P, dtype, seed):
        stepped = torch.ones(E, dtype=torch.bool) if active is None else active[i] | active[j]
        r = (omega[i] - omega[j] + v / RHO).norm(dim=1)[stepped]
        fpfc.server_update_(omega, theta, v, LAM, A, XI, RHO, active=active)
        z = fpfc.zeta(omega, theta, v, RHO)
        buffer = fpfc.shard_sweep_(omega, rows, diam, ratio, norms, 0, active, LAM, A, XI, RHO)
        zc = fpfc.shard_finish(fpfc.sum_over_ranks(buffer), omega, ratio, norms, 0, n)
        th, vv = fpfc.literal_pairs(rows, diam, ratio)
        index, _ = fpfc.slot_literal_index(n)
        nn = torch.empty(E, dtype=torch.float64)
        nn[index] = norms
        yield (theta, v, z, r), (th, vv, zc, nn)


@pytest.mark.parametrize("n", [7, 8])
def test_compact_equals_literal_in_float64(n):
    """The same math: float64 leaves only rounding (1e-12 on values of order 10)."""
    pieces, zeros = set(), 0
    for k, ((theta, v, z, r), (th, vv, zc, nn)) in enumerate(_literal_and_compact(n, 5, torch.float64)):
        pieces |= set(piece(r[r > 0]).tolist())
        zeros += int((r == 0).sum())
        assert torch.allclose(th, theta, rtol=0, atol=1e-12)
        assert torch.allclose(vv, v, rtol=0, atol=1e-12)
        assert torch.allclose(zc, z, rtol=0, atol=1e-12)
        assert torch.allclose(nn, theta.norm(dim=1), rtol=0, atol=1e-12)
        zero_01 = not theta[0].any() and not th[0].any() and not v[0].any() and not vv[0].any()
        assert zero_01 == (k < 2)                           # pair (0, 1): θ = v = 0 stepped, then kept, then moved
    assert pieces == {0, 1, 2, 3} and zeros == 1          # every SCAD piece stepped, and δ = 0


@pytest.mark.parametrize("n", [7, 8])
def test_compact_equals_literal_in_float32(n):
    """Float32, as runs keep it: each step rounds θ, v/ρ and ζ at 2^-24 (6e-8) relative, a few operations a
    step, fed back through v over 6 rounds; 1e-6 of the largest value bounds it (seen: 1.4e-7).  v's scale is
    ρ·max|θ|: the literal update ρ(ω_i − ω_j − θ') rounds at that size, and where v is 0 (‖δ‖ > aλ) the literal
    keeps that rounding (1.3e-6 here) while the compact form keeps c = 0 (seen: 3.6e-8 of ρ·max|θ|)."""
    for (theta, v, z, r), (th, vv, zc, nn) in _literal_and_compact(n, 40, torch.float32):
        top = float(theta.abs().max())
        for got, want, scale in ((th, theta, top), (vv, v, RHO * top), (zc, z, float(z.abs().max())),
                                 (nn.float(), theta.norm(dim=1), float(theta.norm(dim=1).max()))):
            assert float((got - want).abs().max()) <= 1e-6 * scale


# ----------------------------------------------------------------------------
# Any number of ranks: the same bits


def simulated_ranks(n, P, world):
    """The compact state of ``world`` simulated ranks at θ = 0: each its clients' rows (first client, count,
    ``[C, K, P]`` θ rows) and its own copy of what is replicated (diametric θ, ratios, norms)."""
    K, D, E = fpfc.row_slots(n), fpfc.diametric_pairs(n), fpfc.n_pairs(n)
    ranks = []
    for rank in range(world):
        lo, hi = shard_bounds(n, world, rank)
        ranks.append(dict(first=lo, count=hi - lo, rows=torch.zeros(hi - lo, K, P), diam=torch.zeros(D, P),
                          ratio=torch.zeros(E, dtype=torch.float64), norms=torch.zeros(E, dtype=torch.float64)))
    return ranks


def _sharded_run(n, P, world, chunk=None, seed=1, rounds=5):
    """The compact step on ``world`` simulated ranks (:func:`simulated_ranks`), their buffers summed as the
    all-reduce would; per round: (ζ of all clients, norms, rows)."""
    g = torch.Generator().manual_seed(seed)
    ranks = simulated_ranks(n, P, world)
    out = []
    for k in range(rounds):
        omega = torch.randn(n, P, generator=g) * (0.05 + 0.3 * k)
        active = (torch.rand(n, generator=g) < 0.6) if k % 2 else None
        buffers = [fpfc.shard_sweep_(omega, s["rows"], s["diam"], s["ratio"], s["norms"], s["first"], active,
                                     LAM, A, XI, RHO, chunk_pairs=chunk) for s in ranks]
        total = buffers[0].clone()
        for b in buffers[1:]:
            total += b
        backwards = buffers[-1].clone()
        for b in reversed(buffers[:-1]):
            backwards += b
        assert torch.equal(total, backwards)                # exact sums: any order of the all-reduce
        zeta = torch.cat([fpfc.shard_finish(total.clone(), omega, s["ratio"], s["norms"], s["first"], s["count"])
                          for s in ranks])
        for s in ranks[1:]:
            assert torch.equal(s["ratio"], ranks[0]["ratio"]) and torch.equal(s["diam"], ranks[0]["diam"])
        out.append((zeta, ranks[0]["norms"].clone(), ranks[0]["ratio"].clone(),
                    torch.cat([s["rows"] for s in ranks])))
    return out


@pytest.mark.parametrize("n", [9, 10])
@pytest.mark.parametrize("world,chunk", [(2, None), (3, 1), (4, 5), (1, 3)])
def test_any_number_of_ranks_and_chunks_gives_the_same_bits(n, world, chunk):
    one = _sharded_run(n, 37, 1)
    for a, b in zip(one, _sharded_run(n, 37, world, chunk)):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


def test_zeta_units_are_powers_of_two_wide_enough():
    n = 6
    owner, partner = fpfc.slot_pairs(n)
    bounds = torch.linspace(0, 3, owner.numel(), dtype=torch.float64)
    bounds[0] = 1e-30
    unit = fpfc.zeta_units(n, bounds, owner, partner)
    top = torch.zeros(n, dtype=torch.float64)
    for e in range(owner.numel()):
        for k in (int(owner[e]), int(partner[e])):
            top[k] = max(top[k], bounds[e])
    mantissa, _ = torch.frexp(unit)
    assert (mantissa == 0.5).all()                                     # powers of two
    assert (unit * 2.0**53 > 16 * n * top).all() and (unit * 2.0**52 <= 16 * n * top).all()
    assert fpfc.zeta_units(2, torch.zeros(1, dtype=torch.float64), *fpfc.slot_pairs(2)).tolist() == [1.0, 1.0]


# ----------------------------------------------------------------------------
# The algorithm object, checkpoints


def _ctx(n, P, ids=None, seed=3):
    return Context(n=n, client_ids=torch.arange(n) if ids is None else ids, clusters=torch.zeros(n, dtype=torch.int64),
                   seed=seed, stage1_rounds=0, w0=torch.zeros(P), device=torch.device("cpu"))


def test_fpfc_rounds_against_the_literal_algorithm_with_partial_participation():
    n, P = 7, 6
    g = torch.Generator().manual_seed(5)
    ctx = _ctx(n, P)
    algo = fpfc.Fpfc(fpfc.FpfcConfig(lam=0.5, a=3.7, xi=0.25, rho=5.0, nu=0.25), participation=0.6)
    state = algo.init(ctx)
    theta, v = fpfc.init_pair_state(n, P)
    omega = torch.zeros(n, P)
    centres = torch.tensor([[1.0, 0, 0, 0, 0, 0], [-1.0, 0, 0, 0, 0, 0]])
    for t in range(1, 5):
        after = centres[torch.tensor([0, 0, 0, 1, 1, 1, 1])] + 0.05 * t * torch.randn(n, P, generator=g)
        state, res = algo.aggregate(state, ctx, RoundView(round=t, before=None, after=after, all_after=after))
        active = participants(ctx.seed, t, n, 0.6, after.device)
        if t == 1:
            u1 = float((after[active] - omega[active]).norm(dim=1).mean())
        omega = torch.where(active[:, None], after, omega)
        fpfc.server_update_(omega, theta, v, 0.5 * u1, 3.7, 0.25 * u1, 5.0, active=active)
        assert torch.allclose(state.theta, theta, rtol=0, atol=1e-5) and torch.allclose(state.v, v, rtol=0, atol=1e-5)
        assert torch.allclose(state.zeta, fpfc.zeta(omega, theta, v, 5.0), rtol=0, atol=1e-6)
        labels = fpfc.clusters_from_theta(fpfc.theta_norm_matrix(theta, n), 0.25 * u1)
        assert res.assignment.tolist() == labels.tolist()
        assert int(res.server_received) == int(active.sum())


def test_state_dict_rows_follow_clients_and_load_back():
    """The pair rows are client rows: a checkpoint of 2 ranks' states, gathered by clients, loads on 1 and 3."""
    n, P = 8, 5
    algo = fpfc.Fpfc(fpfc.FpfcConfig(lam=0.5, a=3.7, xi=0.25, rho=5.0, nu=0.25))
    states = [algo.init(_ctx(n, P, torch.arange(*shard_bounds(n, 2, r)))) for r in range(2)]
    for r, s in enumerate(states):
        s.theta_rows += torch.arange(s.theta_rows.numel()).view_as(s.theta_rows) + 1000.0 * r
    saved = [algo.state_dict(s) for s in states]
    assert set(saved[0]["clients"]) == {"zeta", "theta_rows"}
    assert saved[0]["server"].keys() == {"omega", "theta_diam", "ratio", "norms", "scale", "labels"}
    gathered = {k: torch.cat([s["clients"][k] for s in saved]) for k in saved[0]["clients"]}
    for world in (1, 3):
        for rank in range(world):
            lo, hi = shard_bounds(n, world, rank)
            back = algo.load_state_dict(_ctx(n, P, torch.arange(lo, hi)),
                                        {"clients": {k: x[lo:hi] for k, x in gathered.items()},
                                         "server": saved[0]["server"]})
            assert torch.equal(back.theta_rows, gathered["theta_rows"][lo:hi])


def test_a_checkpoint_of_the_literal_layout_is_converted():
    """θ and v [E, P] (checkpoints written before the compact layout) become θ rows and c; the run goes on
    as the literal algorithm; a v that is no multiple of θ is refused."""
    n, P = 6, 5
    g = torch.Generator().manual_seed(8)
    theta, v = fpfc.init_pair_state(n, P)
    for k in range(3):
        fpfc.server_update_(torch.randn(n, P, generator=g) * (0.3 + k), theta, v, LAM, A, XI, RHO)
    omega = torch.randn(n, P, generator=g)
    algo = fpfc.Fpfc(fpfc.FpfcConfig(lam=LAM, a=A, xi=XI, rho=RHO, nu=0.1, scale_to_model=False))
    old = {"clients": {"zeta": torch.zeros(n, P)},
           "server": {"omega": omega, "theta": theta, "v": v, "scale": 1.0, "labels": torch.arange(n)}}
    state = algo.load_state_dict(_ctx(n, P), upgrade.algorithm_state(old, algo, n))
    assert torch.allclose(state.theta, theta, rtol=0, atol=1e-6) and torch.allclose(state.v, v, rtol=0, atol=1e-5)
    assert torch.equal(state.omega, omega) and state.scale == 1.0
    now = upgrade.algorithm_state(old, algo, n)   # every client's rows; a rank takes its own
    part = algo.load_state_dict(_ctx(n, P, torch.arange(2, 4)),
                                {"clients": {k: v[2:4] for k, v in now["clients"].items()}, "server": now["server"]})
    assert torch.equal(part.theta_rows, state.theta_rows[2:4])
    after = omega + 0.2 * torch.randn(n, P, generator=g)
    state, _ = algo.aggregate(state, _ctx(n, P), RoundView(round=4, before=None, after=after, all_after=after))
    fpfc.server_update_(after, theta, v, LAM, A, XI, RHO)
    assert torch.allclose(state.theta, theta, rtol=0, atol=1e-5)
    assert torch.allclose(state.zeta, fpfc.zeta(after, theta, v, RHO), rtol=0, atol=1e-5)
    old["server"]["v"] = torch.randn(fpfc.n_pairs(n), P, generator=g)
    with pytest.raises(ConfigError) as e:
        upgrade.algorithm_state(old, algo, n)
    assert e.value.field == "resume" and "overwrite=true" in str(e.value)


def test_literal_view_needs_every_clients_rows():
    state = fpfc.Fpfc().init(_ctx(8, 3, torch.arange(2, 5)))
    with pytest.raises(ValueError, match="every client's rows"):
        state.theta


# ----------------------------------------------------------------------------
# Memory


@pytest.mark.parametrize("n,world", [(8, 1), (8, 2), (9, 2), (9, 4), (100, 2)])
def test_pairwise_state_bytes_are_what_the_largest_shard_holds(n, world):
    P = 7
    lo, hi = shard_bounds(n, world, 0)
    s = fpfc.Fpfc().init(_ctx(n, P, torch.arange(lo, hi)))
    held = sum(x.numel() * x.element_size() for x in (s.theta_rows, s.theta_diam, s.ratio, s.norms))
    assert held == fpfc.pairwise_state_bytes(n, P, world)


def test_memory_check_counts_the_ranks(monkeypatch):
    """On 2 ranks sharing a host, each holds half the pairs; a checkpoint collects every client's rows on
    rank 0's host, once (LoopState.state_dict, in column blocks every rank receives in turn)."""
    cfg = load_config(None, ["data.name=synthetic", "model=mlp", "data.synthetic_dim=784", "clients=100",
                             "algorithm.name=fpfc", "data.train_size=20", "data.test_size=10"])
    P = 199_210
    one, two = fpfc.fpfc_memory_need(100, P), fpfc.fpfc_memory_need(100, P, 2, 2)
    state_one, state_two = fpfc.pairwise_state_bytes(100, P), fpfc.pairwise_state_bytes(100, P, 2)
    assert state_two < state_one / 2 + 16 * fpfc.n_pairs(100) + 50 * P * 4
    ckpt = fpfc.checkpoint_gather_bytes(100, P, 2)
    assert ckpt == 100 * 49 * P * 4 + 2 * 256 * 2**20          # rank 0's copy of the rows, two blocks in flight
    assert fpfc.checkpoint_gather_bytes(100, P, 1) == 0
    assert two == 2 * (fpfc.fpfc_memory_need(100, P, 1, 2) - ckpt) + ckpt
    assert fpfc.fpfc_memory_need(100, P, 1, 2) - ckpt < one - state_one + state_two
    facts = dataclasses.replace(run_facts(cfg), world=2, ranks_per_node=2)   # 2 ranks on one machine
    fpfc.check_fpfc_memory(cfg, facts, available=(two, "host memory (MemAvailable)"))
    with pytest.raises(ConfigError) as e:
        fpfc.check_fpfc_memory(cfg, facts, available=(two - 1, "host memory (MemAvailable)"))
    text = str(e.value)
    assert e.value.field == "clients" and "2 ranks, 2 on this memory" in text and "at most 99 clients" in text
    assert fpfc.fpfc_memory_need(99, P, 2, 2) <= two - 1


# ----------------------------------------------------------------------------
# Whole runs on 1 and 2 processes


CLUSTERED = ["data.name=synthetic", "clients=13", "data.train_size=200", "data.test_size=50", "seed=0",
             "progress=false", "figures=false", "algorithm.name=fpfc", "rounds=12", "model=logreg",
             "data.synthetic_inputs=shared", "data.synthetic_dim=60", "data.synthetic_alpha=0",
             "data.synthetic_beta=0", "train.lr=0.01", "train.momentum=0", "train.batch_size=10",
             "train.local_epochs=5", "participation=0.6"]


# A 2-process FPFC run killed after round 5 resumes on 2 and on 1 process and ends as the uninterrupted run (the pair
# rows travel with their clients): tests/integration/test_resume.py, test_killed_run_resumes_exactly_on_two_processes_and_on_one
# (fpfc is in run_files.RESUMED_ON_TWO).


# fpfc.fuse=head (the official MNIST/FMNIST code): the pairs over the head, the body the participants' mean
HEAD = ["fpfc.mode=official", "fpfc.fuse=head", "participation=0.6"]


def test_head_fusion_keeps_pair_state_for_the_head_only():
    """θ rows, the diametric pairs and ζ are as wide as the head (2010 of the MLP's 199,210 columns): the
    pair state shrinks by P/P_head, and the memory check counts it so."""
    n, P, first = 8, 199_210, 197_200
    algo = fpfc.Fpfc(fpfc.FpfcConfig(fuse="head"), prox_layers=("fc3.weight", "fc3.bias"), first=first)
    s = algo.init(_ctx(n, P))
    assert s.theta_rows.shape == (n, 3, P - first) and s.theta_diam.shape == (4, P - first)
    assert s.zeta.shape == (n, P - first) and s.omega.shape == (n, P)
    held = sum(x.numel() * x.element_size() for x in (s.theta_rows, s.theta_diam, s.ratio, s.norms))
    assert held == fpfc.pairwise_state_bytes(n, P - first)
    whole, head = fpfc.fpfc_memory_need(100, P), fpfc.fpfc_memory_need(100, P, fused=P - first)
    assert whole - head > fpfc.pairwise_state_bytes(100, P) - fpfc.pairwise_state_bytes(100, P - first) - 100 * P * 8
    assert fpfc.fpfc_memory_need(100, P, fused=P) == whole
