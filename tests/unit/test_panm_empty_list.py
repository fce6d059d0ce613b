"""panm.empty_list: in stage two a client whose list is empty (a late joiner) takes, at HNM, the top k of its
candidates (fill; CNI's rule), or stays empty (stay: HNM's EM has no sampled neighbour to start from)."""

import torch
from panm_build import make_panm_loss
from test_panm_em_input import loss_table  # the same hand-made losses: N = 10, clusters {0..4}, {5..9}

from fedclust.algorithms.base import Context, RoundView
from fedclust.config import Config
from fedclust.upgrade import config as upgraded

N, K = 10, 2


def round_two(rule: str, empty: list[int]):
    """T1 = 1, l = n - 1 (every other client is a candidate); round 1's CNI lists, then ``empty``'s rows
    cleared (clients that were not there), then round 2 (stage two, HNM every round)."""
    cfg = Config()
    cfg.algorithm.k, cfg.algorithm.l, cfg.panm.tau, cfg.stage1_rounds = K, N - 1, 1, 1
    cfg.panm.empty_list = rule
    alg = make_panm_loss(cfg)
    ids, table = torch.arange(N), loss_table()

    def pair_loss(models, local_index):
        return table[ids[local_index], models.argmax(1)].to(torch.float32)   # model j = unit vector j

    ctx = Context(n=N, client_ids=ids, clusters=ids // 5, seed=3, stage1_rounds=1, w0=torch.zeros(N),
                  device=torch.device("cpu"), pair_loss=pair_loss)
    models = torch.eye(N)
    view = RoundView(round=1, before=models, after=models, all_after=models)
    state, _ = alg.select(alg.init(ctx), ctx, view)
    state.neighbors[empty] = False
    state, chosen = alg.select(state, ctx, RoundView(round=2, before=models, after=models, all_after=models))
    return state, chosen.mask()


def members(row: torch.Tensor) -> list[int]:
    return torch.nonzero(row).flatten().tolist()


def test_fill_gives_an_empty_list_the_top_k_of_its_candidates_and_leaves_the_others_to_hnm():
    filled, chosen = round_two("fill", [0, 7])
    stayed, chosen_stay = round_two("stay", [0, 7])
    # the two same-cluster peers of lowest loss (highest 1/F), by hand from the table
    assert members(filled.neighbors[0]) == [1, 2] and members(filled.neighbors[7]) == [5, 6]
    assert members(chosen[0]) == [1, 2] and members(chosen[7]) == [5, 6]   # k = 2 drawn from 2: both
    assert filled.hnm_failed[[0, 7]].tolist() == [False, False]
    # stay: EM has no sampled neighbour (component A starts empty), so the rows stay empty and average with none
    assert not stayed.neighbors[[0, 7]].any() and not chosen_stay[[0, 7]].any()
    assert stayed.hnm_failed[[0, 7]].tolist() == [True, True]
    rest = [i for i in range(N) if i not in (0, 7)]
    assert torch.equal(filled.neighbors[rest], stayed.neighbors[rest])
    assert torch.equal(chosen[rest], chosen_stay[rest])


def test_no_empty_list_fill_and_stay_are_identical():
    a, ca = round_two("fill", [])
    b, cb = round_two("stay", [])
    assert torch.equal(a.neighbors, b.neighbors) and torch.equal(ca, cb)
    assert all(len(members(row)) >= 1 for row in a.neighbors)


def test_a_checkpoint_written_before_the_key_reads_stay():
    saved = {"algorithm": {"name": "panm_grad"}, "panm": {"tau": 1}}
    assert upgraded(saved)["panm.empty_list"] == "stay"
    assert Config().panm.empty_list == "fill"
