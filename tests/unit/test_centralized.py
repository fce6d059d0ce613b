"""Centralized rivals (SPEC §5): FedAvg, FedProx, IFCA, CFL, FedGroup,
FedGrouProx and FPFC as round objects and end to end.

Round objects are checked against plain loops over clients/pairs on small
hand-made tensors; whole runs on clustered Synthetic data (dimension 1, so
every client sees most of its cluster's labelling function) must recover
the true clusters; FedAvg/FedProx runs are compared with a plain
``torch.optim.SGD`` computation; one clustering method runs on 1 and on 2
processes.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedclust import rng
from fedclust.algorithms import aggregation, cfl, fedgroup, fedprox, fpfc, ifca
from fedclust.algorithms.base import Context, RoundView
from fedclust.algorithms.fpfc import check_fpfc_memory, fpfc_memory_need
from fedclust.config import load_config, run_facts
from fedclust.data import load_federated
from fedclust.errors import ConfigError
from fedclust.metrics import adjusted_rand_index
from fedclust.models import build_model, initial_weights
from fedclust.runmodel import parameter_count
from fedclust.runner import prepare, run

SYN = ["data.name=synthetic", "clients=12", "data.train_size=200", "data.test_size=50", "data.synthetic_dim=1",
       "data.synthetic_alpha=0", "data.synthetic_beta=0", "seed=0", "rounds=12", "progress=false", "figures=false",
       "model=mlp"]


def run_cfg(tmp_path, *extra, name="run"):
    cfg = load_config(None, SYN + [f"out={tmp_path / name}", *extra])
    return cfg, run(cfg, prepare(cfg))


def read_metrics(path):
    return [json.loads(line) for line in Path(path, "metrics.jsonl").read_text().splitlines()]


def fake_ctx(n, P, pair_loss=None, seed=3, client_ids=None):
    ids = torch.arange(n) if client_ids is None else client_ids
    return Context(n=n, client_ids=ids, clusters=torch.zeros(n, dtype=torch.int64), seed=seed, stage1_rounds=0,
                   w0=torch.zeros(P), device=torch.device("cpu"), pair_loss=pair_loss)


def same_partition(a, b):
    return adjusted_rand_index(np.asarray(a), np.asarray(b)) == pytest.approx(1.0)


# ----------------------------------------------------------------------------
# Whole runs


def plain_round(cfg, models, anchor=None, mu=0.0):
    """One round of SPEC §3 local training per client with torch.optim.SGD,
    plus ``mu/2 ||w - anchor||^2`` in the loss (FedProx); returns [n, P]."""
    n = cfg.clients
    data = load_federated(cfg.data, n, cfg.seed)
    layout, _ = initial_weights("mlp", data.input_shape, data.num_classes, cfg.seed)
    module = build_model("mlp", data.input_shape, data.num_classes)
    orders = rng.batch_orders(cfg.seed, 1, torch.arange(n), cfg.train.local_epochs, cfg.data.train_size)
    out = []
    for c in range(n):
        layout.load_into(module, models[c])
        opt = torch.optim.SGD(module.parameters(), lr=cfg.train.lr, momentum=cfg.train.momentum)
        for e in range(cfg.train.local_epochs):
            for start in range(0, cfg.data.train_size, cfg.train.batch_size):
                idx = orders[e, c, start:start + cfg.train.batch_size]
                loss = F.cross_entropy(module(data.train_x[c, idx]), data.train_y[c, idx])
                if mu:
                    w = torch.cat([p.reshape(-1) for p in module.parameters()])
                    loss = loss + 0.5 * mu * (w - anchor).pow(2).sum()
                opt.zero_grad()
                loss.backward()
                opt.step()
        out.append(layout.flatten(module))
    return torch.stack(out), data, module, layout


@pytest.mark.parametrize("name,mu", [("fedavg", 0.0), ("fedprox", 0.5)])
def test_fedavg_and_fedprox_round_equal_a_plain_computation(tmp_path, name, mu):
    """After one round every client holds the mean of the models trained
    from the global w0 (FedProx: with the proximal term towards w0)."""
    cfg, s = run_cfg(tmp_path, f"algorithm.name={name}", *([f"fedprox.mu={mu}"] if mu else []), "rounds=1")
    _, w0 = initial_weights("mlp", (cfg.data.synthetic_dim,), 10, cfg.seed)
    trained, data, module, layout = plain_round(cfg, w0.expand(cfg.clients, -1), anchor=w0, mu=mu)
    layout.load_into(module, trained.mean(0))
    with torch.no_grad():
        logits = module(data.test_x.flatten(0, 1)).view(cfg.clients, cfg.data.test_size, -1)
        loss = F.cross_entropy(logits.flatten(0, 1), data.test_y.flatten(), reduction="none").view(cfg.clients, -1)
        acc = (logits.argmax(-1) == data.test_y).double().mean(1) * 100
    record = read_metrics(tmp_path / "run")[0]
    assert record["loss"] == pytest.approx(float(loss.mean(1).mean()), rel=1e-4)
    assert np.abs(np.array(record["client_accuracy"]) - acc.numpy()).max() <= 100 / cfg.data.test_size + 1e-6
    assert s["num_clusters"] == 1 and s["models_received_total"] == 2 * cfg.clients


# ----------------------------------------------------------------------------
# Round objects against plain loops


def test_participants_match_a_plain_draw():
    n, seed = 13, 7
    for t in (1, 2, 5):
        for share in (0.1, 0.3, 0.5, 0.99):
            keys = [float(rng.uniform(seed, t, "participation", torch.tensor(i), 0)) for i in range(n)]
            want = sorted(range(n), key=lambda i: keys[i])[:max(1, math.ceil(share * n - 1e-9))]
            got = aggregation.participants(seed, t, n, share)
            assert sorted(got.nonzero().flatten().tolist()) == sorted(want)
    assert aggregation.participants(seed, 1, n, 1.0).all()
    assert int(aggregation.participants(seed, 1, 10, 0.3).sum()) == 3   # 0.3 * 10 is 3.0000000000000004


def test_fedavg_object_ignores_non_participants():
    n, P = 6, 4
    ctx = fake_ctx(n, P, client_ids=torch.tensor([2, 3]))
    algo = fedprox.FedProx(participation=0.5, fedprox=fedprox.FedProxConfig(mu=0.3))
    state = algo.init(ctx)
    state, plan = algo.plan(state, ctx, 1, torch.zeros(2, P))
    assert torch.equal(plan.start, torch.zeros(2, P)) and torch.equal(plan.anchor, plan.start) and plan.mu == 0.3
    after = torch.randn(n, P, generator=torch.Generator().manual_seed(0))
    state, res = algo.aggregate(state, ctx, RoundView(round=1, before=plan.start, after=after[2:4], all_after=after))
    active = aggregation.participants(ctx.seed, 1, n, 0.5)
    want = sum(after[i] for i in range(n) if active[i]) / int(active.sum())
    assert torch.allclose(state.model, want) and torch.allclose(res.models, want.expand(2, -1))
    assert res.received.tolist() == [float(active[2]), float(active[3])]
    assert res.server_received == res.server_sent == 3


def test_ifca_object_against_a_plain_loop():
    n, P, K = 6, 5, 3
    g = torch.Generator().manual_seed(1)
    targets = torch.randn(n, P, generator=g)

    def pair_loss(models, owner):    # a stand-in training loss: distance to the client's target
        return (models - targets[owner]).pow(2).sum(1)

    ctx = fake_ctx(n, P, pair_loss)
    algo = ifca.Ifca(lambda seed: initial_weights("mlp", (1,), 2, seed)[1], ifca.IfcaConfig(clusters=K, restarts=1),
                     participation=1.0)
    models = torch.randn(K, P, generator=g)
    state = ifca.IfcaState(models=models, assignment=torch.zeros(n, dtype=torch.int64))
    state, plan = algo.plan(state, ctx, 1, torch.zeros(n, P))
    choice = [min(range(K), key=lambda k: float((models[k] - targets[i]).pow(2).sum())) for i in range(n)]
    assert torch.equal(plan.start, models[choice])
    after = torch.randn(n, P, generator=g)
    view = RoundView(round=1, before=plan.start, after=after, all_after=after, all_labels=plan.labels)
    new, res = algo.aggregate(state, ctx, view)
    for k in range(K):
        members = [i for i in range(n) if choice[i] == k]
        want = sum(after[i] for i in members) / len(members) if members else models[k]
        assert torch.allclose(new.models[k], want)
    assert res.assignment.tolist() == choice
    assert torch.allclose(res.models, new.models[choice])
    assert res.received.tolist() == [K] * n and res.server_sent == K * n and res.server_received == n


def test_ifca_inits_are_w0_then_seeded_draws():
    layout, w0 = initial_weights("mlp", (3,), 4, 11)
    inits = ifca.cluster_inits(w0, 3, 11, lambda seed: initial_weights("mlp", (3,), 4, seed)[1])
    assert torch.equal(inits[0], w0)
    k1 = int(rng.hash_ints(11, 0, "ifca_init", torch.tensor(1), 0))
    assert torch.equal(inits[1], initial_weights("mlp", (3,), 4, k1)[1])
    assert not torch.equal(inits[1], inits[2])


def test_cfl_object_splits_like_scipy_complete_linkage():
    # scipy imported where used: at module level every collecting worker pays for it
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    n, P = 8, 6
    g = torch.Generator().manual_seed(2)
    e = torch.zeros(P)
    e[0] = 1.0
    # two incongruent groups: updates +e and -e plus noise; their mean is near zero
    updates = torch.cat([2 * e + 0.3 * torch.randn(4, P, generator=g), -2 * e + 0.3 * torch.randn(4, P, generator=g)])
    updates = updates[torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])]
    ctx = fake_ctx(n, P)
    algo = cfl.Cfl(cfl.CflConfig(eps1=0.4, eps2=1.6, warmup=1, scale_to_model=False))
    state = algo.init(ctx)
    after = updates          # w0 = 0: the trained model is the update
    view = RoundView(round=1, before=torch.zeros(n, P), after=after, all_after=after, all_labels=state.labels)
    state, res = algo.aggregate(state, ctx, view)        # round 1 = warm-up: no split
    assert state.models.shape[0] == 1 and torch.allclose(state.models[0], after.mean(0))
    base = state.models[0]
    after2 = base + updates
    view = RoundView(round=2, before=base.expand(n, -1), after=after2, all_after=after2, all_labels=state.labels)
    mean_norm, max_norm = updates.mean(0).norm(), updates.norm(dim=1).max()
    assert mean_norm < 0.4 and max_norm > 1.6
    state, res = algo.aggregate(state, ctx, view)
    cos = (updates @ updates.T) / (updates.norm(dim=1)[:, None] * updates.norm(dim=1)[None] + 1e-12)
    dist = 1 - cos.double().numpy()
    np.fill_diagonal(dist, 0)
    ref = fcluster(linkage(squareform(dist, checks=False), "complete"), 2, "maxclust")
    assert same_partition(res.assignment.numpy(), ref) and same_partition(ref, [0, 1] * 4)
    for c in range(2):
        members = (res.assignment == c)
        assert torch.allclose(state.models[c], after2[members].mean(0))
    assert state.splits == [(2, 0, 1)]


def test_cfl_absent_members_of_a_split_pick_a_half_next_round():
    """participation 0.5: the split partitions the 4 participants; the 4
    absent members pick, in their next round, the half of lower loss (a
    stand-in loss: distance to a target), which the server reads off the
    gathered start models."""
    n, P = 8, 6
    e = torch.zeros(P)
    e[0] = 2.0
    ctx = fake_ctx(n, P, seed=1)
    algo = cfl.Cfl(cfl.CflConfig(eps1=0.4, eps2=1.6, warmup=1, scale_to_model=False), participation=0.5)
    assert algo.gathers_labels and not algo.gathers_before   # each client's cluster, not its model
    state = algo.init(ctx)
    state, _ = algo.aggregate(state, ctx, RoundView(round=1, before=torch.zeros(n, P), after=torch.zeros(n, P),
                                                     all_after=torch.zeros(n, P), all_labels=state.labels))
    active = aggregation.participants(ctx.seed, 2, n, 0.5)
    on = active.nonzero().flatten().tolist()
    off = (~active).nonzero().flatten().tolist()
    updates = torch.zeros(n, P)
    updates[on[0]], updates[on[1]] = e, e * 1.1
    updates[on[2]], updates[on[3]] = -e, -e * 1.1
    updates[off] = 100.0           # absent: never averaged
    state, res = algo.aggregate(state, ctx, RoundView(round=2, before=torch.zeros(n, P), after=updates,
                                                     all_after=updates, all_labels=state.labels))
    assert state.models.shape[0] == 2 and same_partition(res.assignment[on].numpy(), [0, 0, 1, 1])
    half = {i: int(res.assignment[i]) for i in on}
    assert torch.allclose(state.models[half[on[0]]], e * 1.05) and torch.allclose(state.models[half[on[2]]], -e * 1.05)
    assert state.pending[off].tolist() == [1] * 4 and state.pending[on].tolist() == [-1] * 4
    wants = [0, 1, 1, 0]           # the half each absent client will find better
    targets = torch.zeros(n, P)
    for i, w in zip(off, wants):
        targets[i] = state.models[w] + 0.01

    ctx.pair_loss = lambda models, owner: (models - targets[owner]).pow(2).sum(1)
    state3, plan = algo.plan(state, ctx, 3, res.models)
    for i, w in zip(off, wants):
        assert torch.equal(plan.start[i], state.models[w])
    after = plan.start.clone()
    state3, res3 = algo.aggregate(state3, ctx, RoundView(round=3, before=plan.start, after=after, all_after=after,
                                                        all_labels=plan.labels))
    assert [int(res3.assignment[i]) for i in off] == wants and (state3.pending == -1).all()
    active3 = aggregation.participants(ctx.seed, 3, n, 0.5)
    want_received = [2.0 if i in off else float(active3[i]) for i in range(n)]
    assert res3.received.tolist() == want_received


def test_cfl_thresholds_in_round1_units_and_the_bipartition_bound():
    """scale_to_model: eps read in units of u_1 / 3.2 (u_1 = round 1's mean
    update norm); a cluster passing the norm test splits only if
    gamma_max < sqrt((1 - alpha_max^cross) / 2)."""
    n, P = 4, 3
    ctx = fake_ctx(n, P)
    first = 6.4 * torch.eye(P)[[0, 1, 0, 1]]                 # round 1: every update has norm 6.4 = 2 x 3.2
    ring = 4.0 * torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [-1.0, 0, 0], [0, -1.0, 0]])   # mean 0, norms 4
    for gamma, splits in ((0.5, 1), (0.75, 0)):   # best bipartition {0,1}|{2,3}: alpha_cross = 0, bound 0.707
        algo = cfl.Cfl(cfl.CflConfig(eps1=0.4, eps2=1.6, gamma_max=gamma, warmup=1, scale_to_model=True))
        state = algo.init(ctx)
        state, _ = algo.aggregate(state, ctx, RoundView(round=1, before=torch.zeros(n, P), after=first,
                                                         all_after=first, all_labels=state.labels))
        assert state.reference_norm == pytest.approx(6.4) and algo.thresholds(6.4) == pytest.approx((0.8, 3.2))
        base = state.models[0]
        after = base + ring
        state, res = algo.aggregate(state, ctx, RoundView(round=2, before=base.expand(n, -1), after=after,
                                                           all_after=after, all_labels=state.labels))
        assert len(state.splits) == splits and state.models.shape[0] == 1 + splits
        (t, c, alpha, accepted), = state.checks
        assert (t, c, accepted) == (2, 0, bool(splits)) and alpha == pytest.approx(0.0, abs=1e-6)
        if splits:
            assert same_partition(res.assignment.numpy(), [0, 0, 1, 1])


def test_fedgroup_cold_start_and_newcomers_against_plain_loops():
    n, P, m = 12, 8, 2
    g = torch.Generator().manual_seed(4)
    dirs = torch.randn(m, P, generator=g)
    truth = torch.tensor([0, 1] * 6)
    updates = dirs[truth] + 0.1 * torch.randn(n, P, generator=g)
    ctx = fake_ctx(n, P, seed=5)
    algo = fedgroup.FedGroup(fedgroup.FedGroupConfig(groups=m, pretrain_scale=3, inter_lr=0.01))   # S = 6 of 12 clients
    state = algo.init(ctx)
    state, plan = algo.plan(state, ctx, 1, torch.zeros(n, P))
    assert torch.equal(plan.start, torch.zeros(n, P)) and plan.anchor is None
    view = RoundView(round=1, before=plan.start, after=updates, all_after=updates)
    state, res = algo.aggregate(state, ctx, view)
    S = fedgroup.cold_start_clients(ctx.seed, n, 6)
    assert int(S.sum()) == 6
    start = fedgroup.group_cold_start(updates[S], ctx.w0, m, ctx.seed)
    assert torch.equal(res.assignment[S], start["assign"])
    for i in (~S).nonzero().flatten().tolist():    # Eq. 10, plain
        scores = [(1 - float(F.cosine_similarity(start["updates"][j], updates[i], dim=0))) / 2 for j in range(m)]
        assert int(res.assignment[i]) == min(range(m), key=lambda j: scores[j])
    assert same_partition(res.assignment.numpy(), truth.numpy())
    assert torch.allclose(state.groups, start["models"])
    assert torch.allclose(res.models, state.groups[res.assignment])
    # round 2: members train from their group's model; intra-group mean, then inter-group aggregation
    state2, plan = algo.plan(state, ctx, 2, res.models)
    assert torch.equal(plan.start, state.groups[res.assignment])
    after = plan.start + torch.randn(n, P, generator=g)
    state2, res2 = algo.aggregate(state2, ctx, RoundView(round=2, before=plan.start, after=after, all_after=after))
    intra = torch.stack([after[res.assignment == j].mean(0) for j in range(m)])
    units = intra / intra.norm(dim=1, keepdim=True)
    inv = 1 / intra.norm(dim=1)
    for j in range(m):
        o = [l for l in range(m) if l != j]
        want = (intra[j] + 0.01 * sum(units[l] for l in o)) / (1 + 0.01 * sum(inv[l] for l in o))
        assert torch.allclose(state2.groups[j], want, atol=1e-6)
    assert torch.allclose(state2.global_model, state2.groups.mean(0))
    assert torch.allclose(state2.group_updates, state2.groups - state.groups)


def test_fedgrouprox_trains_with_the_proximal_term_towards_the_group_model():
    ctx = fake_ctx(4, 3)
    algo = fedgroup.FedGrouProx(fedgroup.FedGroupConfig(groups=2, pretrain_scale=2), fedprox=fedprox.FedProxConfig(mu=0.1))
    state = algo.init(ctx)
    state.groups = torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])
    state.assignment = torch.tensor([1, 0, -1, 1])
    _, plan = algo.plan(state, ctx, 2, torch.zeros(4, 3))
    want = torch.stack([state.groups[1], state.groups[0], state.global_model, state.groups[1]])
    assert torch.equal(plan.start, want) and torch.equal(plan.anchor, want) and plan.mu == 0.1


def plain_fpfc_server(omega, theta, v, lam, a, xi, rho):
    """Algorithm 1's server step with [n, n, P] state and loops over pairs."""
    n = omega.shape[0]
    theta, v = theta.clone(), v.clone()
    for i in range(n):
        for j in range(i + 1, n):
            delta = omega[i] - omega[j] + v[i, j] / rho
            r = delta.norm()
            s = fpfc.theta_shrink(r, lam, a, xi, rho)
            theta[i, j] = delta * (s / r) if r > 0 else 0 * delta
            v[i, j] = v[i, j] + rho * (omega[i] - omega[j] - theta[i, j])
            theta[j, i], v[j, i] = -theta[i, j], -v[i, j]
    zeta = torch.stack([sum(omega[j] + theta[i, j] - v[i, j] / rho for j in range(n)) / n for i in range(n)])
    return theta, v, zeta


