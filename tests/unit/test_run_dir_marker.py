"""Never delete what fedclust did not write: a run directory carries its own marker (.fedclust-run), written
before anything else; a folder that is neither empty nor fedclust's is refused before any data is read,
overwrite=true included; a fresh start removes only the files fedclust writes; directories of earlier
versions (no marker, fedclust's config.yaml) keep working and gain the marker."""

import json
import os
import re
from pathlib import Path

import pytest

from fedclust.cli import main
from fedclust.config import load_config
from fedclust.errors import ConfigError, OutputError
from fedclust.outputs import (
    FIGURE_FILES,
    LOCK_NAME,
    MARKER_NAME,
    RunLock,
    check_run_dir,
    clear_run,
    mark_run_dir,
)
from fedclust.runner import prepare, run
from fedclust.schema import to_dict

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["data.name=synthetic", "data.train_size=40", "data.test_size=20", "clients=8", "rounds=4",
         "stage1_rounds=2", "algorithm.k=2", "algorithm.l=3", "progress=false", "figures=false", "seed=5",
         "algorithm.name=random", "checkpoint_every=2"]


def config(out, *extra):
    return load_config(None, SMALL + [f"out={out}", *extra])


def small_run(out, *extra):
    cfg = config(out, *extra)
    return run(cfg, prepare(cfg))


def files(d: Path) -> dict:
    """Every file under ``d`` (hidden ones too) with its bytes."""
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def users_folder(d: Path) -> Path:
    """A user's folder of their own figures and checkpoints: not a fedclust run directory."""
    (d / "figures").mkdir(parents=True)
    (d / "checkpoints").mkdir()
    (d / "figures" / "fig1.png").write_bytes(b"\x89PNG the user's figure")
    (d / "checkpoints" / "resnet_epoch90.ckpt").write_bytes(b"90 epochs of training")
    return d


# ----------------------------------------------------------------------------
# A folder that is not fedclust's is refused, before anything is read or written


def test_a_users_folder_is_refused_and_nothing_is_deleted(tmp_path, capsys):
    d = users_folder(tmp_path / "mine")
    before = files(d)
    with pytest.raises(ConfigError) as e:
        prepare(config(d))
    msg = str(e.value)
    assert e.value.field == "out" and "checkpoints/, figures/" in msg and MARKER_NAME in msg
    assert "another out=DIR" in msg and "never removes what it did not write" in msg
    assert main(["run", *SMALL, f"out={d}"]) == 2                 # the whole command: one line, exit 2
    err = capsys.readouterr().err
    assert "config field 'out'" in err and "Traceback" not in err
    assert files(d) == before and sorted(os.listdir(d)) == ["checkpoints", "figures"]   # no marker, no lock


def test_overwrite_true_on_a_users_folder_is_refused_too(tmp_path):
    d = users_folder(tmp_path / "mine")
    before = files(d)
    for extra in (["overwrite=true"], ["overwrite=true", "resume=never"], ["resume=never"]):
        with pytest.raises(ConfigError) as e:
            prepare(config(d, *extra))
        assert e.value.field == "out" and "not a fedclust run directory" in str(e.value)
    assert "overwrite=true replaces only a fedclust run" in str(prepare_error(d, "overwrite=true"))
    assert main(["run", *SMALL, f"out={d}", "overwrite=true"]) == 2
    assert files(d) == before and sorted(os.listdir(d)) == ["checkpoints", "figures"]


def prepare_error(d, *extra) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        prepare(config(d, *extra))
    return e.value


def test_hidden_files_count_and_five_entries_are_named(tmp_path):
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / ".DS_Store").write_bytes(b"\0")
    msg = str(prepare_error(hidden))
    assert "it holds .DS_Store (every entry counts, hidden ones too)" in msg
    many = tmp_path / "many"
    many.mkdir()
    for i in range(7):
        (many / f"f{i}.txt").write_text("x")
    msg = str(prepare_error(many))
    assert "it holds f0.txt, f1.txt, f2.txt, f3.txt, f4.txt and 2 more (every" in msg and "f5.txt" not in msg


