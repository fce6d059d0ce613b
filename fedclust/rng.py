"""Counter-based random numbers: every draw is a pure function of
(seed, round, client, stream, index), so results never depend on how many
processes run the clients.  All functions are vectorized over clients.

The hash is a 32-bit integer mixer (the "lowbias32" finalizer) evaluated in
int64 arithmetic with explicit masking, identical on CPU and GPU.
"""

from __future__ import annotations

import zlib
from typing import Callable

import torch

_MASK = 0xFFFFFFFF

# Named streams keep independent purposes apart.  A stream's number is
# derived from its name (:func:`stream_id`); the built-in names below have fixed
# numbers, the ones the golden files and published results were drawn with.
_FROZEN_IDS = {
    "batch": 1, "neighbors": 2, "candidates": 3, "fixed": 4, "samples": 5, "participation": 6,
    "hnm_candidates": 7, "hnm_sample": 8, "pens": 9, "init": 10,
    "kmeans": 101, "ifca_init": 110, "cold_start": 111,
    # fedclust.data.synthetic (101 is shared with "kmeans": harmless, the draws are keyed differently)
    "synthetic_u": 101, "synthetic_w": 102, "synthetic_b": 103, "synthetic_client_b": 104, "synthetic_v": 105,
    "synthetic_x": 106,
}


def stream_id(name: str) -> int:
    """The stream number of ``name``: its frozen number where it has one,
    else a 31-bit hash of the name (CRC-32, the same on every machine) with
    the top bit set, so that new names never collide with the frozen ones."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a random stream is named by a non-empty string, got {name!r}")
    if name in _FROZEN_IDS:
        return _FROZEN_IDS[name]
    return (zlib.crc32(name.encode()) & 0x7FFFFFFF) | 0x40000000


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = x & _MASK
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK
    x = x ^ (x >> 16)
    return x


def _as_long(v, device) -> torch.Tensor:
    return torch.as_tensor(v, dtype=torch.int64, device=device)


def hash_ints(seed: int, round_: int, stream: str, client, index) -> torch.Tensor:
    """32-bit hash (as int64 in [0, 2**32)) of the key, broadcast over
    ``client`` and ``index`` tensors."""
    s = stream_id(stream)
    client = torch.as_tensor(client, dtype=torch.int64)
    device = client.device
    index = _as_long(index, device)
    h = _mix(_as_long(seed, device) * 0x9E3779B1 + 0x632BE5AB)
    h = _mix(h ^ (_as_long(round_, device) + 0x85EBCA6B))
    h = _mix(h ^ (_as_long(s, device) * 0xC2B2AE35))
    h = _mix(h ^ client)
    h = _mix(h ^ (index + 0x27D4EB2F))
    return h


def uniform(seed: int, round_: int, stream: str, client, index) -> torch.Tensor:
    """float64 uniforms in [0, 1), one per broadcast (client, index) pair."""
    return hash_ints(seed, round_, stream, client, index).to(torch.float64) / 2.0**32


def client_keys(seed: int, round_: int, stream: str, clients: torch.Tensor, n: int) -> torch.Tensor:
    """[len(clients), n] uniform keys: row c is client clients[c]'s key for items 0..n-1."""
    clients = torch.as_tensor(clients, dtype=torch.int64)
    idx = torch.arange(n, dtype=torch.int64, device=clients.device)
    return uniform(seed, round_, stream, clients[:, None], idx[None, :])


def permutations(seed: int, round_: int, stream: str, clients: torch.Tensor, n: int) -> torch.Tensor:
    """[len(clients), n] independent random permutations of range(n), one per client."""
    return torch.argsort(client_keys(seed, round_, stream, clients, n), dim=1, stable=True)


def batch_orders(seed: int, round_: int, clients: torch.Tensor, epochs: int, n: int,
                 counts: torch.Tensor | None = None) -> torch.Tensor:
    """[epochs, len(clients), n] sample orders for local training: epoch e of
    round r for client c is a permutation keyed on (seed, r, c, e).  With
    ``counts`` ([len(clients)] examples each client really holds, the rest of
    its n positions padding), client c's first counts[c] entries are a
    permutation of its own examples and its padding follows in place order."""
    clients = torch.as_tensor(clients, dtype=torch.int64)
    pad = None
    if counts is not None:
        pad = torch.arange(n, device=clients.device)[None, :] >= counts.to(clients.device)[:, None]
    out = []
    for e in range(epochs):  # epochs, not clients: a handful of vectorized draws
        idx = torch.arange(n, dtype=torch.int64, device=clients.device) + e * n
        keys = uniform(seed, round_, "batch", clients[:, None], idx[None, :])
        if pad is not None:
            keys = keys.masked_fill(pad, 2.0)   # after every key in [0, 1)
        out.append(torch.argsort(keys, dim=1, stable=True))
    return torch.stack(out)


