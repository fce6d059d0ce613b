"""A personal head and a graph of the method's own, what the methods that
keep them share (DePRL and Facade: both; FedSPD: the graph): the config
keys of each (``<section>.head``, ``<section>.degree``) and their checks,
the head's tensors in the model, and the round's graph neighbours.
"""

from __future__ import annotations

from typing import Any

from fedclust.algorithms.base import Context
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
