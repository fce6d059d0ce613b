"""FPFC as its authors' official code runs it (``fpfc.mode=official``, issue
21 part 4; docs/algorithms.md, FPFC): the server loop of the code
(github.com/xueyu-ubc/FPFC, Synthetic/FLAlgorithms/FPFC.py), written here
plainly over dense ``[n, n, P]`` θ and V, against fedclust's compact state;
Theorem 1 warned about, not refused; the strict cluster threshold; what a
client holds; the step learning-rate schedule (``train.lr_decay_every``)."""


import pytest
import torch
from test_fpfc_state import simulated_ranks  # tests/ is on sys.path (pytest)

from fedclust.algorithms import fpfc
from fedclust.algorithms.aggregation import participants
from fedclust.algorithms.base import Context, RoundView
from fedclust.config import load_config, run_facts
from fedclust.errors import ConfigError
from fedclust.models.registry import builtin
from fedclust.schema import TrainConfig

# the official Synthetic setting: rho = 1 hard-coded, lambda = 0.6, xi = 10e-4, a = 3.7
LAM, A, XI, RHO = 0.6, 3.7, 1e-3, 1.0
KNOTS = (XI + LAM / RHO, LAM + LAM / RHO, A * LAM)   # the four pieces of the theta-step


def official_theta(delta, lam, a, xi, rho):
    """The θ-step as the official code writes it: four cases on ‖δ‖ (its softThresholding is
    ``max(0, 1 − t/‖z‖)·z``)."""
    r = float(delta.norm())
    if r <= xi + lam / rho:
        return xi * rho / (lam + xi * rho) * delta
    if r <= lam + lam / rho:
        return (1 - lam / (rho * r)) * delta
    if r <= a * lam:
        return max(0.0, 1 - a * lam / ((a - 1) * rho * r)) * delta / (1 - 1 / ((a - 1) * rho))
    return delta


def official_server(omega, theta, V, selected, lam, a, xi, rho, reset=False):
    """The official server step, in its order (``reset``: θ a fresh zero array first, as the LABELSWAP
    server; its Synthetic server keeps θ): for each participant i (in the order drawn) and every j,
    δ = ω_i − ω_j + V_ij/ρ, θ_ij from δ, θ_ji = −θ_ij, V_ij += ρ(ω_i − ω_j − θ_ij), V_ji = −V_ij; then
    ζ_i = 1/m Σ_j (ω_j + θ_ij − V_ij/ρ), which the code computes at the start of the next round.  Returns
    ζ and the ‖δ‖ of every step."""
    n = omega.shape[0]
    steps = []
    if reset:
        theta.zero_()
    for i in selected:
        for j in range(n):
            delta = omega[i] - omega[j] + V[i, j] / rho
            steps.append(float(delta.norm()))
            theta[i, j] = official_theta(delta, lam, a, xi, rho)
            theta[j, i] = -theta[i, j]
            V[i, j] = V[i, j] + rho * (omega[i] - omega[j] - theta[i, j])
            V[j, i] = -V[i, j]
    zeta = torch.stack([(omega + theta[i] - V[i] / rho).mean(dim=0) for i in range(n)])
    return zeta, torch.tensor(steps)


def _ctx(n, P, dtype=torch.float64):
    return Context(n=n, client_ids=torch.arange(n), clusters=torch.zeros(n, dtype=torch.int64), seed=3,
                   stage1_rounds=0, w0=torch.zeros(P, dtype=dtype), device=torch.device("cpu"))


