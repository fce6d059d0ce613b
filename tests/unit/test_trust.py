"""Runs and exports passed between people (issue 43, parts 1, 4 and 5): reading them imports no code without the
user's say, and a user model only when it is the run's; an export is checked file by file and never half
written; ``evaluate --data`` gets the training loader's checks and reads only the arrays it needs."""

from __future__ import annotations

import json
import os
import signal
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch

import fedclust
from fedclust import checkpoint
from fedclust.cli import main
from fedclust.config import load_config
from fedclust.errors import DataError, OutputError
from fedclust.export import evaluate_run, export_run
from fedclust.runner import prepare, run
from fedclust.trust import UntrustedCode

SMALL = ["rounds=2", "progress=false", "figures=false", "algorithm.name=random", "algorithm.k=2"]

MODEL_FILE = '''import torch
from torch import nn

SIZE = {size}


class Net(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.fc = nn.Linear(input_shape[0], SIZE)
        self.out = nn.Linear(SIZE, num_classes)

    def forward(self, x):
        return self.out(torch.relu(self.fc(x)))
'''
SENTINEL_LINE = "open({path!r}, 'w').write('imported')\n"


def clients_file(path: Path, n: int = 4, d: int = 6, seed: int = 0) -> dict:
    """A natural-form file of ``n`` clients, ``d`` features, 3 classes."""
    r = np.random.default_rng(seed)
    owners = np.repeat(np.arange(n), 6)
    arrays = {"x_train": r.normal(size=(len(owners), d)).astype(np.float32), "y_train": np.arange(len(owners)) % 3,
              "x_test": r.normal(size=(len(owners), d)).astype(np.float32), "y_test": (np.arange(len(owners)) + 1) % 3,
              "client_train": owners, "client_test": owners}
    np.savez(path, **arrays)
    return arrays


def small_run(out: Path, data: Path, *extra) -> None:
    cfg = load_config(None, SMALL + ["data.name=npz", f"data.path={data}", "clients=4", f"out={out}", *extra])
    run(cfg, prepare(cfg))


@pytest.fixture
def user_run(tmp_path):
    """A finished run of a user model (``model.py:Net``) on a file of 4 clients, and its model file."""
    model = tmp_path / "model.py"
    model.write_text(MODEL_FILE.format(size=8))
    clients_file(tmp_path / "clients.npz")
    small_run(tmp_path / "run", tmp_path / "clients.npz", f"model={model}:Net")
    return tmp_path / "run", model


def rewrite_checkpoint(run_dir: Path, change) -> None:
    """Edit the newest checkpoint's contents and recompute its checksum, as someone handing over a crafted
    directory would (the checksum proves a file whole, not who wrote it)."""
    path = checkpoint.candidates(run_dir)[0][1]
    payload = torch.load(path, weights_only=True)
    change(payload)
    payload[checkpoint.CHECKSUM] = checkpoint.digest(payload)
    torch.save(payload, path)


# ----------------------------------------------------------------------------
# 1. No code is imported without the user's say


def test_a_plugin_planted_in_a_checkpoint_is_never_imported_without_trust(tmp_path, capsys):
    clients_file(tmp_path / "clients.npz")
    small_run(tmp_path / "run", tmp_path / "clients.npz")
    planted = tmp_path / "run" / "evil.py"
    sentinel = tmp_path / "ran"
    planted.write_text(SENTINEL_LINE.format(path=str(sentinel)))
    rewrite_checkpoint(tmp_path / "run", lambda p: p["config"].update(plugins=[str(planted)]))
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "names code that reading it would import and run (plugins: " + str(planted) in err
    assert "--trust-code" in err and "trust_code=True" in err
    for call in (lambda: export_run(tmp_path / "run", tmp_path / "x"),
                 lambda: fedclust.load_client_model(tmp_path / "run", 0)):
        with pytest.raises(UntrustedCode, match="evil.py"):
            call()
    assert not sentinel.exists() and not (tmp_path / "x").exists()
    # the user says so: then the plugin is imported (and the run evaluates as before)
    assert main(["evaluate", str(tmp_path / "run"), "--trust-code", "--json"]) == 0
    assert sentinel.read_text() == "imported"