CHOOSE_CHUNK_ELEMENTS = 2**22   # keys drawn at once by choose_indices and choose_from_mask (32 MB of float64)


def choose_indices(
    seed: int, round_: int, stream: str, clients: torch.Tensor, n: int, k: int,
    allowed: Callable[[int, int], torch.Tensor] | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw up to k of n items uniformly without replacement per row, as indices.

    Row c draws for client ``clients[c]``: the k allowed items of lowest key
    ``client_keys(seed, round_, stream, ...)``, never the client itself.
    ``allowed(lo, hi)`` gives the bool ``[hi - lo, n]`` allowed items of rows
    lo..hi, so that no ``[C, n]`` mask need exist (a bool ``[C, n]`` mask is
    read a chunk of rows at a time; None: every other client); rows go in chunks of at most
    :data:`CHOOSE_CHUNK_ELEMENTS` keys.
    Returns ``(idx [C, kk], valid [C, kk])``, kk = min(k, n): each row's
    chosen items in increasing order, then padding (0, valid False) where
    fewer than k were allowed.  The same items as :func:`choose_from_mask`
    of the same allowed set.
    """
    clients = torch.as_tensor(clients, dtype=torch.int64)
    C = len(clients)
    kk = min(k, n)
    idx = torch.zeros(C, max(kk, 0), dtype=torch.int64, device=clients.device)
    valid = torch.zeros(C, max(kk, 0), dtype=torch.bool, device=clients.device)
    if kk <= 0:
        return idx, valid
    step = max(1, CHOOSE_CHUNK_ELEMENTS // max(n, 1))
    for lo in range(0, C, step):   # chunks of rows: bounded memory, each row drawn alone
        hi = min(C, lo + step)
        keys = client_keys(seed, round_, stream, clients[lo:hi], n)
        if allowed is not None:
            ok = allowed[lo:hi] if isinstance(allowed, torch.Tensor) else allowed(lo, hi)
            keys = torch.where(ok.to(keys.device), keys, torch.full_like(keys, 2.0))  # disallowed sort last
        keys[torch.arange(hi - lo, device=keys.device), clients[lo:hi]] = 2.0   # never the client itself
        low, top = torch.topk(keys, kk, dim=1, largest=False)
        ok = low < 2.0
        top = torch.where(ok, top, torch.full_like(top, n))      # padding after every item
        top = torch.sort(top, dim=1).values
        valid[lo:hi] = top < n
        idx[lo:hi] = torch.where(top < n, top, torch.zeros_like(top))
    return idx, valid


def choose_from_mask(
    seed: int, round_: int, stream: str, clients: torch.Tensor, allowed: torch.Tensor, k: int
) -> torch.Tensor:
    """Draw up to k items uniformly without replacement from each row's allowed set (the plain whole-mask
    form of :func:`choose_indices`, its reference in the tests).

    ``allowed`` is a bool [C, n] mask; returns a bool [C, n] mask with
    min(k, allowed.sum(1)) True entries per row.  Each row depends only on
    (seed, round, stream, clients[c]) and that row of ``allowed``: the k
    allowed items of lowest key.  Rows go in chunks, so that the float64
    keys never take more than :data:`CHOOSE_CHUNK_ELEMENTS` at once.
    """
    C, n = allowed.shape
    out = torch.zeros_like(allowed)
    kk = min(k, n)
    if kk == 0:
        return out
    clients = clients.to(allowed.device)
    step = max(1, CHOOSE_CHUNK_ELEMENTS // max(n, 1))
    for lo in range(0, C, step):   # chunks of rows: bounded memory, each row drawn alone
        ok = allowed[lo:lo + step]
        keys = client_keys(seed, round_, stream, clients[lo:lo + step], n)
        keys = torch.where(ok, keys, torch.full_like(keys, 2.0))  # disallowed sort last
        top = torch.topk(keys, kk, dim=1, largest=False).indices
        out[lo:lo + step].scatter_(1, top, True)
    return out & allowed