def _omegas(n, P, rounds, seed=0):
    """ω after each round: two groups 1.5 apart, moving by 0.3 a round, so ‖δ‖ crosses every knot."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.zeros(n, P, dtype=torch.float64)
    centre[n // 2:, 0] = 1.5
    return [centre + 0.3 * torch.randn(n, P, generator=g, dtype=torch.float64) for _ in range(rounds)]


@pytest.mark.parametrize("reset", [False, True])
def test_official_mode_steps_as_the_official_server_loop(reset):
    """Five rounds of 50% participation, float64: fedclust's θ, v and ζ equal the official loop's to
    rounding, every piece of the θ-step taken, pairs with both ends participating stepped twice.  With
    ``fpfc.reset_theta`` the loop zeroes θ before each server step: a pair not stepped reads θ = 0 in ζ
    and in the clusters, fedclust's stored θ (and so v = c·θ) kept."""
    n, P, p = 7, 5, 0.5
    ctx = _ctx(n, P)
    cfg = fpfc.FpfcConfig(lam=LAM, a=A, xi=XI, rho=RHO, nu=0.1, scale_to_model=False, mode="official",
                          evaluate="own", reset_theta=reset)
    algo = fpfc.Fpfc(cfg, participation=p, rounds=5)
    state = algo.init(ctx)
    omega = torch.zeros(n, P, dtype=torch.float64)
    theta, V = torch.zeros(n, n, P, dtype=torch.float64), torch.zeros(n, n, P, dtype=torch.float64)
    i, j = fpfc.pair_index(n)
    seen, resets = [], 0
    for t, after in enumerate(_omegas(n, P, 5), start=1):
        state, res = algo.aggregate(state, ctx, RoundView(round=t, before=None, after=after, all_after=after))
        active = participants(ctx.seed, t, n, p, after.device)
        omega = torch.where(active[:, None], after, omega)
        zeta, steps = official_server(omega, theta, V, torch.nonzero(active).flatten().tolist(), LAM, A, XI, RHO,
                                      reset)
        seen.append(steps)
        stepped = active[i] | active[j]
        read = torch.where(stepped[:, None], state.theta, torch.zeros_like(state.theta)) if reset else state.theta
        assert torch.allclose(read, theta[i, j], rtol=0, atol=1e-12)
        assert torch.equal(state.labels, fpfc.threshold_labels(theta.norm(dim=-1), 0.1))
        if reset:
            resets += int((~stepped & (state.theta.norm(dim=1) > 0)).sum())
        assert torch.allclose(state.v, V[i, j], rtol=0, atol=1e-12)
        assert torch.allclose(state.zeta, zeta, rtol=0, atol=1e-12)
        assert torch.equal(res.models, omega)                  # evaluate=own: each client its own ω_i
    r = torch.cat(seen)
    r = r[r > 0]
    assert set(sum((r > k).long() for k in KNOTS).tolist()) == {0, 1, 2, 3}
    assert resets > 0 or not reset     # some pair held a θ ≠ 0 when a round left it unstepped: the reset mattered


def test_paper_mode_steps_a_pair_of_two_participants_once():
    """The same first round in paper mode is the literal Algorithm 1 (one step a pair), which differs from the
    official loop's second step of the pairs of two participants."""
    n, P = 4, 3
    ctx = _ctx(n, P)
    after = _omegas(n, P, 1)[0]
    steps = {}
    for mode in ("paper", "official"):
        cfg = fpfc.FpfcConfig(lam=LAM, a=A, xi=XI, rho=RHO, nu=0.1, scale_to_model=False, mode=mode)
        algo = fpfc.Fpfc(cfg, participation=1.0, rounds=1)
        state, _ = algo.aggregate(algo.init(ctx), ctx, RoundView(round=1, before=None, after=after, all_after=after))
        steps[mode] = state.theta
    theta, v = fpfc.init_pair_state(n, P, torch.float64)
    fpfc.server_update_(after, theta, v, LAM, A, XI, RHO)
    assert torch.allclose(steps["paper"], theta, rtol=0, atol=1e-12)
    fpfc.server_update_(after, theta, v, LAM, A, XI, RHO)    # a second step with the same ω
    assert torch.allclose(steps["official"], theta, rtol=0, atol=1e-12)
    assert float((steps["official"] - steps["paper"]).abs().max()) > 0.1   # the second step matters


