"""fedclust report never averages runs whose settings differ (issue 44, part 1): a run's setting is every key that
can change its numbers (fedclust.setting), recorded in summary.json; runs that differ in a network, attack,
sharing, training or partition key land in different columns, headed by what differs; runs of one label that
differ in a key of their method are kept apart in rows of their own, and the report says so."""

from __future__ import annotations

import copy

from test_report import config_of, run_report, summary, write_run

from fedclust import report
from fedclust.setting import NOT_SETTING, run_setting


def with_keys(config: dict, **dotted) -> dict:
    """``config`` with dotted keys set (``network__graph="ring"`` sets network.graph)."""
    out = copy.deepcopy(config)
    for key, value in dotted.items():
        *parents, last = key.split("__")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def family_runs(tmp_path):
    """Six PANMGrad runs of one data setting and seed: the complete graph, a ring, a regular graph, 20% sign-flip
    attackers, 30% offline, partial sharing (the six that were pooled into one cell)."""
    changes = {"complete": {}, "ring": dict(network__graph="ring"),
               "regular": dict(network__graph="regular", network__degree=6),
               "signflip": dict(attack__fraction=0.2), "offline": dict(network__p_offline=0.3),
               "personal": dict(share__personal=["head"])}
    dirs = {}
    for i, (name, change) in enumerate(changes.items()):
        s = summary("panm_grad", 0, 70.0 + i)
        dirs[name] = write_run(tmp_path, name, s, config=with_keys(config_of(s), **change))
    return dirs


def test_runs_of_each_network_attack_and_sharing_key_get_columns_of_their_own(tmp_path, capsys):
    dirs = family_runs(tmp_path)
    res = report.Results(report.load_runs(list(dirs.values())))
    assert len(res.settings) == 6 and all(len(rs) == 1 for rs in res.groups.values())
    headers = [res.header(k) for k in res.settings]
    for part in ("network.graph=ring", "network.graph=regular", "network.degree=6", "attack.fraction=0.2",
                 "network.p_offline=0.3", "share.personal=[head]"):
        assert sum(part in h for h in headers) == 1, (part, headers)
    rc, out, err = run_report(capsys, list(dirs.values()))
    assert rc == 0 and "76.40" not in out and "seed 0 more than once" not in err
    # the complete graph's cell is its own run's number, not a mean over six
    assert res.cell("panm_grad", res.settings[[i for i, h in enumerate(headers)
                                                if "network.graph=complete" in h][0]], "final_accuracy")[0] == 70.0


def test_a_method_key_keeps_runs_of_one_label_apart_and_says_so(tmp_path, capsys):
    runs = []
    for c, seed in ((2, 0), (2, 1), (4, 0)):
        s = summary("dfca", seed, 80.0 + c + seed)
        runs.append(write_run(tmp_path, f"dfca{c}-{seed}", s, config=with_keys(config_of(s), dfca__clusters=c)))
    res = report.Results(report.load_runs(runs))
    assert sorted(res.labels) == ["dfca [dfca.clusters=2]", "dfca [dfca.clusters=4]"]
    key = res.settings[0]
    assert res.cell("dfca [dfca.clusters=2]", key, "final_accuracy")[2] == 2
    assert res.cell("dfca [dfca.clusters=4]", key, "final_accuracy")[:2] == (84.0, None)
    rc, out, err = run_report(capsys, runs)
    assert rc == 0 and "| dfca [dfca.clusters=4] | 1 |" in out
    assert "dfca (fmnist, rotation 2): its runs differ in dfca.clusters, so they are kept apart" in err
    assert "give each variant its own label=" in err


def test_a_partition_and_a_training_key_split_columns_and_unrecorded_settings_are_kept_apart(tmp_path):
    s = summary("random", 0, 80.0)
    runs = [write_run(tmp_path, "iid", s, config=config_of(s)),
            write_run(tmp_path, "dir", s, config=with_keys(config_of(s), data__partition="dirichlet",
                                                           data__alpha=0.1)),
            write_run(tmp_path, "lr", s, config=with_keys(config_of(s), train__lr=0.01)),
            write_run(tmp_path, "bare", s, config=False)]          # no config.yaml, no recorded setting
    res = report.Results(report.load_runs(runs))
    headers = sorted(res.header(k) for k in res.settings)
    assert len(headers) == 4
    assert any("dirichlet 0.1" in h for h in headers) and any("train.lr=0.01" in h for h in headers)
    assert any("setting=not recorded" in h for h in headers)


def test_keys_that_cannot_change_the_numbers_never_split_a_cell(tmp_path):
    runs = []
    for seed, extra in enumerate([{}, dict(device="cpu", engine="loop", exchange_mb=1.0, out="x", progress=False,
                                            wandb={"enabled": True}, checkpoint_every=5, collective_timeout=9.0,
                                            plugins=["p.py"], other_sections=True, data__root="/elsewhere")]):
        s = summary("random", seed, 80.0 + seed)
        runs.append(write_run(tmp_path, f"r{seed}", s, config=with_keys(config_of(s), **extra)))
    res = report.Results(report.load_runs(runs))
    assert len(res.settings) == 1 and res.cell("random", res.settings[0], "final_accuracy")[2] == 2
    assert {"out", "seed", "label", "wandb.", "device", "checkpoint_every"} <= set(NOT_SETTING)


def test_the_setting_names_a_file_by_its_hash_and_drops_what_the_method_does_not_read():
    cfg = {"algorithm": {"name": "fedavg", "k": 7}, "data": {"name": "npz", "path": "/a/b.npz"},
           "network": {"availability": "trace.npy"}, "model": "/home/me/net.py:Net", "dac": {"tau": 3}}
    got = run_setting(cfg, {"data.path": {"sha256": "ab" * 32}, "model": {"fingerprint": "cd" * 32}})
    assert got["data.path"] == "sha256:" + "ab" * 32 and got["network.availability"] == "path:trace.npy"
    assert got["model"] == "net.py:Net" and got["model_fingerprint"] == "cd" * 32
    assert "algorithm.k" not in got and "dac.tau" not in got and "stage1_rounds" not in got
    assert "network.graph" in got and "attack.fraction" in got and "seed" not in got and "out" not in got




def test_a_run_recorded_before_a_key_existed_shares_the_cell_of_a_run_at_that_keys_default(tmp_path):
    """summary.json's setting of a run from before data.drift_round (say) lacks the key: it reads as config.yaml
    gives it (absent: its default, as runs behaved), so the run is averaged with a new run at that default, and
    kept apart from one that sets it otherwise."""
    runs = []
    for seed, (drop, drift) in enumerate([(True, 0), (False, 0), (False, 3)]):
        s = summary("random", seed, 80.0 + seed)
        config = with_keys(config_of(s), data__drift_round=drift) if drift else config_of(s)
        setting = run_setting(config)
        assert setting["data.drift_round"] == drift   # by hand: absent from config.yaml, the key's default 0
        if drop:
            setting = {k: v for k, v in setting.items() if not k.startswith("data.drift")}
        runs.append(write_run(tmp_path, f"r{seed}", dict(s, setting=setting), config=config))
    res = report.Results(report.load_runs(runs))
    assert len(res.settings) == 2
    cells = sorted(res.cell("random", k, "final_accuracy")[2] for k in res.settings)
    assert cells == [1, 2]
