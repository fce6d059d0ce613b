"""The command line: help texts, --version, check --keys, a bare `fedclust run`, and what each command imports."""

import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedclust.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedclust {importlib.metadata.version('fedclust')}"


@pytest.mark.parametrize("command", ["run", "check"])
def test_help_says_where_runs_go_how_they_resume_and_the_exit_statuses(command, capsys, monkeypatch):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())     # argparse wraps lines: compare words
    assert "runs/<algorithm>-<data>-s<seed>-<time>" in text
    assert "resume" in text and "overwrite=true" in text and "fedclust check --keys" in text
    assert "exit status" in text and "2" in text
    if command == "run":
        assert ("75 stopped by SIGUSR1 or SIGTERM, after writing a checkpoint or during start-up before writing "
                "anything: run the same command again") in text
        # and a stopped run does exit with it
        from fedclust import cli
        from fedclust.stopping import Stopped

        def stopped(args):
            raise Stopped(7, 10, Path("runs/x/checkpoints/round-000007.pt"), None)

        monkeypatch.setattr(cli, "_run", stopped)
        assert main(["run", "seed=0"]) == 75
        assert "stopped on SIGUSR1 after round 7" in capsys.readouterr().err


def test_bare_run_is_refused_with_the_two_ways_to_start(monkeypatch, capsys):
    import fedclust.config

    def no_run(*args, **kwargs):
        raise AssertionError("a bare `fedclust run` must not load a config (it would start the 300-round default)")

    monkeypatch.setattr(fedclust.config, "load_config", no_run)
    assert main(["run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedclust: error: fedclust run needs a CONFIG file or KEY=VALUE overrides")
    assert "fedclust run configs/fmnist_rotation2.yaml" in err and "fedclust run seed=0" in err
    # the help's promise: CONFIG may be left out when overrides are given
    args = build_parser().parse_args(["run", "seed=0", "rounds=3"])
    assert (args.config, args.overrides) == ("seed=0", ["rounds=3"])


def test_bare_check_prints_the_defaults(capsys):
    assert main(["check"]) == 0
    got = yaml.safe_load(capsys.readouterr().out)
    assert (got["seed"], got["clients"], got["rounds"], got["train"]["lr_decay"]) == (0, 100, 300, 0.99)
    assert (got["algorithm"]["name"], got["checkpoint_every"], got["overwrite"]) == ("local", 0, False)


def test_check_keys_prints_key_default_and_meaning_aligned(capsys):
    from fedclust.config import valid_keys

    assert main(["check", "--keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[:lines.index("")]
    assert table[0].split() == ["key", "default", "meaning"]
    starts = {len(line) - len(line[len(line.split()[0]):].lstrip()) for line in table}
    assert len(starts) == 1                                  # the default column starts at one offset
    rows = {line.split()[0]: line.split(maxsplit=2)[1:] for line in table[1:]}
    assert sorted(rows) == sorted(valid_keys())
    assert all(len(v) == 2 and v[1] != "-" for v in rows.values())   # every key has a meaning
    assert rows["train.lr_decay"][0] == "0.99" and "lr_decay^(t-1)" in rows["train.lr_decay"][1]
    assert rows["seed"][0] == "0" and "2^32" in rows["seed"][1]
    assert rows["out"][0] == '""' and "runs/<algorithm>-<data>-s<seed>-<time>" in rows["out"][1]
    assert rows["checkpoint_every"][0] == "0" and "by the clock" in rows["checkpoint_every"][1]
    assert rows["overwrite"][0] == "false" and rows["wandb.tags"][0] == "[]"
    assert rows["fpfc.rho"][0] == "10.0" and rows["pens.count"][0] == "reference"
    names = re.fullmatch(r"algorithm.name is one of: (.*)", lines[-1]).group(1).split(", ")
    assert {"local", "panm_grad", "pens", "fpfc"} <= set(names)


IMPORTS = "import sys\nfrom fedclust.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n" \
          "print('HEAVY', sorted(m for m in ('torch', 'lightning', 'lightning_fabric', 'torchmetrics', 'matplotlib') if m in sys.modules))"


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["run", "--help"],
                                  ["theory", "cni", "--n", "10", "--a", "5", "--l", "3", "--k", "2", "--rounds", "2"]])
def test_light_commands_do_not_import_torch(argv):
    out = subprocess.run([sys.executable, "-c", IMPORTS.format(argv=argv)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120).stdout
    assert out.splitlines()[-1] == "HEAVY []"


def test_a_tracker_that_fails_to_close_on_a_stop_does_not_stop_the_requeue(monkeypatch, capsys):
    """W&B's service can take the job's signal too and be gone when the run tells it it is preempted: the
    failure is said in one line and the job is requeued all the same."""
    import signal
    from pathlib import Path
    from types import SimpleNamespace

    from fedclust import runner

    class Gone:
        def finish(self, exit_code, preempting=False):
            raise ConnectionResetError("Connection lost\nmore")

    monkeypatch.setattr(runner, "requeue", lambda: ("561", True))
    stop = SimpleNamespace(signal=signal.SIGUSR1)
    got = runner._stopped(SimpleNamespace(rank=0), SimpleNamespace(tracker=Gone()), 6, stop, Path("ck.pt"))
    assert (got.round, got.job, got.requeued) == (6, "561", True)
    assert "Slurm job 561 requeued" in str(got)
    err = capsys.readouterr().err
    assert "W&B did not close cleanly on the stop (ConnectionResetError: Connection lost)" in err