@pytest.mark.parametrize("world,chunk,reset", [(2, None, False), (3, 1, False), (3, 1, True)])
def test_official_steps_give_the_same_bits_on_any_number_of_ranks(world, chunk, reset):
    """The second step keeps ζ's sums exact (its bound, :func:`fpfc.pair_bounds`), and so does the reset
    term −(c/ρ)·θ: 1 and several simulated ranks, float32, give the same bits."""
    n, P = 9, 11
    g = torch.Generator().manual_seed(2)
    omegas = [torch.randn(n, P, generator=g) * (0.1 + 0.5 * k) for k in range(4)]
    actives = [torch.rand(n, generator=g) < 0.6 for _ in range(4)]

    def run(world, chunk):
        ranks = simulated_ranks(n, P, world)
        out = []
        for omega, active in zip(omegas, actives):
            total = sum(fpfc.shard_sweep_(omega, s["rows"], s["diam"], s["ratio"], s["norms"], s["first"], active,
                                          LAM, A, XI, RHO, chunk_pairs=chunk, twice=True, reset=reset)
                        for s in ranks)
            zeta = torch.cat([fpfc.shard_finish(total.clone(), omega, s["ratio"], s["norms"], s["first"],
                                                s["count"]) for s in ranks])
            out.append((zeta, ranks[0]["norms"].clone(), torch.cat([s["rows"] for s in ranks])))
        return out

    for a, b in zip(run(1, None), run(world, chunk)):
        for x, y in zip(a, b):
            assert torch.equal(x, y)


# ----------------------------------------------------------------------------
# Clusters and what a client holds


def _path_norms():
    """4 clients on a path 0 - 1 - 2 - 3 (‖θ‖ = 0.05), ‖θ_03‖ = 0.1 exactly, the rest 0.3."""
    norms = torch.full((4, 4), 0.3)
    for i, j, x in ((0, 1, 0.05), (1, 2, 0.05), (2, 3, 0.05), (0, 3, 0.1)):
        norms[i, j] = norms[j, i] = x
    return norms.fill_diagonal_(0.0)


def test_threshold_reads_as_the_official_code_by_hand():
    """The code's threshold(): lists of ‖θ_ij‖ < 0.1 (strict: 0 and 3 not linked) [0, 1], [0, 1, 2],
    [1, 2, 3], [2, 3], all distinct, so four groups where the paper's components give one; each client labelled
    by the last group holding it (1, 2, 3, 3, renumbered 0, 1, 2, 2); means taken group after group from
    ω = (0, 4, 8, 12): [0, 1] -> 2, 2; [0, 1, 2] -> 4, 4, 4; [1, 2, 3] -> 20/3 each; [2, 3] -> 20/3."""
    norms = _path_norms()
    assert fpfc.threshold_groups(norms, 0.1) == [[0, 1], [0, 1, 2], [1, 2, 3], [2, 3]]
    assert fpfc.threshold_labels(norms, 0.1).tolist() == [0, 1, 2, 2]
    assert fpfc.clusters_from_theta(norms, 0.1).tolist() == [0, 0, 0, 0]
    models = fpfc.threshold_models(torch.tensor([[0.0], [4.0], [8.0], [12.0]], dtype=torch.float64), norms, 0.1)
    assert torch.allclose(models.flatten(), torch.tensor([4.0, 20 / 3, 20 / 3, 20 / 3], dtype=torch.float64))


def test_threshold_on_disjoint_cliques_is_the_components_and_their_means():
    norms = torch.tensor([[0.0, 0.01, 0.5, 0.5], [0.01, 0.0, 0.5, 0.5], [0.5, 0.5, 0.0, 0.02], [0.5, 0.5, 0.02, 0.0]])
    omega = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0], [7.0, 9.0]])
    labels = fpfc.threshold_labels(norms, 0.1)
    assert labels.tolist() == fpfc.clusters_from_theta(norms, 0.1).tolist() == [0, 0, 1, 1]
    assert torch.equal(fpfc.threshold_models(omega, norms, 0.1), fpfc.cluster_models(omega, labels)[labels])


