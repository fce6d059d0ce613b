"""Figures of PANM paper written into the run directory (docs/algorithms.md):

- ``heatmap_stage1.png``: who averaged with whom in stage one (Fig. 5);
- ``similarity_hist.png``: one client's similarities after stage one, split by
  true cluster (Fig. 4);
- ``neighbor_graph.png``: the stage-two neighbour graph coloured by true
  cluster (Fig. 7);
- ``cni_precision.png``: stage-one neighbour precision per round beside the
  Theorem 1 curve (Fig. 3);
- ``accuracy.png``: mean test accuracy and loss per round.

Inputs are the arrays the runner saves in ``neighbors.npz`` and the lines of
``metrics.jsonl``; nothing here touches tensors or processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedclust.algorithms import registry
from fedclust.theory import cni_probabilities


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def heatmap(counts: np.ndarray, path: Path, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4.4))
    im = ax.imshow(counts, cmap="viridis", interpolation="nearest")
    ax.set_xlabel("peer j")
    ax.set_ylabel("client i")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="times averaged with")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def similarity_histogram(sim_row: np.ndarray, clusters: np.ndarray, client: int, path: Path, title: str) -> None:
    plt = _plt()
    same = clusters == clusters[client]
    same[client] = False
    other = clusters != clusters[client]
    ok = np.isfinite(sim_row)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    bins = 30
    ax.hist(sim_row[ok & same], bins=bins, alpha=0.7, label="same cluster")
    ax.hist(sim_row[ok & other], bins=bins, alpha=0.7, label="other cluster")
    ax.set_xlabel("similarity s_ij")
    ax.set_ylabel("peers")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def circle_layout(clusters: np.ndarray) -> np.ndarray:
    """Clients on a circle ordered by true cluster, clusters as arcs."""
    order = np.argsort(clusters, kind="stable")
    angle = np.empty(len(clusters))
    angle[order] = 2 * np.pi * np.arange(len(clusters)) / len(clusters)
    return np.stack([np.cos(angle), np.sin(angle)], axis=1)


def neighbor_graph(lists: np.ndarray, clusters: np.ndarray, path: Path, title: str) -> None:
    plt = _plt()
    xy = circle_layout(clusters)
    fig, ax = plt.subplots(figsize=(5, 5))
    ii, jj = np.nonzero(lists)
    same = clusters[ii] == clusters[jj]
    for i, j, s in zip(ii, jj, same):
        ax.plot(xy[[i, j], 0], xy[[i, j], 1], color="0.6" if s else "red", lw=0.4, alpha=0.5, zorder=1)
    ax.scatter(xy[:, 0], xy[:, 1], c=clusters, cmap="tab10", s=25, zorder=2, vmin=0, vmax=9)
    ax.set_title(f"{title}\n(red: edges across clusters, {int((~same).sum())} of {len(same)})")
    ax.set_axis_off()
    ax.set_aspect("equal")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def cni_precision(rounds, precision, theory, path: Path, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(rounds, precision, label="neighbour precision (measured)")
    if theory is not None:
        ax.plot(np.arange(1, len(theory) + 1), theory, "--", label="Theorem 1: P(all k same-cluster)")
    ax.set_xlabel("round (stage one)")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def accuracy_curves(records: list[dict], path: Path, title: str) -> None:
    plt = _plt()
    r = [x["round"] for x in records]
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.plot(r, [x["accuracy"] for x in records])
    a.set_xlabel("round")
    a.set_ylabel("mean test accuracy (%)")
    b.plot(r, [x["loss"] for x in records])
    b.set_xlabel("round")
    b.set_ylabel("mean test loss")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_run_figures(run_dir: str | Path, summary: dict, cfg) -> list[str]:
    """All figures the run's saved arrays allow; returns the file names."""
    run_dir = Path(run_dir)
    fig_dir = run_dir / "figures"
    fig_dir.mkdir(exist_ok=True)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    name = summary["algorithm"]
    written = []
    if records:
        accuracy_curves(records, fig_dir / "accuracy.png", f"{name}: accuracy and loss")
        written.append("accuracy.png")
    npz = run_dir / "neighbors.npz"
    if not npz.exists():
        return written
    arrays = np.load(npz)
    clusters = arrays["clusters"]
    if "stage1_counts" in arrays and arrays["stage1_counts"].any():
        heatmap(arrays["stage1_counts"], fig_dir / "heatmap_stage1.png", f"{name}: aggregations in stage one")
        written.append("heatmap_stage1.png")
    if "similarity_client0" in arrays and np.isfinite(arrays["similarity_client0"]).any():
        similarity_histogram(arrays["similarity_client0"], clusters, 0, fig_dir / "similarity_hist.png",
                             f"{name}: client 0's similarities after stage one")
        written.append("similarity_hist.png")
    if "final_lists" in arrays and arrays["final_lists"].any():
        neighbor_graph(arrays["final_lists"], clusters, fig_dir / "neighbor_graph.png",
                       f"{name}: neighbour lists, round {summary['rounds_completed']}")
        written.append("neighbor_graph.png")
    stage1 = [x for x in records if x.get("stage") == 1 and x.get("neighbor_precision") is not None]
    if stage1 and registry.get(cfg.algorithm.name).stage_one_figures:
        theory = None
        try:
            a = cfg.clients // cfg.data.num_clusters
            theory = cni_probabilities(cfg.clients, a, cfg.algorithm.l, cfg.algorithm.k, cfg.stage1_rounds)
        except Exception:  # theory needs an even split etc.; the measured curve still stands alone
            theory = None
        cni_precision([x["round"] for x in stage1], [x["neighbor_precision"] for x in stage1], theory,
                      fig_dir / "cni_precision.png", f"{name}: stage-one precision")
        written.append("cni_precision.png")
    return written