def test_a_user_model_is_imported_only_with_trust_and_only_when_it_is_the_runs(user_run, tmp_path):
    run_dir, model = user_run
    sentinel = tmp_path / "ran"
    with pytest.raises(UntrustedCode, match=f"model: {model}:Net"):
        fedclust.load_client_model(run_dir, 1)
    with pytest.raises(UntrustedCode, match="model.py"):
        evaluate_run(run_dir)
    with pytest.raises(UntrustedCode, match="model.py"):
        export_run(run_dir, tmp_path / "x")
    export_run(run_dir, tmp_path / "x", trust_code=True)
    with pytest.raises(UntrustedCode, match="model_source.py"):       # the export's own copy of the file
        fedclust.load_client_model(tmp_path / "x", 1)
    got = fedclust.load_client_model(tmp_path / "x", 1, trust_code=True)
    ref = fedclust.load_client_model(run_dir, 1, trust_code=True)
    assert type(got).__name__ == "Net" and all(torch.equal(a, b) for a, b in zip(got.parameters(), ref.parameters()))
    # the export's copy is checked byte for byte: an edited copy is refused before it is imported
    copy = tmp_path / "x" / "model_source.py"
    copy.write_text(SENTINEL_LINE.format(path=str(sentinel)) + copy.read_text())
    with pytest.raises(OutputError, match="model_source.py is not what was exported"):
        fedclust.load_client_model(tmp_path / "x", 1, trust_code=True)
    assert not sentinel.exists()
    # an export without a copy (an earlier fedclust's) reads the file at its path: an edit elsewhere in the file (a
    # comment, another statement) leaves the model the run's, another model in it is refused before it is imported
    manifest = json.loads((tmp_path / "x" / "manifest.json").read_text())
    manifest["files"]["model_source"] = None
    manifest.pop("sha256")
    copy.unlink()
    (tmp_path / "x" / "manifest.json").write_text(json.dumps(manifest))
    model.write_text("# a note\n" + MODEL_FILE.format(size=8) + "\nOTHER = 3\n")
    with pytest.warns(UserWarning, match="without checksums"):
        fedclust.load_client_model(tmp_path / "x", 1, trust_code=True)
    model.write_text(SENTINEL_LINE.format(path=str(sentinel)) + MODEL_FILE.format(size=9))
    with pytest.raises(UntrustedCode, match=r"model\.py is not the run's: its definition changed"):
        fedclust.load_client_model(tmp_path / "x", 1, trust_code=True)
    assert not sentinel.exists()
    # and for the run directory (its checkpoint records the definition): refused too, before the import
    with pytest.raises(UntrustedCode, match="is not the run's"):
        evaluate_run(run_dir, trust_code=True)
    assert not sentinel.exists()


def test_a_section_of_a_plugin_the_writer_had_loaded_is_not_the_runs(tmp_path):
    """A run written by a process that had registered some plug-in's section (at its defaults) reads back in a
    process that has not: that section is no key of the run's algorithm."""
    clients_file(tmp_path / "clients.npz")
    small_run(tmp_path / "run", tmp_path / "clients.npz")
    rewrite_checkpoint(tmp_path / "run", lambda p: p["config"].update(some_plugin_section={"threshold": 0.5}))
    assert evaluate_run(tmp_path / "run")["round"] == 2