@pytest.mark.parametrize("evaluate,last,want", [
    ("cluster", False, [[2.0, 3.0], [2.0, 3.0]]),
    ("own", True, [[1.0, 2.0], [3.0, 4.0]]),
    ("own_then_cluster", False, [[1.0, 2.0], [3.0, 4.0]]),
    ("own_then_cluster", True, [[2.0, 3.0], [2.0, 3.0]]),
])
def test_held_models_by_hand(evaluate, last, want):
    """A rank holding clients 2 and 3 of 4, clusters {0, 1} and {2, 3}: its clients' own ω, or their
    cluster's mean ((1, 2) + (3, 4))/2 = (2, 3)."""
    ctx = Context(n=4, client_ids=torch.tensor([2, 3]), clusters=None, seed=0, stage1_rounds=0, w0=torch.zeros(2),
                  device=torch.device("cpu"))
    omega = torch.tensor([[9.0, 9.0], [7.0, 7.0], [1.0, 2.0], [3.0, 4.0]])
    got = fpfc.held_models(ctx, omega, torch.tensor([0, 0, 1, 1]), evaluate, last_round=last)
    assert got.tolist() == want


def test_own_then_cluster_reads_the_clusters_in_the_last_round_only():
    n, P = 4, 2
    ctx = _ctx(n, P)
    cfg = fpfc.FpfcConfig(lam=LAM, a=A, xi=XI, rho=RHO, nu=0.1, scale_to_model=False, mode="official",
                          evaluate="own_then_cluster")
    algo = fpfc.Fpfc(cfg, participation=1.0, rounds=2)
    state = algo.init(ctx)
    for t, after in enumerate(_omegas(n, P, 2), start=1):
        state, res = algo.aggregate(state, ctx, RoundView(round=t, before=None, after=after, all_after=after))
        want = after if t == 1 else fpfc.threshold_models(after, fpfc.slot_norm_matrix(state.norms, n), 0.1)
        assert state.labels.tolist() == ([0, 1, 2, 3] if t == 1 else [0, 0, 1, 1])   # two pairs fuse in round 2
        assert torch.allclose(res.models, want, rtol=0, atol=1e-15)


# ----------------------------------------------------------------------------
# Theorem 1: refused in paper mode, warned about in official mode


OFFICIAL = ["algorithm.name=fpfc", "clients=8", "fpfc.mode=official", "fpfc.rho=1", "fpfc.lam=0.6", "fpfc.xi=0.001",
            "fpfc.nu=0.1", "fpfc.scale_to_model=false"]


def test_official_mode_warns_about_theorem1_naming_the_values(capsys):
    cfg = load_config(None, OFFICIAL)
    err = capsys.readouterr().err
    assert cfg.fpfc.rho == 1.0 and "warning" in err
    for text in ("fpfc.rho = 1.0", "lam = 0.6", "xi = 0.001", "a = 3.7", "1200", "Theorem 1"):
        assert text in err


def test_paper_mode_refuses_what_official_mode_warns_about():
    with pytest.raises(ConfigError) as e:
        load_config(None, OFFICIAL + ["fpfc.mode=paper"])
    assert e.value.field == "fpfc.rho" and "1200" in e.value.fix


def test_reset_theta_with_everyone_taking_part_warns_that_it_changes_nothing(capsys):
    load_config(None, OFFICIAL + ["fpfc.reset_theta=true", "participation=0.5"])
    assert "reset_theta" not in capsys.readouterr().err
    load_config(None, OFFICIAL + ["fpfc.reset_theta=true", "participation=1.0"])
    err = capsys.readouterr().err
    assert "fpfc.reset_theta=true changes nothing with participation = 1" in err and "0.5" in err


def test_official_mode_still_refuses_a_theta_step_without_a_unique_solution(capsys):
    """ρ(a − 1) > 1 is what the closed form needs: ρ = 0.3, a = 3.7 gives 0.81."""
    with pytest.raises(ConfigError) as e:
        load_config(None, OFFICIAL + ["fpfc.rho=0.3"])
    assert e.value.field == "fpfc.rho" and "rho*(a-1) > 1" in e.value.fix
    assert fpfc.check_official(LAM, A, XI, 2000.0) is None      # the theorem holds: no warning


@pytest.mark.parametrize("key,value,hint", [("fpfc.mode", "oficial", "official"),
                                            ("fpfc.evaluate", "owns", "own")])
def test_mode_and_evaluate_name_the_closest_value(key, value, hint):
    with pytest.raises(ConfigError) as e:
        load_config(None, OFFICIAL + [f"{key}={value}"])
    assert e.value.field == key and hint in e.value.fix