def test_a_foreign_config_yaml_does_not_make_a_run_directory(tmp_path):
    """A config.yaml counts only as one fedclust wrote: every key it has written since its first version."""
    d = tmp_path / "project"
    d.mkdir()
    (d / "config.yaml").write_text("algorithm:\n  name: random\nrounds: 4\n")   # a hand-written config
    (d / "notes.txt").write_text("mine")
    assert "config.yaml, notes.txt" in str(prepare_error(d, "overwrite=true"))
    (d / "config.yaml").write_text("{{{ not yaml")
    assert "config.yaml, notes.txt" in str(prepare_error(d))


def test_new_and_empty_folders_are_fine_and_prepare_writes_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for d in (tmp_path / "new" / "deeper", empty):
        assert prepare(config(d)).resume_from is None
        assert prepare(config(d, "overwrite=true")).resume_from is None
    assert not (tmp_path / "new").exists() and os.listdir(empty) == []


def test_a_lock_left_by_an_earlier_fedclust_is_its_run_directory(tmp_path):
    """An earlier fedclust took the lock before it wrote config.yaml: a run killed while its data loaded left
    the lock alone (with W&B's folder, when a fresh start had removed the rest)."""
    d = tmp_path / "killed"
    (d / "wandb" / "offline-run-1").mkdir(parents=True)
    (d / LOCK_NAME).write_text("pid 1 on node since 2024-01-01 00:00:00\n")
    assert prepare(config(d)).resume_from is None
    only_wandb = tmp_path / "wandb-only"                       # W&B's folder alone is not a sign of fedclust
    (only_wandb / "wandb").mkdir(parents=True)
    assert "wandb/" in str(prepare_error(only_wandb))
    (d / "mine.txt").write_text("x")                             # anything else with the lock: not fedclust's alone
    assert "mine.txt" in str(prepare_error(d))


# ----------------------------------------------------------------------------
# The marker, and what a fresh start removes


def test_the_lock_marks_the_directory_first(tmp_path):
    d = tmp_path / "run"
    with RunLock(d):
        marker = json.loads((d / MARKER_NAME).read_text())
        assert marker["format"] == 1 and marker["fedclust"] and marker["created"]
        assert sorted(os.listdir(d)) == sorted([MARKER_NAME, LOCK_NAME])
    (d / MARKER_NAME).write_text('{"format": 1, "fedclust": "x", "created": "then"}\n')
    mark_run_dir(d)                                              # marked: left as it is
    assert json.loads((d / MARKER_NAME).read_text())["created"] == "then"
    with RunLock.for_rank(tmp_path / "other", 1):                # only rank 0 writes
        assert not (tmp_path / "other").exists()
    check_run_dir(d, overwrite=True)                             # a marked directory is fedclust's


def test_a_directory_another_rank_marks_during_the_check_is_accepted(tmp_path, monkeypatch):
    """Every rank checks ``out``; rank 0's RunLock may make it and write the marker and the config between another
    rank's first look (no marker) and its listing: the listing's marker is looked at again, not refused as the
    user's (the race a 2-process CI run hit)."""
    import fedclust.outputs as outputs

    d = tmp_path / "run"
    d.mkdir()
    listdir = os.listdir

    def rank0_marks_first(path):
        mark_run_dir(Path(path))
        (Path(path) / "config.yaml").write_text("being written\n")
        return listdir(path)

    monkeypatch.setattr(outputs.os, "listdir", rank0_marks_first)
    check_run_dir(d, overwrite=False)
    (d / MARKER_NAME).unlink()                                  # a listing naming no marker is still refused
    monkeypatch.setattr(outputs.os, "listdir", listdir)
    with pytest.raises(ConfigError, match="not a fedclust run directory.*config.yaml"):
        check_run_dir(d, overwrite=False)