def test_a_manifest_names_only_files_inside_its_export(user_run, tmp_path):
    run_dir, _ = user_run
    export_run(run_dir, tmp_path / "x", trust_code=True)
    (tmp_path / "secret.safetensors").write_bytes((tmp_path / "x" / "models.safetensors").read_bytes())
    manifest = json.loads((tmp_path / "x" / "manifest.json").read_text())
    manifest["files"]["models"] = "../secret.safetensors"
    (tmp_path / "x" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(OutputError, match=r"files.models = '../secret.safetensors' is not a file name inside"):
        fedclust.load_client_model(tmp_path / "x", 0, trust_code=True)


# ----------------------------------------------------------------------------
# 4. Exports that cannot be silently wrong


@pytest.fixture
def plain_run(tmp_path):
    clients_file(tmp_path / "clients.npz")
    small_run(tmp_path / "run", tmp_path / "clients.npz")
    return tmp_path / "run"


def test_a_flipped_byte_in_an_exported_file_is_named(plain_run, tmp_path):
    m = export_run(plain_run, tmp_path / "x")
    path = tmp_path / "x" / "models.safetensors"
    assert m["sha256"]["models.safetensors"] == checkpoint.file_sha256(str(path))
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40                      # inside the last tensor's numbers: the file still loads
    path.write_bytes(bytes(data))
    with pytest.raises(OutputError, match=r"models.safetensors is not what was exported: its SHA-256"):
        fedclust.load_client_model(tmp_path / "x", 0)


def test_a_failed_re_export_leaves_the_earlier_export_whole(plain_run, tmp_path, monkeypatch):
    import fedclust.export as export

    first = export_run(plain_run, tmp_path / "x")
    before = {p.name: p.read_bytes() for p in (tmp_path / "x").iterdir()}
    small_run(plain_run, tmp_path / "clients.npz", "rounds=4")           # the run goes on: a newer checkpoint
    real = export.save_file

    def dies(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        raise KeyboardInterrupt   # killed after the first file

    monkeypatch.setattr(export, "save_file", dies)
    with pytest.raises(KeyboardInterrupt):
        export_run(plain_run, tmp_path / "x")
    assert {p.name: p.read_bytes() for p in (tmp_path / "x").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir() if ".export-" in p.name) == []
    monkeypatch.setattr(export, "save_file", real)
    again = export_run(plain_run, tmp_path / "x")
    assert (first["round"], again["round"]) == (2, 4)
    assert json.loads((tmp_path / "x" / "manifest.json").read_text())["round"] == 4


def test_an_export_killed_midway_leaves_the_old_one_and_the_next_cleans_up(plain_run, tmp_path):
    """A real SIGKILL after the new models file is written: the old export stands, whole.  The export runs in a
    child forked from this process (fedclust already imported), killed by the signal as a process is."""
    export_run(plain_run, tmp_path / "x")
    before = {p.name: p.read_bytes() for p in (tmp_path / "x").iterdir()}
    small_run(plain_run, tmp_path / "clients.npz", "rounds=4")
    import fedclust.export as e

    pid = os.fork()
    if pid == 0:   # the child: writes the new models file, then dies before the manifest and the swap
        try:
            real = e.save_file

            def dies(*a, **k):
                real(*a, **k)
                os.kill(os.getpid(), signal.SIGKILL)

            e.save_file = dies
            e.export_run(plain_run, tmp_path / "x")
        finally:
            os._exit(3)   # never reached past the kill: the parent reports status 3 as a failure
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert {p.name: p.read_bytes() for p in (tmp_path / "x").iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if ".export-new" in p.name]   # the killed export's folder
    export_run(plain_run, tmp_path / "x")
    assert not [p.name for p in tmp_path.iterdir() if ".export-" in p.name]


def test_an_export_replaces_only_an_export(plain_run, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(OutputError, match=r"is not an export \(no manifest.json\): notes.txt"):
        export_run(plain_run, mine)
    assert (mine / "notes.txt").read_text() == "keep" and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    export_run(plain_run, tmp_path / "x")
    (tmp_path / "x" / "fig.png").write_bytes(b"png")
    with pytest.raises(OutputError, match="holds files an export does not write: fig.png"):
        export_run(plain_run, tmp_path / "x")
    assert (tmp_path / "x" / "fig.png").exists()


def test_exported_files_follow_the_umask(plain_run, tmp_path):
    old = os.umask(0o027)
    try:
        export_run(plain_run, tmp_path / "x")
    finally:
        os.umask(old)
    assert (tmp_path / "x").stat().st_mode & 0o777 == 0o750
    assert {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "x").iterdir()} == {
        "manifest.json": 0o640, "models.safetensors": 0o640}


# ----------------------------------------------------------------------------
# 5. evaluate --data gets the training loader's checks


def test_evaluate_on_a_bad_file_says_what_is_wrong(plain_run, tmp_path):
    a = clients_file(tmp_path / "unused.npz")
    good = {"x_test": a["x_test"], "y_test": a["y_test"], "client_test": a["client_test"]}
    cases = [
        (dict(x_test=np.full_like(a["x_test"], np.nan)), "array 'x_test' holds NaN or inf values in 24 example"),
        (dict(y_test=a["y_test"].astype(np.float32)), "array 'y_test' has dtype float32, not integers"),
        (dict(client_test=a["client_test"].astype(np.float64)), "array 'client_test' has dtype float64, not integers"),
        (dict(x_test=a["x_test"].astype(np.complex64)), "array 'x_test' has dtype complex64"),
        (dict(y_test=np.array(["cat"] * 24)), "array 'y_test' has dtype <U3, not integers"),
        (dict(y_test=a["y_test"][:, None]), "array 'y_test' has shape [24, 1] but x_test has 24 rows"),
        (dict(client_test=a["client_test"] + 1), "client_test holds client 4 at index 18, outside the run's clients"),
        (dict(y_test=a["y_test"] + 5), "y_test holds label 6 at index 0, outside the run's classes 0..2"),
    ]
    for i, (change, message) in enumerate(cases):
        np.savez(tmp_path / f"bad{i}.npz", **{**good, **change})
        with pytest.raises(DataError) as e:
            evaluate_run(plain_run, tmp_path / f"bad{i}.npz")
        assert message in str(e.value) and str(e.value).startswith(f"--data '{tmp_path / f'bad{i}.npz'}'"), e.value
    sparse = tmp_path / "sparse.npz"
    with open(sparse, "wb") as f:
        f.truncate(1 << 24)                 # 16 MB of holes: no zip, no pickle
    with pytest.raises(DataError, match=r"not a zip archive, as numpy.savez writes \(its first bytes: 00 00 00 00\)"):
        evaluate_run(plain_run, sparse)


def test_evaluate_reads_only_the_arrays_it_needs(plain_run, tmp_path, monkeypatch):
    import fedclust.data.sets.npz as npz

    a = clients_file(tmp_path / "unused.npz")
    np.savez_compressed(tmp_path / "big.npz", x_test=a["x_test"], y_test=a["y_test"], client_test=a["client_test"],
                        unused=np.zeros(50 * 2**20 // 8))            # 50 MB as a float64 array, a few KB on disk
    assert (tmp_path / "big.npz").stat().st_size < 2**20
    want = evaluate_run(plain_run)["client_accuracy"]
    tracemalloc.start()
    try:
        got = evaluate_run(plain_run, tmp_path / "big.npz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert got["client_accuracy"] == want and peak < 20 * 2**20
    # an array that cannot fit is refused from its header, before anything is loaded
    monkeypatch.setattr(npz, "host_memory_available", lambda: 1000)
    with pytest.raises(DataError, match=r"its arrays take .* as stored \(x_test \[24, 6\] float32, .*more than "
                                        r"the 1.0 KB of memory free here"):
        evaluate_run(plain_run, tmp_path / "big.npz")