def test_official_config_files_load_as_the_code_runs(capsys):
    syn = load_config("configs/fpfc_official_synthetic.yaml", [])
    assert (syn.clients, syn.participation, syn.rounds, syn.train.lr, syn.train.momentum, syn.train.local_epochs,
            syn.train.batch_size) == (100, 0.3, 2000, 0.1, 0.0, 10, syn.data.train_size)
    assert (syn.fpfc.mode, syn.fpfc.rho, syn.fpfc.lam, syn.fpfc.xi, syn.fpfc.nu, syn.fpfc.scale_to_model,
            syn.fpfc.evaluate) == ("official", 1.0, 0.6, 0.001, 0.1, False, "own_then_cluster")
    fm = load_config("configs/fpfc_official_fmnist.yaml", [])
    assert (fm.clients, fm.participation, fm.rounds, fm.train.batch_size, fm.train.local_epochs,
            fm.train.momentum) == (20, 0.5, 200, 100, 10, 0.0)
    assert (fm.fpfc.lam, fm.fpfc.xi, fm.fpfc.rho, fm.fpfc.evaluate) == (0.4, 0.001, 1.0, "own")
    assert (fm.fpfc.fuse, syn.fpfc.fuse) == ("head", "all")   # LABELSWAP fuses the head; Synthetic's model is one layer
    assert (fm.fpfc.reset_theta, syn.fpfc.reset_theta) == (True, False)   # LABELSWAP's fresh θ; Synthetic keeps it
    # the code's lr: 0.01, times 0.9 before rounds 0, 5, 10, ... (0-based)
    lr, want = 0.01, []
    for it in range(200):
        if it % 5 == 0:
            lr *= 0.9
        want.append(lr)
    assert [fm.train.round_lr(t) for t in range(1, 201)] == pytest.approx(want, rel=1e-12)


# ----------------------------------------------------------------------------
# train.lr_decay_every


def test_round_lr_by_hand():
    t = TrainConfig(lr=0.009, lr_decay=0.9, lr_decay_every=5)
    assert [t.round_lr(r) for r in (1, 5, 6, 10, 11, 16)] == pytest.approx([0.009, 0.009, 0.0081, 0.0081, 0.00729,
                                                                             0.006561], rel=1e-12)


def test_lr_decay_every_one_is_the_per_round_decay_bit_for_bit():
    t = TrainConfig(lr=0.08, lr_decay=0.99)
    assert t.lr_decay_every == 1
    assert all(t.round_lr(r) == 0.08 * 0.99 ** (r - 1) for r in range(1, 400))


def test_lr_decay_every_below_one_is_refused():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["train.lr_decay_every=0"])
    assert e.value.field == "train.lr_decay_every" and e.value.value == 0 and ">= 1" in e.value.fix


# ----------------------------------------------------------------------------
# fpfc.fuse=head: the official LABELSWAP round (MNIST/FMNIST), the head fused, the body averaged


def test_head_layers_are_the_last_layers_tensors_by_hand():
    """mlp 784-200-200-10: fc3 (10·200 + 10), from column 784·200 + 200 + 200·200 + 200 = 197,200; logreg's
    only layer is its head (no body); a last parameter of the root module cannot be told a layer."""
    from fedclust.engine.layout import ParamLayout
    from fedclust.models import build_model

    layout = ParamLayout.from_module(build_model("mlp", (1, 28, 28), 10))
    assert fpfc.head_layers(layout) == (("fc3.weight", "fc3.bias"), 197_200) and layout.numel - 197_200 == 2010
    assert fpfc.head_layers(ParamLayout.from_module(build_model("logreg", (60,), 10))) == (("fc1.weight",
                                                                                            "fc1.bias"), 0)
    scaled = torch.nn.Module()        # the root's own tensors come first: the head is still fc
    scaled.scale = torch.nn.Parameter(torch.ones(3))
    scaled.fc = torch.nn.Linear(3, 2)
    assert fpfc.head_layers(ParamLayout.from_module(scaled)) == (("fc.weight", "fc.bias"), 3)
    bare = torch.nn.Module()          # weights of the root module itself: no layer to call the head
    bare.w = torch.nn.Parameter(torch.ones(2, 3))
    bare.b = torch.nn.Parameter(torch.ones(2))
    with pytest.raises(ConfigError) as e:
        fpfc.head_layers(ParamLayout.from_module(bare))
    assert e.value.field == "fpfc.fuse" and "'b'" in str(e.value) and "fpfc.fuse=all" in e.value.fix


