"""The whole-run tests of tests/unit/test_sweep.py's subject (runs in this process or launched ones); the unit
tests are in that file."""

from __future__ import annotations

from test_sweep import run_sweep_cli, write  # noqa: E402


def test_local_sweep_runs_every_point_offline_then_nothing_again(tmp_path):
    path = write(tmp_path, """\
        # two tiny runs, tracked by W&B offline
        method: grid
        metric: {name: final_accuracy, goal: maximize}
        parameters:
          seed: {values: [0, 1]}
        command: [python, -m, fedclust, run, configs/synthetic_cluster4.yaml, clients=8, rounds=2,
                  figures=false, progress=false, wandb.enabled=true, "${args_no_hyphens}"]
        """, "tiny.yaml")
    out = tmp_path / "runs"
    proc = run_sweep_cli(path, "--local", "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for seed in (0, 1):
        run = out / f"seed={seed}"
        assert (run / "summary.json").is_file(), proc.stdout + proc.stderr
        assert f"seed: {seed}" in (run / "config.yaml").read_text()
        assert len(list((run / "wandb").glob("offline-run-*"))) == 1   # offline: nothing left for the server
    assert f"wandb sync {out}/*/wandb/offline-run-*" in proc.stdout
    again = run_sweep_cli(path, "--local", "--out", out)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to submit: all 2 runs are finished" in again.stdout
    assert again.stdout.count("skip ") == 2 and "run    " not in again.stdout
    for seed in (0, 1):
        assert len(list((out / f"seed={seed}" / "wandb").glob("offline-run-*"))) == 1