def test_fpfc_object_against_the_literal_algorithm():
    n, P = 5, 4
    g = torch.Generator().manual_seed(6)
    ctx = fake_ctx(n, P)   # every client: FPFC's pairs are split between ranks by client, so one rank needs all
    algo = fpfc.Fpfc(fpfc.FpfcConfig(lam=0.5, a=3.7, xi=0.25, rho=5.0, nu=0.25, scale_to_model=True))   # rho > 2 lam/xi = 4
    state = algo.init(ctx)
    centres = torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0]])
    after = centres[torch.tensor([0, 0, 1, 1, 1])] + 0.05 * torch.randn(n, P, generator=g)
    state, plan = algo.plan(state, ctx, 1, torch.zeros(n, P))
    assert torch.equal(plan.start, torch.zeros(n, P)) and torch.equal(plan.anchor, torch.zeros(n, P))
    assert plan.mu == 5.0
    new, res = algo.aggregate(state, ctx, RoundView(round=1, before=plan.start, after=after, all_after=after))
    u1 = float(after.norm(dim=1).mean())     # w0 = 0
    assert new.scale == pytest.approx(u1)
    th, v, z = plain_fpfc_server(after, torch.zeros(n, n, P), torch.zeros(n, n, P), 0.5 * u1, 3.7, 0.25 * u1, 5.0)
    i, j = fpfc.pair_index(n)
    assert torch.allclose(new.theta, th[i, j], atol=1e-6) and torch.allclose(new.v, v[i, j], atol=1e-6)
    assert torch.allclose(new.zeta, z, atol=1e-6)
    # clusters: connected components of ||theta_ij|| <= nu * u1, plain BFS
    adj = th.norm(dim=2) <= 0.25 * u1
    labels, seen = [-1] * n, 0
    for s in range(n):
        if labels[s] < 0:
            stack, labels[s] = [s], seen
            while stack:
                x = stack.pop()
                for y in range(n):
                    if adj[x, y] and labels[y] < 0:
                        labels[y] = seen
                        stack.append(y)
            seen += 1
    assert res.assignment.tolist() == labels == [0, 0, 1, 1, 1]
    for r, c in enumerate(range(n)):
        members = [k for k in range(n) if labels[k] == labels[c]]
        assert torch.allclose(res.models[r], after[members].mean(0))
    # next round: clients train from their own omega towards their zeta
    _, plan = algo.plan(new, ctx, 2, res.models)
    assert torch.equal(plan.start, after) and torch.equal(plan.anchor, new.zeta) and plan.mu == 5.0