def test_average_body_by_hand():
    """Participants 0 and 2 of 3, body = columns 0, 1: their bodies become ((1, 2) + (5, 6))/2 = (3, 4);
    client 1 keeps its own; the head column is untouched."""
    omega = torch.tensor([[1.0, 2.0, 10.0], [7.0, 8.0, 20.0], [5.0, 6.0, 30.0]])
    got = fpfc.average_body_(omega.clone(), torch.tensor([True, False, True]), 2)
    assert got.tolist() == [[3.0, 4.0, 10.0], [7.0, 8.0, 20.0], [3.0, 4.0, 30.0]]
    assert torch.equal(fpfc.average_body_(omega.clone(), torch.tensor([True, False, True]), 0), omega)


def official_labelswap_round(models, theta, V, selected, x, y, orders, lr, batch, head_names, reset=False):
    """One round of the official LABELSWAP code (FLAlgorithms/FPFC.py), written plainly per client with
    one module each: W_old = every model's head; each participant i, in turn, gets
    ζ_i = 1/m Σ_j (W_old_j + θ_ij − V_ij/ρ) and trains (client(): plain SGD, no momentum, the head's
    gradient plus ρ(ω − ζ_i), the body's alone); server(): the pairs of every participant and every j
    stepped over the heads (official_server; the code's [classes, dim + 1] head matrix is a permutation of
    the flat weight-then-bias head, and the θ-step is norm-based, so the same numbers), then the
    participants' bodies replaced by their plain mean.  ``reset``: θ a fresh zero array before each server
    step, as the code (``fpfc.reset_theta``); else kept between rounds, as Algorithm 1.  Returns the next
    round's ζ."""
    def head(m):
        return torch.cat([p.detach().reshape(-1) for name, p in m.named_parameters() if name in head_names])

    old = torch.stack([head(m) for m in models])
    for i in selected:
        zeta = (old + theta[i] - V[i] / RHO).mean(dim=0)
        centre, off = {}, 0
        for name, p in models[i].named_parameters():
            if name in head_names:
                centre[name], off = zeta[off:off + p.numel()].view_as(p), off + p.numel()
        for epoch in range(orders.shape[0]):
            for start in range(0, x.shape[1], batch):
                idx = orders[epoch, i, start:start + batch]
                loss = torch.nn.functional.cross_entropy(models[i](x[i, idx]), y[i, idx])
                grads = torch.autograd.grad(loss, list(models[i].parameters()))
                with torch.no_grad():
                    for (name, p), g in zip(models[i].named_parameters(), grads):
                        p -= lr * (g + RHO * (p - centre[name])) if name in head_names else lr * g
    heads = torch.stack([head(m) for m in models])
    zeta, _ = official_server(heads, theta, V, selected, LAM, A, XI, RHO, reset)
    with torch.no_grad():
        for name, p in models[0].named_parameters():
            if name not in head_names:
                mean = torch.stack([dict(models[i].named_parameters())[name] for i in selected]).mean(dim=0)
                for i in selected:
                    dict(models[i].named_parameters())[name].copy_(mean)
    return zeta