def fill(d: Path) -> None:
    """A marked run directory: every file a run writes, beside the user's own."""
    (d / "checkpoints").mkdir(parents=True)
    (d / "figures").mkdir()
    (d / "wandb").mkdir()
    mark_run_dir(d)
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "neighbors.npz", "wandb.json", ".config.yaml.tmp77",
                 LOCK_NAME, "checkpoints/round-000004.pt", "checkpoints/round-000002.pt.tmp123",
                 "wandb/run.wandb", *(f"figures/{f}" for f in FIGURE_FILES)):
        (d / name).write_text("fedclust's")
    for name in ("notes.txt", "checkpoints/resnet_epoch90.ckpt", "checkpoints/round-4.pt", "figures/fig1.png"):
        (d / name).write_text("the user's")


def test_a_fresh_start_removes_only_fedclusts_files(tmp_path):
    d = tmp_path / "run"
    fill(d)
    removed, kept = clear_run(d)
    assert removed == ["config.yaml", "metrics.jsonl", "summary.json", "neighbors.npz", "figures", "checkpoints",
                       "wandb.json", ".config.yaml.tmp77"]
    assert kept == ["checkpoints/resnet_epoch90.ckpt", "checkpoints/round-4.pt", "figures/fig1.png", "notes.txt"]
    assert sorted(files(d)) == sorted([MARKER_NAME, LOCK_NAME, "checkpoints/resnet_epoch90.ckpt",
                                       "checkpoints/round-4.pt", "figures/fig1.png", "notes.txt", "wandb/run.wandb"])
    (d / "figures" / "fig1.png").unlink()
    (d / "figures" / "accuracy.png").write_text("fedclust's")
    assert clear_run(d) == (["figures"], ["checkpoints/resnet_epoch90.ckpt", "checkpoints/round-4.pt", "notes.txt"])
    assert not (d / "figures").exists()                          # emptied: the folder goes too


def test_a_linked_checkpoints_folder_stays_and_an_unmarked_one_is_never_cleared(tmp_path):
    d, elsewhere = tmp_path / "run", tmp_path / "scratch"
    elsewhere.mkdir()
    (elsewhere / "round-000002.pt").write_text("fedclust's")
    d.mkdir()
    (d / "checkpoints").symlink_to(elsewhere)
    mark_run_dir(d)
    assert clear_run(d) == (["checkpoints"], [])
    assert (d / "checkpoints").is_symlink() and os.listdir(elsewhere) == []
    users = users_folder(tmp_path / "mine")
    before = files(users)
    with pytest.raises(OutputError, match=f"holds no {MARKER_NAME}"):
        clear_run(users)
    assert files(users) == before


def test_figure_names_are_those_the_figures_write():
    source = (ROOT / "fedclust" / "figures.py").read_text()
    assert set(re.findall(r'fig_dir / "([\w.]+)"', source)) == set(FIGURE_FILES)


# ----------------------------------------------------------------------------
# Directories of earlier fedclust versions


def test_an_earlier_versions_config_yaml_is_read_as_fedclusts(tmp_path):
    """A run killed before its first checkpoint by an earlier fedclust: the same config restarts, another is
    refused unless overwrite=true, as in a marked directory."""
    d = tmp_path / "old"
    d.mkdir()
    saved = to_dict(config(d))
    (d / "config.yaml").write_text(json.dumps(saved))   # YAML is a superset of JSON
    (d / "metrics.jsonl").write_text("")
    assert prepare(config(d)).resume_from is None
    e = prepare_error(d, "algorithm.name=local")
    assert "a run of another config" in str(e) and "algorithm.name" in str(e)
    assert prepare(config(d, "algorithm.name=local", "overwrite=true")).resume_from is None
    assert sorted(os.listdir(d)) == ["config.yaml", "metrics.jsonl"]   # prepare writes nothing


# ----------------------------------------------------------------------------
# The marker is the first thing written