# ----------------------------------------------------------------------------
# Config checks


@pytest.mark.parametrize("overrides,field", [
    (["algorithm.name=ifca", "ifca.clusters=0"], "ifca.clusters"),
    (["algorithm.name=ifca", "ifca.clusters=13"], "ifca.clusters"),
    (["algorithm.name=cfl", "cfl.eps1=0"], "cfl.eps1"),
    (["algorithm.name=cfl", "cfl.eps1=2.0"], "cfl.eps1"),
    (["algorithm.name=cfl", "cfl.eps2=.inf"], "cfl.eps2"),
    (["algorithm.name=cfl", "cfl.warmup=-1"], "cfl.warmup"),
    (["algorithm.name=cfl", "cfl.warmup=12"], "cfl.warmup"),
    (["algorithm.name=cfl", "cfl.gamma_max=1"], "cfl.gamma_max"),
    (["algorithm.name=cfl", "cfl.gamma_max=-0.1"], "cfl.gamma_max"),
    (["algorithm.name=fedgroup", "fedgroup.groups=0"], "fedgroup.groups"),
    (["algorithm.name=fedgroup", "fedgroup.pretrain_scale=0"], "fedgroup.pretrain_scale"),
    (["algorithm.name=fedgroup", "fedgroup.pretrain_scale=1"], "fedgroup.pretrain_scale"),
    (["algorithm.name=fedgrouprox", "fedgroup.inter_lr=-0.1"], "fedgroup.inter_lr"),
    (["algorithm.name=fedprox", "fedprox.mu=-1"], "fedprox.mu"),
    (["algorithm.name=fedgrouprox", "fedprox.mu=.nan"], "fedprox.mu"),
    (["algorithm.name=fpfc", "fpfc.lam=0"], "fpfc.lam"),
    (["algorithm.name=fpfc", "fpfc.a=1"], "fpfc.a"),
    (["algorithm.name=fpfc", "fpfc.xi=2.5"], "fpfc.xi"),           # xi < lam = 2
    (["algorithm.name=fpfc", "fpfc.rho=0.3"], "fpfc.rho"),
    (["algorithm.name=fpfc", "fpfc.lam=1", "fpfc.xi=0.1", "fpfc.rho=19.9"], "fpfc.rho"),   # Theorem 1: rho > 20
    (["algorithm.name=fpfc", "fpfc.nu=-1"], "fpfc.nu"),
    (["algorithm.name=fedavg", "participation=0"], "participation"),
    (["algorithm.name=fedavg", "participation=1.5"], "participation"),
])
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, SYN + overrides)
    assert e.value.field == field and field in str(e.value)


def test_fpfc_refuses_a_pairwise_state_that_does_not_fit():
    cfg = load_config(None, SYN + ["algorithm.name=fpfc"])
    n, P = cfg.clients, parameter_count(cfg)
    assert P == 1 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10
    need = fpfc_memory_need(n, P)
    assert need >= n * (n - 1) * P * 4 + 3 * n * P * 4        # theta and v, plus omega, zeta and a buffer
    check_fpfc_memory(cfg, run_facts(cfg), available=(need, "host memory (MemAvailable)"))     # fits exactly
    free = fpfc_memory_need(7, P)
    with pytest.raises(ConfigError) as e:
        check_fpfc_memory(cfg, run_facts(cfg), available=(free, "host memory (MemAvailable)"))
    msg = str(e.value)
    assert e.value.field == "clients" and "at most 7 clients" in msg and f"P = {P}" in msg and "GiB" in msg
    with pytest.raises(ConfigError) as e:     # through validation: 5000 clients of a 199 210-parameter MLP
        load_config(None, ["algorithm.name=fpfc", "clients=5000", "data.share_images=true"])
    assert e.value.field == "clients" and "at most" in str(e.value)
