"""The whole-run tests of tests/unit/test_bench_scale.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_bench_scale import ROOT, TINY, P  # noqa: E402

from fedclust.bench import scale as bench_scale


def test_one_process_runs_and_gathers_nothing(capsys):
    assert bench_scale.main(["--clients", "16,8", "--rounds", "2", "--json", *TINY]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["clients"] for r in rows] == [8, 16]                 # smallest first
    for r in rows:
        assert r["processes"] == 1 and r["algorithm"] == "random" and r["device"] == "cpu" and r["params"] == P
        assert len(r["round_seconds"]) == 2 and r["s_per_round"] == r["round_seconds"][1]   # round 1 untimed
        assert r["gathers_per_round"] == 0                          # one process: no collective at all
        assert r["gather_bytes_per_round"] is None and r["gather_mb_per_round"] is None
        assert r["gather_s_per_round"] is None
        assert len(r["peak_rss_mb"]) == 1 and r["peak_rss_mb"][0] > 10 and r["peak_cuda_mb"] is None
    assert "| 8 | 1 |" in bench_scale.table(rows)


def test_two_processes_gather_bytes_by_hand():
    """Each rank receives every rank's padded shard of [weights (P), training loss, flags] in float32."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "fedclust", "bench-scale", "--clients", "8,17", "--rounds", "2", "--json", *TINY]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)                                   # rank 0 alone prints
    by_n = {r["clients"]: r for r in rows}
    assert by_n[8]["gather_bytes_per_round"] == 8 * (P + 1 + 1) * 4
    assert by_n[17]["gather_bytes_per_round"] == 2 * 9 * (P + 1 + 1) * 4    # shards 9 + 8, padded to 9 rows
    for r in rows:
        assert r["processes"] == 2 and r["gathers_per_round"] == 1
        assert r["gather_mb_per_round"] * 2**20 == r["gather_bytes_per_round"]
        assert r["predicted_gather_mb_per_round"] == r["gather_mb_per_round"]
        assert r["gather_s_per_round"] > 0
        assert len(r["peak_rss_mb"]) == 2 and all(m > 10 for m in r["peak_rss_mb"])


def test_select_memory_bench_runs_and_counts_the_kept_state():
    """experiments/select_memory.py (docs/speed-and-scale.md, "Scale"): a record per algorithm; the state kept between
    rounds is what the state's tensors hold, per [C, n] entry."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "experiments/select_memory.py", "--clients", "60", "--algorithms",
                          "random,panm_grad", "--json"], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    got = {r["algorithm"]: r for r in json.loads(out.stdout)}
    assert sorted(got) == ["panm_grad", "random"] and all(r["clients"] == 60 for r in got.values())
    assert got["random"]["kept_bytes_per_entry"] == 0
    # per entry of [60, 60]: two bool masks (neighbour list, pool), the HNM flag (1 byte a client), the
    # similarities on the pools (float32, 2l = 20 of them a client in stage two) and client 0's row (float32)
    assert got["panm_grad"]["kept_bytes_per_entry"] == pytest.approx(2 + (1 + 4 * 20 + 4) / 60)
    assert all(r["peak_bytes_per_entry"] >= 0 for r in got.values())
