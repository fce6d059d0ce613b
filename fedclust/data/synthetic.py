"""Clustered Synthetic(alpha, beta) of FedProx (FedGroup paper §IV; docs/algorithms.md).

FedProx's generator, with alpha and beta standard deviations as in its code:
    u_k ~ N(0, alpha^2),  W_k ~ N(u_k, 1) [dim, 10],  b_k ~ N(u_k, 1) [10]
    B_i ~ N(0, beta^2),   v_i ~ N(B_i, 1) [dim]
    x ~ N(v_i, Sigma), Sigma diagonal with Sigma_jj = j^-1.2 (j = 1..dim)
    y = argmax softmax(x W + b) = argmax (x W + b)
Made clustered: k is the client's *cluster* (one (W_k, b_k) shared by the
cluster's clients, docs/algorithms.md), while every client i draws its own v_i.  The
``data.clusters`` transform (rotation / label_swap) does not apply here: the
clusters differ by their (W, b) alone.

Inputs: FedProx's generator gives every client its own input mean v_i; with
v_i ~ N(B_i, 1) in each of 60 coordinates and Sigma's small variances, a
client's inputs sit in a region of their own and its labels are mostly one
class (median share of the majority class 95% on Synthetic(1, 1), 100
samples), so a model can read the client, and its labels, off where the
inputs lie.  ``data.synthetic_inputs=shared`` draws every client's inputs
around one mean v_0 instead (not in FedProx): then only (W, b) tells the
clusters apart.

Sample sizes: FedProx draws per-device counts from lognormal(4, 2) + 50 and
keeps 90% for training.  Not offered: the engine stacks clients in a fixed
[C, train_size] layout and trains them in lockstep, so unequal sizes would
need per-client masks through training (a client's steps per epoch differ),
evaluation and the loss matrices; every client has ``train_size`` samples.

Labels are not balanced: they are whatever argmax gives, as in FedProx.
Features are used as drawn (no [0, 1] scaling or normalization).

Every number is a counter-based draw (fedclust.rng) keyed on (seed, cluster)
or (seed, client), so a client's data is the same whichever process builds
it and only the asked clients are generated.  A client's first
``train_size`` samples are its training set, the next ``test_size`` its test set.
"""

from __future__ import annotations

import math

import torch

from fedclust import rng

NUM_CLASSES = 10

# rng streams of the generator
STREAM_U, STREAM_W, STREAM_B, STREAM_CLIENT_B, STREAM_V, STREAM_X = (
    "synthetic_u", "synthetic_w", "synthetic_b", "synthetic_client_b", "synthetic_v", "synthetic_x")


def normals(seed: int, stream: str, keys: torch.Tensor, count: int) -> torch.Tensor:
    """[len(keys), count] float64 standard normals, row r a pure function of
    (seed, stream, keys[r]); Box–Muller on two counter-based uniforms each."""
    keys = torch.as_tensor(keys, dtype=torch.int64)
    idx = torch.arange(count, dtype=torch.int64)
    u1 = 1.0 - rng.uniform(seed, 0, stream, keys[:, None], 2 * idx[None, :])   # (0, 1]
    u2 = rng.uniform(seed, 0, stream, keys[:, None], 2 * idx[None, :] + 1)
    return torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)


def cluster_params(seed: int, clusters: torch.Tensor, dim: int, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(W [len(clusters), dim, 10], b [len(clusters), 10]) float64 of the given clusters."""
    u = alpha * normals(seed, STREAM_U, clusters, 1)                             # [k, 1]
    W = u[:, :, None] + normals(seed, STREAM_W, clusters, dim * NUM_CLASSES).view(-1, dim, NUM_CLASSES)
    b = u + normals(seed, STREAM_B, clusters, NUM_CLASSES)
    return W, b


def feature_variances(dim: int) -> torch.Tensor:
    """[dim] diagonal of Sigma: j^-1.2 for j = 1..dim."""
    return torch.arange(1, dim + 1, dtype=torch.float64).pow(-1.2)


def client_means(seed: int, client_ids: torch.Tensor, dim: int, beta: float) -> torch.Tensor:
    """[C, dim] float64 v_i ~ N(B_i, 1) with B_i ~ N(0, beta^2)."""
    B = beta * normals(seed, STREAM_CLIENT_B, client_ids, 1)
    return B + normals(seed, STREAM_V, client_ids, dim)


def synthetic_clients(
    seed: int,
    client_ids: torch.Tensor,
    clusters: torch.Tensor,
    num_samples: int,
    dim: int,
    alpha: float,
    beta: float,
    shared_inputs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Samples of the given clients: x [C, num_samples, dim] float32 and
    y [C, num_samples] int64; ``clusters[C]`` is each client's cluster.
    ``shared_inputs``: every client's inputs are drawn around client 0's
    mean v_0 (not FedProx's: there each client has its own v_i), so that a
    client's inputs do not tell which client, or cluster, it is."""
    client_ids = torch.as_tensor(client_ids, dtype=torch.int64).cpu()
    clusters = torch.as_tensor(clusters, dtype=torch.int64).cpu()
    W, b = cluster_params(seed, clusters, dim, alpha)                            # per held client
    v = client_means(seed, torch.zeros_like(client_ids) if shared_inputs else client_ids, dim, beta)   # [C, dim]
    z = normals(seed, STREAM_X, client_ids, num_samples * dim).view(-1, num_samples, dim)
    x = v[:, None, :] + z * feature_variances(dim).sqrt()
    y = torch.argmax(torch.bmm(x, W) + b[:, None, :], dim=-1)
    return x.to(torch.float32), y