@pytest.mark.parametrize("reset", [False, True])
def test_head_fusion_trains_and_steps_as_the_official_labelswap_round(reset):
    """Four rounds, 6 clients of a small MLP, 50% participation, float64: fedclust's plan (the proximal
    term on the head only), its engine's local training and its aggregate (pairs over the head, bodies
    averaged) give every client's model and ζ of the plain per-client rewrite of the official round."""
    from fedclust import rng
    from fedclust.engine.layout import ParamLayout
    from fedclust.engine.train import TrainSettings, train_round
    from fedclust.models import build_model

    n, N, p, lr, batch = 6, 8, 0.5, 0.2, 4
    torch.manual_seed(0)
    module = build_model("mlp", (5,), 3).double()
    layout = ParamLayout.from_module(module)
    names, first = fpfc.head_layers(layout)
    w0 = layout.flatten(module)
    x = torch.randn(n, N, 5, dtype=torch.float64) + torch.arange(n, dtype=torch.float64)[:, None, None] % 2
    y = torch.randint(0, 3, (n, N))
    models = [build_model("mlp", (5,), 3).double() for _ in range(n)]
    for m in models:
        layout.load_into(m, w0)
    ctx = Context(n=n, client_ids=torch.arange(n), clusters=None, seed=3, stage1_rounds=0, w0=w0,
                  device=torch.device("cpu"))
    cfg = fpfc.FpfcConfig(lam=LAM, a=A, xi=XI, rho=RHO, nu=0.1, scale_to_model=False, mode="official",
                          evaluate="own", fuse="head", reset_theta=reset)
    algo = fpfc.Fpfc(cfg, participation=p, rounds=4, prox_layers=names, first=first)
    state = algo.init(ctx)
    assert state.zeta.shape == (n, layout.numel - first) and state.theta_rows.shape[-1] == layout.numel - first
    P_head = layout.numel - first
    theta, V = torch.zeros(n, n, P_head, dtype=torch.float64), torch.zeros(n, n, P_head, dtype=torch.float64)
    settings = TrainSettings(lr=lr, momentum=0.0, batch_size=batch, epochs=2)
    for t in range(1, 5):
        orders = rng.batch_orders(0, t, torch.arange(n), 2, N)
        state, plan = algo.plan(state, ctx, t, None)
        assert plan.prox_layers == names and torch.equal(plan.anchor[:, first:], state.zeta)
        flat = plan.start.clone()
        train_round(flat, layout, builtin("mlp"), x, y, orders, settings, anchor=plan.anchor, mu=plan.mu,
                    prox_layers=plan.prox_layers)
        state, res = algo.aggregate(state, ctx, RoundView(round=t, before=None, after=flat, all_after=flat))
        active = participants(ctx.seed, t, n, p)
        selected = torch.nonzero(active).flatten().tolist()
        zeta = official_labelswap_round(models, theta, V, selected, x, y, orders, lr, batch, names, reset)
        want = torch.stack([layout.flatten(m) for m in models])
        assert torch.allclose(state.omega, want, rtol=0, atol=1e-10)
        assert torch.allclose(state.zeta, zeta, rtol=0, atol=1e-10)
        assert torch.equal(res.models, state.omega)                    # evaluate=own
        bodies = state.omega[:, :first]
        assert torch.equal(bodies[active], bodies[selected[0]].expand(len(selected), -1))
        if t > 1:   # a non-participant keeps a body of its own
            assert (bodies[~active] - bodies[selected[0]]).abs().amax() > 1e-6
    assert float(state.norms.max()) > 0.01        # the heads moved apart: the pairs did something


def test_fuse_is_checked_and_a_checkpoint_of_the_other_fuse_is_refused(capsys):
    with pytest.raises(ConfigError) as e:
        load_config(None, OFFICIAL + ["fpfc.fuse=body"])
    assert e.value.field == "fpfc.fuse" and "head" in e.value.fix
    cfg = load_config(None, OFFICIAL + ["fpfc.fuse=head", "model=mlp", "data.name=synthetic",
                                        "data.synthetic_dim=20"])
    algo = fpfc.Fpfc.from_config(cfg, run_facts(cfg))
    assert algo.prox_layers == ("fc3.weight", "fc3.bias") and algo.first == 20 * 200 + 200 + 200 * 200 + 200
    P = algo.first + 200 * 10 + 10
    ctx = _ctx(8, P, torch.float32)
    whole = fpfc.Fpfc(fpfc.FpfcConfig(lam=LAM, a=A, xi=XI, rho=RHO, mode="official"), 1.0, 2)
    saved = whole.state_dict(whole.init(ctx))
    with pytest.raises(ConfigError) as e:
        algo.load_state_dict(ctx, saved)
    assert e.value.field == "fpfc.fuse" and f"{P} columns" in str(e.value) and "overwrite=true" in e.value.fix
    head = algo.state_dict(algo.init(ctx))
    assert algo.load_state_dict(ctx, head).theta_rows.shape[-1] == 2010


