"""Your own model, end to end (model=FILE.py:NAME): PANMLoss's peer losses and
PANMGrad through a user module, what the run records of it, 1 vs 2 processes,
a killed run resumed exactly, a resume refused after the model changed (not
after an unrelated edit of its file), figures and W&B offline; every algorithm trains it batched as one client after
another would.  The launching, killing and comparing helpers are
tests/integration/test_resume.py's and tests/integration/test_wandb.py's."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import wandb_offline as wo
from record import GOLDEN_OVERRIDES
from run_files import IMAGE_CLASSES, IMAGE_SIDE, results
from test_resume import assert_same_run, killed_run, launch, overrides, sub_run
from test_wandb import env as wandb_env

from fedclust.config import load_config
from fedclust.errors import ConfigError
from fedclust.models import build_model
from fedclust.runner import prepare, run

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parents[1]
MODELS = HERE / "plugins" / "user_models.py"
DENSE = f"{MODELS}:tabular"
SYNTHETIC_SHAPE, SYNTHETIC_CLASSES = (60,), 10          # data.name=synthetic: data.synthetic_dim, 10 classes
SHORT = ["rounds=4", "stage1_rounds=2", "train.local_epochs=1"]


def independent_count(name: str, input_shape, num_classes) -> int:
    """The parameter count of tests/plugins/user_models.py's ``name``, imported here on its own."""
    spec = importlib.util.spec_from_file_location("user_models_counted", MODELS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return sum(p.numel() for p in getattr(mod, name)(tuple(input_shape), num_classes).parameters())


def assert_model_recorded(summary: dict, spec: str, source: Path, parameters: int, engine: str) -> None:
    assert summary["model"] == spec
    assert summary["model_source"] == str(source.resolve())
    assert summary["model_source_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert summary["model_parameters"] == parameters
    assert summary["model_engine"] == engine


def test_panm_loss_with_a_user_model_records_it_draws_figures_and_logs_to_wandb_offline(tmp_path):
    """PANMLoss (every peer model evaluated on a client's data through the user module, batched by vmap):
    the summary names the model, its file, hash, size and engine; the figures and the offline W&B run exist."""
    out, spec = tmp_path / "loss", f"{MODELS}:tabular"
    proc = launch(1, overrides("panm_loss", out, *SHORT, f"model={spec}", "figures=true", "wandb.enabled=true"),
                  **{k: v for k, v in wandb_env().items() if k.startswith("WANDB_")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"model {spec}: engine=batched" in proc.stdout   # said on stdout
    lines, summary = results(out)
    assert [r["round"] for r in lines] == [1, 2, 3, 4]
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["train_loss"]) for r in lines)
    assert summary["final_accuracy"] > 100 / SYNTHETIC_CLASSES           # it learnt something
    assert_model_recorded(summary, spec, MODELS, independent_count("TabularNet", SYNTHETIC_SHAPE, SYNTHETIC_CLASSES),
                          "batched")
    for fig in ("accuracy.png", "heatmap_stage1.png", "neighbor_graph.png", "similarity_hist.png",
                "cni_precision.png"):
        assert (out / "figures" / fig).stat().st_size > 1000, fig
    files = wo.run_file(out)
    assert len(files) == 1
    recs = wo.records(files[0])
    rows = wo.history(recs)
    assert [r["_step"] for r in rows] == [1, 2, 3, 4]
    assert [r["accuracy"] for r in rows] == pytest.approx([r["accuracy"] for r in lines], rel=1e-12)
    logged = wo.summary(recs)
    assert logged["final_accuracy"] == pytest.approx(summary["final_accuracy"], rel=1e-12)
    assert logged["model_source_sha256"] == summary["model_source_sha256"]
    assert logged["model_parameters"] == summary["model_parameters"]


@pytest.mark.xdist_group("one_and_two")   # its two runs are in the shared 1- and 2-process jobs
def test_a_conv_user_model_on_images_gives_the_same_numbers_on_one_and_two_processes(one_and_two):
    """SmallConvGN (convolutions, GroupNorm) on a generated image pool, 2 rotations: engine=auto loops it on a
    CPU; PANMLoss's metrics, neighbour lists and summary are identical on 1 process and on 2 (4 + 4 clients)."""
    spec = f"{MODELS}:SmallConvGN"
    for nproc in (1, 2):
        assert f"model {spec}: engine=loop" in one_and_two["stdout"][nproc]
    p1, p2 = one_and_two[1] / "user_conv", one_and_two[2] / "user_conv"
    assert_same_run(p1, p2)
    l1, l2 = (np.load(d / "neighbors.npz") for d in (p1, p2))
    assert (l1["final_lists"] >= 0).any() and np.array_equal(l1["final_lists"], l2["final_lists"])
    _, summary = results(p1)
    assert summary["final_accuracy"] > 100 / IMAGE_CLASSES
    assert_model_recorded(summary, spec, MODELS,
                          independent_count("SmallConvGN", (1, IMAGE_SIDE, IMAGE_SIDE), IMAGE_CLASSES), "loop")


def test_a_killed_run_resumes_exactly_and_a_changed_model_is_refused_but_not_an_unrelated_edit(tmp_path):
    """PANMGrad with a copy of the model file: killed after round 5 (checkpoint at 4) and resumed, it ends as
    an uninterrupted run; after a comment and an unrelated class are added to the file, the finished run is
    extended to 10 rounds (a resume is tied to the model's definition and shapes, not the file's bytes); after
    the model's class is edited, a resume is refused naming the file, and overwrite=true starts afresh with the
    new file's hash."""
    source = tmp_path / "my_model.py"
    shutil.copy(MODELS, source)
    spec = f"{source}:tabular"
    killed_run(1, "panm_grad", tmp_path / "killed", f"model={spec}")
    summary = sub_run("panm_grad", tmp_path / "killed", f"model={spec}")       # the same command continues it
    whole = launch(1, overrides("panm_grad", tmp_path / "whole", f"model={spec}"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert_same_run(tmp_path / "whole", tmp_path / "killed")
    assert summary["rounds_completed"] == 8
    assert_model_recorded(summary, spec, source, independent_count("TabularNet", SYNTHETIC_SHAPE, SYNTHETIC_CLASSES),
                          "batched")

    old = summary["model_source_sha256"]
    with source.open("a") as f:
        f.write("\n# edited after the run\n\n\nclass Unrelated(nn.Module):\n    pass\n")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = load_config(None, overrides("panm_grad", tmp_path / "killed", f"model={spec}", "rounds=10"))
        longer = run(cfg, prepare(cfg))
    finally:
        torch.set_num_threads(threads)
    assert longer["rounds_completed"] == 10 and longer["model_fingerprint"] == summary["model_fingerprint"]
    lines = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["round"] for x in lines] == list(range(1, 11))
    assert longer["model_source_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest() != old

    source.write_text(source.read_text().replace("nn.GELU()", "nn.ReLU()"))      # TabularNet itself
    cfg = load_config(None, overrides("panm_grad", tmp_path / "killed", f"model={spec}", "rounds=12"))
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    assert e.value.field == "model" and str(source) in str(e.value) and "changed" in str(e.value)
    before = (tmp_path / "killed" / "metrics.jsonl").read_text()

    cfg = load_config(None, overrides("panm_grad", tmp_path / "killed", f"model={spec}", "overwrite=true",
                                      *SHORT, "checkpoint_every=0"))
    torch.set_num_threads(1)
    try:
        again = run(cfg, prepare(cfg))
    finally:
        torch.set_num_threads(threads)
    assert again["rounds_completed"] == 4
    assert again["model_source_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest() != old
    after = (tmp_path / "killed" / "metrics.jsonl").read_text()
    assert after != before and [json.loads(x)["round"] for x in after.splitlines()] == [1, 2, 3, 4]


# ---------------------------------------------------------------- every algorithm

def _run(tmp_path, name, engine):
    """A golden-sized run (tests/golden/record.py) of ``name`` with the dense user model."""
    out = tmp_path / f"{name}-{engine}"
    keys = [o for o in GOLDEN_OVERRIDES if not o.startswith("model=")]
    cfg = load_config(None, keys + [f"algorithm.name={name}", f"out={out}", f"model={DENSE}", f"engine={engine}"])
    run(cfg, prepare(cfg))
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return records, json.loads((out / "summary.json").read_text())


def _names():
    from fedclust.algorithms import registry
    return registry.builtin_names()


@pytest.mark.parametrize("name", _names())
def test_every_algorithm_trains_a_user_model_batched_as_one_client_after_another(tmp_path, name):
    batched, summary = _run(tmp_path, name, "batched")
    looped, summary_loop = _run(tmp_path, name, "loop")
    assert summary["model_engine"] == "batched" and summary_loop["model_engine"] == "loop"
    dense = build_model(DENSE, SYNTHETIC_SHAPE, SYNTHETIC_CLASSES)
    assert summary["model_parameters"] == sum(p.numel() for p in dense.parameters())
    assert len(batched) == len(looped) == 8
    for a, b in zip(batched, looped):
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-3), (name, a["round"])
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3), (name, a["round"])
        for key in ("neighbor_precision", "neighbor_recall", "models_received_total"):
            assert a.get(key) == pytest.approx(b.get(key), abs=1e-9), (name, key, a["round"])
