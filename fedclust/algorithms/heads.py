"""A personal head and a graph of the method's own, what the methods that
keep them share (DePRL and Facade: both; FedSPD: the graph): the config
keys of each (``<section>.head``, ``<section>.degree``,
``<section>.final_allreduce``) and their checks, the head's tensors in the
model, the round's graph neighbours, and the sums of the final all-reduce
over every client (the Facade benchmark's, after the last round).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from fedclust.algorithms.aggregation import pairwise_sum
from fedclust.algorithms.base import Context, RoundResult
from fedclust.engine.layout import ParamLayout
from fedclust.errors import ConfigError
from fedclust.network import check_regular_degree, regular_graph
from fedclust.peers import PeerIndex
from fedclust.schema import option


def head_option(help: str) -> Any:
    """A section's ``head`` key: the head's tensors (names, module prefixes or ``head``, the model's last
    layer), by default ``[head]``; ``help`` is its one-line meaning."""
    return option(help=help, factory=lambda: ["head"])


def degree_option(source: str, default: int = 4) -> Any:
    """A section's ``degree`` key: the degree of the random regular graph the method draws each round on
    ``network.graph=complete``; ``source`` names where its default comes from ("the reference")."""
    return option(default, "on network.graph=complete: the degree of the random regular graph drawn each round "
                           f"({source}'s {default}); a given network.graph is used as it is")


def final_allreduce_option(what: str, where: str) -> Any:
    """A section's ``final_allreduce`` key (default false: none); ``what`` is what the all-reduce averages,
    ``where`` the reference's file and line."""
    return option(False, f"after the last round, {what} averaged over every client online then, as the Facade "
                         f"benchmark ends ({where}); false: none")


def check_head(section: str, head: Any) -> None:
    """``<section>.head`` is a non-empty list of non-empty names (ConfigError naming the key)."""
    if not isinstance(head, list) or not head or not all(isinstance(x, str) and x for x in head):
        raise ConfigError(f"{section}.head", head, "must be a non-empty list of parameter names, module prefixes "
                          f"or head, e.g. {section}.head=[head]")


def check_degree(section: str, degree: int, cfg) -> None:
    """``<section>.degree``, read on the complete graph only: a regular graph of that degree on the run's
    clients exists (ConfigError naming the key)."""
    if cfg.network.graph == "complete":
        check_regular_degree(f"{section}.degree", degree, cfg.clients)


def head_tensors(field: str, names: list, layout: ParamLayout) -> tuple[int, ...]:
    """The indices of a head's tensors (``names`` as :meth:`ParamLayout.select` takes them), checked: named among the
    model's, and not every one of them (a body or core is left to share); ConfigError naming ``field``."""
    try:
        picked = layout.select(names)
    except ValueError as e:
        raise ConfigError(field, names, f"{e}; give names, module prefixes or head") from None
    if len(picked) == len(layout.names):
        raise ConfigError(field, names, f"is the whole model ({', '.join(layout.names)}), leaving nothing to "
                          "share: name fewer tensors, or use a model of several layers (model=mlp)")
    return picked


def graph_neighbours(ctx: Context, t: int, degree: int, stream: str, epoch: int | None = None) -> PeerIndex:
    """Every neighbour of round ``t``'s graph for this process's clients (``network.graph``); on the complete graph
    a random ``degree``-regular graph of the method's own, drawn from (seed, ``epoch`` (default t), ``stream``), the
    same on every process: DePRL's, Facade's and FedSPD's peers."""
    g = ctx.graph(t)
    if g is None:
        g = regular_graph(ctx.n, degree, ctx.seed, t if epoch is None else epoch, stream)
    lo, hi = ctx.own_rows.start, ctx.own_rows.stop
    return PeerIndex(g.idx[lo:hi].to(ctx.device), g.valid[lo:hi].to(ctx.device), ctx.n)


ALLREDUCE_CHUNK = 2**24   # numbers of the [n, columns] buffer of a final all-reduce at once


def final_members(ctx: Context, t: int) -> torch.Tensor:
    """bool ``[n]`` (CPU): the clients that take part in a final all-reduce after round ``t``, those online then
    (every client without ``network.p_offline`` / ``availability`` / late joiners)."""
    online = ctx.online(t)
    return torch.ones(ctx.n, dtype=torch.bool) if online is None else online.to(torch.bool).cpu()


def group_sums(ctx: Context, rows: torch.Tensor, groups: torch.Tensor, K: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sums [K, W], counts [K])``: every client's row summed by its group, ``rows [C, W]`` this process's
    clients', ``groups`` int64 ``[n]`` every client's group in ``0..K-1`` (-1: none).  Each process's rows travel in
    an ``[n, ·]`` buffer of zeros summed over processes as int32 (one holder a row: exact), a chunk of columns at a
    time, and each group's rows are added in client order (:func:`pairwise_sum`): the same bits on any number of
    processes, the whole or a chunk."""
    W = rows.shape[1]
    groups = groups.to(rows.device)
    sums = rows.new_zeros(K, W)
    counts = torch.stack([(groups == g).sum() for g in range(K)]).cpu() if K else torch.zeros(0, dtype=torch.int64)
    step = max(1, ALLREDUCE_CHUNK // max(ctx.n, 1))
    for lo in range(0, W, step):
        hi = min(lo + step, W)
        buf = rows.new_zeros(ctx.n, hi - lo)
        buf[ctx.own_rows] = rows[:, lo:hi]
        every = ctx.all_reduce(buf.view(torch.int32)).view(rows.dtype)
        for g in range(K):
            if int(counts[g]):
                sums[g, lo:hi] = pairwise_sum(every[groups == g])
    return sums, counts


def received_with(result: RoundResult, mine: torch.Tensor, count: int) -> RoundResult:
    """``result`` with each own member (``mine``, bool ``[C]``) receiving the ``count - 1`` other members' models
    of a final all-reduce beyond the round's."""
    before = result.received if result.received is not None else torch.zeros(len(mine), dtype=torch.int64)
    more = torch.where(mine.to(before.device), count - 1, 0)
    return dataclasses.replace(result, received=before + more.to(before.dtype))
