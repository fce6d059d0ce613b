"""FPFC's clusters, read off the pairs' ``‖θ_ij‖``: connected components of
``‖θ_ij‖ ≤ ν`` (the paper), or the official code's ``threshold()`` groups;
each cluster's model, and what a client holds after a round
(``fpfc.evaluate``)."""

from __future__ import annotations

import numpy as np
import torch

from fedclust.algorithms.aggregation import cluster_average, own
from fedclust.algorithms.base import Context
from fedclust.algorithms.fpfc.pairs import pair_index
from fedclust.errors import ConfigError


def theta_norm_matrix(theta: torch.Tensor, n: int) -> torch.Tensor:
    """Symmetric ``[n, n]`` matrix of ``‖θ_ij‖`` (zero diagonal) from ``theta [E, P]``."""
    i, j = pair_index(n, theta.device)
    out = torch.zeros(n, n, dtype=theta.dtype, device=theta.device)
    norms = theta.norm(dim=1)
    out[i, j] = norms
    out[j, i] = norms
    return out


def clusters_from_theta(theta_norms: torch.Tensor, nu: float) -> torch.Tensor:
    """Clusters of FPFC paper: i ~ j when ``‖θ_ij‖ ≤ ν``; the clusters are the
    connected components of that graph → int64 ``[n]`` labels, numbered by
    smallest member (client 0 is in cluster 0).

    ``theta_norms [n, n]``: see :func:`theta_norm_matrix` (only the part
    above the diagonal is read, so it need not be symmetric).  Components
    via ``scipy.sparse.csgraph.connected_components`` (read-off happens once).
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components

    n = theta_norms.shape[0]
    if theta_norms.shape != (n, n):
        raise ValueError(f"theta_norms must be square [n, n], got {tuple(theta_norms.shape)}")
    if not float(nu) >= 0:
        raise ConfigError("fpfc.nu", nu, "FPFC's cluster threshold must be >= 0 (paper: in [xi, 0.5])")
    adj = (theta_norms <= nu).triu(1).cpu().numpy()
    _, comp = connected_components(csr_matrix(adj), directed=False)
    # relabel by first occurrence so that numbering follows the smallest member
    _, first = np.unique(comp, return_index=True)
    order = np.empty_like(first)
    order[np.argsort(first)] = np.arange(first.size)
    return torch.as_tensor(order[comp], dtype=torch.int64, device=theta_norms.device)


def threshold_groups(theta_norms: torch.Tensor, nu: float) -> list[list[int]]:
    """The groups the authors' code reads (Synthetic/utils/util.py, ``threshold``):
    client i's list is every j with ``‖θ_ij‖ < ν`` (i itself included), and
    the groups are the distinct lists in order of first appearance.  Not
    connected components: where the ``< ν`` graph is not a union of cliques,
    lists overlap and there are more groups than components."""
    n = theta_norms.shape[0]
    adj = ((theta_norms < nu) | torch.eye(n, dtype=torch.bool, device=theta_norms.device)).cpu()
    lists, inverse = torch.unique(adj, dim=0, return_inverse=True)     # each distinct list once, in any order
    first = torch.full((len(lists),), n).scatter_reduce_(0, inverse, torch.arange(n), "amin")
    return [torch.nonzero(lists[g]).flatten().tolist() for g in torch.argsort(first)]


def threshold_labels(theta_norms: torch.Tensor, nu: float) -> torch.Tensor:
    """``[n]`` int64 the clusters the authors' code reads (``threshold``): each
    client takes the index of the last group of :func:`threshold_groups` that
    holds it; renumbered by smallest member (client 0 in cluster 0)."""
    label = np.zeros(theta_norms.shape[0], dtype=np.int64)
    for k, members in enumerate(threshold_groups(theta_norms, nu)):
        label[members] = k
    values, first = np.unique(label, return_index=True)
    rank = np.empty_like(first)
    rank[np.argsort(first)] = np.arange(first.size)
    lut = np.zeros(label.max() + 1, dtype=np.int64)
    lut[values] = rank
    return torch.as_tensor(lut[label], device=theta_norms.device)


def threshold_models(omega: torch.Tensor, theta_norms: torch.Tensor, nu: float) -> torch.Tensor:
    """``[n, P]`` the models the authors' code gives its clients after its last
    round (``threshold``): each group of :func:`threshold_groups` in turn
    replaces its members' models by their mean, from the models as earlier
    groups left them (a client in several groups ends with the last one's).
    The code weighs the mean by the clients' sample counts; fedclust's clients
    hold equal counts (a file's natural clients excepted, weighed equally here)."""
    models = omega.clone()
    for members in threshold_groups(theta_norms, nu):
        idx = torch.tensor(members, device=omega.device)
        models[idx] = models[idx].mean(dim=0)
    return models


def cluster_models(omega: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``α̂_l = Σ_{i∈Ĝ_l} n_i ω_i / Σ_{i∈Ĝ_l} n_i`` (FPFC paper) → ``[L, P]``,
    L = number of labels; ``weights [n]`` the data sizes (equal when None)."""
    L = int(labels.max()) + 1 if labels.numel() else 0
    prev = torch.zeros(L, omega.shape[1], dtype=omega.dtype, device=omega.device)
    return cluster_average(omega, labels, L, prev, weights)


def held_models(ctx: Context, omega: torch.Tensor, labels: torch.Tensor, evaluate: str, last_round: bool,
                means=None) -> torch.Tensor:
    """``[C, P]`` the models this rank's clients hold, and are evaluated with,
    after a round (``fpfc.evaluate``): ``cluster``, its cluster's mean model
    (every round); ``own``, its own ω_i (the authors' MNIST/FMNIST code never
    reads clusters); ``own_then_cluster``, its own ω_i and, in the run's last
    round, its cluster's mean (the authors' Synthetic code reads the clusters
    once, after its last server step).  ``means``: a function giving every
    client's cluster model ``[n, P]`` (None: :func:`cluster_models` of
    ``labels``).  Only what is evaluated changes: every client trains from
    its own ω_i."""
    if evaluate == "own" or (evaluate == "own_then_cluster" and not last_round):
        return own(ctx, omega)
    if means is None:
        return cluster_models(omega, labels)[own(ctx, labels)]
    return own(ctx, means())

