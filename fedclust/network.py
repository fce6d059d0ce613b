"""The communication graph of a peer-to-peer run (config section
``network``, docs/algorithms.md "Networks"): who can reach whom in a round.

A graph is a list of each client's neighbours, ``[n, d]`` indices (no
``[n, n]`` table), drawn with networkx from (seed, epoch) alone, so every
process builds the same graph; with ``network.redraw_every = T`` a new one
is drawn every T rounds (epoch ``(t - 1) // T``), else one serves the run.
``complete`` (the default) is no graph at all: every draw is as before.

A process sees the graph of a round through :class:`Reach`, the bool rows
of its own clients' neighbours, which the peer algorithms pass to their
draws (``allowed``) and which filters whom a client averages with: a client
receives models only from its neighbours of that round.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedclust import rng
from fedclust.errors import ConfigError
from fedclust.peers import PeerIndex

GRAPH_TRIES = 20   # draws of a random graph (keyed on the attempt) before one that is not connected is refused


@dataclass(frozen=True)
class Graph:
    """An undirected graph on clients ``0 .. n-1``: ``idx [n, d]`` each
    client's neighbours in increasing order, padded (0, ``valid`` False)."""

    n: int
    idx: torch.Tensor
    valid: torch.Tensor

    @classmethod
    def from_networkx(cls, g: Any, n: int) -> "Graph":
        lists = [sorted(g.neighbors(i)) for i in range(n)]
        d = max((len(x) for x in lists), default=0)
        idx = torch.zeros(n, d, dtype=torch.int64)
        valid = torch.zeros(n, d, dtype=torch.bool)
        for i, row in enumerate(lists):
            idx[i, :len(row)] = torch.tensor(row, dtype=torch.int64)
            valid[i, :len(row)] = True
        return cls(n, idx, valid)

    def degrees(self) -> torch.Tensor:
        """``[n]`` int64: each client's neighbours."""
        return self.valid.sum(1)

    def rows(self, ids: torch.Tensor, device=None) -> torch.Tensor:
        """Bool ``[len(ids), n]``: the neighbours of clients ``ids`` (global ids)."""
        ids = ids.to("cpu", torch.int64)
        out = torch.zeros(len(ids), self.n, dtype=torch.bool)
        idx, valid = self.idx[ids], self.valid[ids]
        r = torch.arange(len(ids))[:, None].expand_as(idx)
        out[r[valid], idx[valid]] = True
        return out.to(device) if device is not None else out


def graph_seed(seed: int, epoch: int, attempt: int, stream: str = "graph") -> int:
    """The networkx seed of a graph: a function of (seed, epoch, attempt) alone (and the stream: an algorithm
    drawing graphs of its own, Epidemic Learning's, keys them on another)."""
    return int(rng.hash_ints(seed, epoch, stream, torch.tensor(attempt), 0)) % 2**32


EDGE_FIX = "one edge a line, two client ids separated by spaces ('3 17'); '#' starts a comment"


def _edges(path: str | Path) -> list[tuple[int, int]]:
    """The ``(i, j)`` pairs of an edge-list file, as written; ConfigError on ``network.path`` naming the first
    line that is not two client ids (a comma-separated line, a weight column, a word) or a file with no edge."""
    field = "network.path"
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(field, str(path), f"cannot be read ({exc}); give a text file of edges: {EDGE_FIX}") from None
    edges = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        if len(parts) == 3 and all(p.lstrip("-").isdigit() for p in parts[:2]):
            raise ConfigError(field, str(path), f"line {number} ('{line.strip()}') has a third column: a graph says "
                              "only who may talk to whom, and fedclust has no use for edge weights; drop the column")
        if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts):
            how = " (comma-separated: separate the ids by spaces)" if "," in text else ""
            raise ConfigError(field, str(path), f"cannot be read as an edge list: line {number} ('{line.strip()}') "
                              f"is not two client ids{how}; {EDGE_FIX}")
        edges.append((int(parts[0]), int(parts[1])))
    if not edges:
        what = "it is empty" if not lines else "only comments and blank lines"
        raise ConfigError(field, str(path), f"holds no edge ({what}); give {EDGE_FIX}")
    return edges


def read_edge_list(path: str | Path, n: int, say=None) -> Any:
    """The graph of an edge-list file (:func:`_edges`), undirected: an edge given in one direction only is used
    both ways (``say`` is told so once, in one line); ConfigError on ``network.path`` naming what is wrong: a
    line that is not an edge, a client that does not exist, a self-loop, a graph that is not connected (every
    client must be reachable)."""
    import networkx as nx  # here, not at the top: 0.17 s of every process's start, for runs that draw a graph

    field = "network.path"
    edges = _edges(path)
    bad = sorted({v for e in edges for v in e if not 0 <= v < n})
    if bad:
        raise ConfigError(field, str(path), f"names client {bad[0]}, but clients are 0..{n - 1} (clients = {n}); "
                          "fix the file or raise clients")
    loops = sorted(i for i, j in edges if i == j)
    if loops:
        raise ConfigError(field, str(path), f"has a self-loop on client {loops[0]}: a client is never its own "
                          "neighbour; remove that line")
    given = set(edges)
    one_way = {(i, j) for i, j in given if (j, i) not in given}
    if one_way and say is not None:
        say(f"network.path {path}: {len(one_way)} of its {len(given)} edges are listed in one direction only; "
            "fedclust's graphs are undirected, so each is used both ways")
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    if not nx.is_connected(g):
        parts = nx.number_connected_components(g)
        alone = sorted(v for v in g.nodes if g.degree(v) == 0)
        also = f" (client {alone[0]} has no edge)" if alone else ""
        raise ConfigError(field, str(path), f"is not connected: its {n} clients fall into {parts} parts{also}; a "
                          "client could never reach the others; add edges between the parts")
    return g


def regular_graph(n: int, degree: int, seed: int, epoch: int, stream: str) -> Graph:
    """A random ``degree``-regular graph of ``n`` clients drawn by networkx from (seed, epoch, stream) alone: the
    graph a method draws for itself (Epidemic Learning's oracle, DePRL's, Facade's and FedSPD's on the complete
    graph).  A draw that is not connected is joined by the ring ``i — i + 1 mod n``, as the reference's peer
    sampler does (decentralizepy ``graphs/Regular.py`` and ``Graph.connect_graph``): its clients then have up to
    ``degree + 2`` neighbours."""
    import networkx as nx  # here, not at the top: 0.17 s of every process's start, for runs that draw a graph

    g = nx.random_regular_graph(degree, n, seed=graph_seed(seed, epoch, 0, stream))
    if not nx.is_connected(g):
        g.add_edges_from((i, (i + 1) % n) for i in range(n))
    return Graph.from_networkx(g, n)


def check_regular_degree(field: str, degree: int, n: int) -> None:
    """Refuse (naming ``field``) a degree no random regular graph of ``n`` clients has."""
    if not 1 <= degree < n:
        raise ConfigError(field, degree, f"must lie in [1, clients - 1 = {n - 1}]")
    if (n * degree) % 2:
        raise ConfigError(field, degree, f"a {degree}-regular graph of {n} clients does not exist (clients x degree "
                          "must be even); choose an even degree")


def make_graph(net: Any, n: int, seed: int, epoch: int, stream: str = "graph",
               connected: bool = True) -> Graph | None:
    """The graph of epoch ``epoch`` for the ``network`` section ``net`` (None:
    complete, no graph).  A random graph that is not connected is drawn
    again (the attempt is part of the key) up to :data:`GRAPH_TRIES` times
    (``connected=False``: taken as drawn)."""
    import networkx as nx  # here, not at the top: 0.17 s of every process's start, for runs that draw a graph

    kind = net.graph
    if kind == "complete":
        return None
    if kind == "file":
        return Graph.from_networkx(read_edge_list(net.path, n), n)
    if kind == "ring":
        return Graph.from_networkx(nx.cycle_graph(n), n)
    for attempt in range(GRAPH_TRIES):
        s = graph_seed(seed, epoch, attempt, stream)
        if kind == "regular":
            g = nx.random_regular_graph(net.degree, n, seed=s)
        elif kind == "erdos_renyi":
            g = nx.fast_gnp_random_graph(n, net.p_edge, seed=s)
        elif kind == "small_world":
            g = nx.watts_strogatz_graph(n, net.degree, net.rewire, seed=s)
        else:
            raise ConfigError("network.graph", kind, "choose complete, ring, regular, erdos_renyi, small_world or "
                              "file")
        if not connected or nx.is_connected(g):
            return Graph.from_networkx(g, n)
    hint = (f"raise network.p_edge above ln(n)/n = {math.log(n) / n:.3g}" if kind == "erdos_renyi"
            else "raise network.degree")
    raise ConfigError(f"network.{'p_edge' if kind == 'erdos_renyi' else 'degree'}",
                      net.p_edge if kind == "erdos_renyi" else net.degree,
                      f"{GRAPH_TRIES} {kind} graphs of {n} clients drawn from this seed were all disconnected; {hint}")


def read_availability(path: str | Path, n: int) -> torch.Tensor:
    """Bool ``[R, n]``: which clients are online in which round, from a
    ``.npy`` file (booleans, or 0/1 integers); ConfigError on
    ``network.availability`` naming what is wrong."""
    field = "network.availability"
    try:
        arr = np.load(str(path), allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(field, str(path), f"cannot be read as a .npy array ({type(exc).__name__}: {exc}); write "
                          "it with numpy.save(path, online) for a [rounds, clients] bool array") from None
    if arr.ndim != 2 or arr.shape[1] != n or arr.shape[0] < 1:
        raise ConfigError(field, str(path), f"holds an array of shape {list(arr.shape)}; it must be [rounds, "
                          f"clients = {n}]: one row per round, one column per client")
    if arr.dtype != bool and not (np.issubdtype(arr.dtype, np.integer) and set(np.unique(arr)) <= {0, 1}):
        raise ConfigError(field, str(path), f"holds {arr.dtype} values; it must hold booleans (or 0/1): True where "
                          "a client is online")
    return torch.from_numpy(arr.astype(bool))


JOIN = "join"             # rng stream: who joins late
JOIN_PEER = "join_peer"   # rng stream: whose model a joiner copies (network.join_init=peer)


def joiners(seed: int, n: int, fraction: float) -> torch.Tensor | None:
    """Bool ``[n]`` (CPU): the run's late joiners (``network.join_fraction``), the ``ceil(fraction · n)`` clients
    of lowest key ``rng.uniform(seed, 0, "join", client)`` (ties: the lower id); None when there are none."""
    if fraction <= 0:
        return None
    count = math.ceil(fraction * n - 1e-9)
    keys = rng.uniform(seed, 0, JOIN, torch.arange(n), 0)
    out = torch.zeros(n, dtype=torch.bool)
    out[torch.argsort(keys, stable=True)[:count]] = True
    return out


def join_peers(seed: int, round_: int, late: torch.Tensor) -> torch.Tensor:
    """``[n]`` int64: for each late joiner (``late``, bool ``[n]``) the present client whose model it copies at
    its join round (``network.join_init=peer``): the present clients in id order, the one at
    ``floor(rng.uniform(seed, round, "join_peer", joiner) · present)``; -1 for the others."""
    present = (~late).nonzero().flatten()
    pick = (rng.uniform(seed, round_, JOIN_PEER, torch.arange(len(late)), 0) * len(present)).floor().to(torch.int64)
    return torch.where(late, present[pick.clamp_max(len(present) - 1)], -1)


@dataclass(frozen=True)
class Join:
    """One rank's late joiners: at round ``round`` (and no other) :meth:`start` puts each local joiner's model to
    its start: ``initial`` (``[J, P]``, the run's initial rows of the local joiners ``rows``), or with
    ``peers`` the model the chosen present client holds then (gathered exactly: a float's bits summed as int32
    with zeros from every rank but its holder's)."""

    round: int
    late: torch.Tensor                # [n] bool (CPU), every late joiner
    rows: torch.Tensor                # local rows of this rank's joiners
    initial: torch.Tensor             # [len(rows), P] their initial models
    peers: torch.Tensor | None        # [n] int64 the client each copies (join_peers); None: initial

    def start(self, flat: torch.Tensor, ids: torch.Tensor, all_reduce) -> None:
        """In place on this rank's models ``flat`` (clients ``ids``), at the join round: each joiner's start."""
        if self.peers is None:
            flat[self.rows.to(flat.device)] = self.initial.to(flat.device, flat.dtype)
            return
        late = self.late.nonzero().flatten()           # every joiner, in id order: the rows of the buffer
        source = self.peers[late]
        lo, hi = (int(ids[0]), int(ids[-1]) + 1) if len(ids) else (0, 0)
        mine = ((source >= lo) & (source < hi)).nonzero().flatten()
        buf = torch.zeros(len(late), flat.shape[1], dtype=flat.dtype, device=flat.device)
        buf[mine.to(flat.device)] = flat[(source[mine] - lo).to(flat.device)]
        bits = all_reduce(buf.view(torch.int32)).view(flat.dtype)   # one holder a row: exact
        own = ((late >= lo) & (late < hi)).nonzero().flatten()
        flat[(late[own] - lo).to(flat.device)] = bits[own.to(flat.device)]


def epoch_of(round_: int, redraw_every: int) -> int:
    """The graph a round uses: 0 for every round without redraws, else ``(round - 1) // redraw_every``."""
    return 0 if redraw_every <= 0 else max(0, round_ - 1) // redraw_every


@dataclass(frozen=True)
class Reach:
    """A round's graph as one process's clients see it: ``rows(lo, hi)`` the
    bool neighbours of its local clients lo..hi (the ``allowed`` of
    :func:`fedclust.rng.choose_indices`), ``mask()`` all of them ``[C, n]``."""

    graph: Graph
    ids: torch.Tensor        # [C] global ids of this process's clients
    device: torch.device

    def rows(self, lo: int, hi: int) -> torch.Tensor:
        return self.graph.rows(self.ids[lo:hi], self.device)

    def __call__(self, lo: int, hi: int) -> torch.Tensor:
        return self.rows(lo, hi)

    def mask(self) -> torch.Tensor:
        return self.graph.rows(self.ids, self.device)


class Network:
    """A run's graphs, one per epoch, drawn when first asked for and kept
    while the epoch lasts (the same on every process)."""

    def __init__(self, net: Any, n: int, seed: int):
        self.net, self.n, self.seed = net, n, seed
        self._epoch: int | None = None
        self._graph: Graph | None = None
        self._trace = read_availability(net.availability, n) if net.availability else None
        self.drawn: dict[int, np.ndarray] = {}   # epoch -> its graph's edges [E, 2] int32, as drawn (the record)
        # the late joiners (network.join_round), bool [n] (CPU); None: none
        self.joiners = joiners(seed, n, net.join_fraction) if net.join_round else None

    def online(self, round_: int) -> torch.Tensor | None:
        """Bool ``[n]`` (CPU): the clients online in round ``round_``; None: everyone (no faults asked).  With
        ``p_offline`` a client is offline when ``rng.uniform(seed, round, "offline", client) < p_offline``; a
        late joiner (``join_round``) is offline in every round before its join (:func:`joiners`)."""
        up = self._online(round_)
        if self.joiners is None or round_ >= self.net.join_round:
            return up
        return ~self.joiners if up is None else up & ~self.joiners

    def _online(self, round_: int) -> torch.Tensor | None:
        if self._trace is not None:
            return self._trace[(round_ - 1) % self._trace.shape[0]]
        p = float(self.net.p_offline)
        if p <= 0:
            return None
        return rng.uniform(self.seed, round_, "offline", torch.arange(self.n), 0) >= p

    @property
    def complete(self) -> bool:
        return self.net.graph == "complete"

    def graph(self, round_: int) -> Graph | None:
        """The graph of round ``round_`` (None: complete)."""
        if self.complete:
            return None
        epoch = epoch_of(round_, self.net.redraw_every)
        if epoch != self._epoch:
            self._graph, self._epoch = make_graph(self.net, self.n, self.seed, epoch), epoch
            if self._graph is not None:
                self.drawn[epoch] = edge_array(self._graph).astype(np.int32)
        return self._graph

    def record(self, rounds: int) -> dict[str, np.ndarray]:
        """The graphs of rounds 1..``rounds`` as saved with the run (neighbors.npz): ``graph_edges`` ``[E, 2]``
        int32, every epoch's edges (i < j) one after another, and ``graph_epoch_start`` ``[epochs + 1]``, where
        epoch e's edges start (epoch e serves rounds ``e·T + 1 .. (e + 1)·T``, T = network.redraw_every; one epoch
        without redraws).  Epochs not drawn in this process (before a resume) are drawn now, as the run drew them
        (a function of seed and epoch alone); {} on the complete graph."""
        if self.complete:
            return {}
        epochs = epoch_of(rounds, self.net.redraw_every) + 1
        parts = [self.drawn[e] if e in self.drawn else self._edges(e) for e in range(epochs)]
        start = np.cumsum([0] + [len(x) for x in parts]).astype(np.int64)
        return {"graph_edges": np.concatenate(parts).reshape(-1, 2), "graph_epoch_start": start}

    def _edges(self, epoch: int) -> np.ndarray:
        g = make_graph(self.net, self.n, self.seed, epoch)
        assert g is not None   # not the complete graph
        return edge_array(g).astype(np.int32)

    def stragglers(self, round_: int) -> torch.Tensor | None:
        """Bool ``[n]`` (CPU): the clients that straggle in round ``round_``, when
        ``rng.uniform(seed, round, "straggle", client) < stragglers``; None: none asked."""
        share = float(self.net.stragglers)
        if share <= 0:
            return None
        return rng.uniform(self.seed, round_, "straggle", torch.arange(self.n), 0) < share

    def delivery(self, round_: int, ids: torch.Tensor) -> Delivery | None:
        """What arrives in round ``round_`` at clients ``ids`` (None: every model sent, no fault asked)."""
        online = self.online(round_)
        p_drop = float(self.net.p_drop)
        if online is None and p_drop <= 0:
            return None
        return Delivery(self.seed, round_, online, p_drop, ids.to("cpu", torch.int64))

    def reach(self, round_: int, ids: torch.Tensor, device) -> Reach | None:
        """Round ``round_``'s graph as clients ``ids`` see it (None: complete, every other client)."""
        g = self.graph(round_)
        return None if g is None else Reach(g, ids.to("cpu", torch.int64), torch.device(device))


# ----------------------------------------------------------------------------
# Restricting draws and choices to a round's graph


@dataclass(frozen=True)
class Conditions:
    """One round's conditions as the network and the attack decide them, the same on every rank, applied by
    the round step (:func:`fedclust.round.round_step`): who is online, who straggles and how much of its work
    it does, who attacks and how."""

    online: torch.Tensor | None        # [n] bool (CPU); None: everyone
    stragglers: torch.Tensor | None    # [n] bool (CPU); None: none
    straggler_work: float              # the share of its steps a straggler completes
    attackers: torch.Tensor | None     # [n] bool (CPU), the run's attackers; None: none
    attack: Any                        # the attack section (kind, scale)

    @property
    def nobody_online(self) -> bool:
        return self.online is not None and not bool(self.online.any())

    def trains(self, planned: torch.Tensor | None) -> torch.Tensor | None:
        """[n] bool: the clients that train, those the plan asks for (None: all) that are online."""
        if self.online is None:
            return planned
        return self.online if planned is None else planned & self.online.to(planned.device)

    def poisoning(self, trains: torch.Tensor | None, ids: torch.Tensor, device) -> torch.Tensor | None:
        """Local rows (of ``ids``, this rank's clients) of the attackers that train this round and send poison
        instead (label_flip's poison is in its labels: none); None: none."""
        if self.attackers is None or self.attack.kind == "label_flip":
            return None
        mine = self.attackers[ids] & (True if trains is None else trains.cpu()[ids])
        rows = mine.nonzero().flatten()
        return rows.to(device) if len(rows) else None


def round_conditions(network: "Network", attackers: torch.Tensor | None, attack: Any, round_: int) -> Conditions:
    """Round ``round_``'s :class:`Conditions` of a run's ``network`` and its ``attackers`` (config ``attack``)."""
    return Conditions(online=network.online(round_), stragglers=network.stragglers(round_),
                      straggler_work=float(network.net.straggler_work), attackers=attackers, attack=attack)


def both(allowed, reach: Reach | None):
    """``allowed`` (None, a bool ``[C, n]`` mask or a function of a chunk of
    rows) and the round's ``reach`` at once, in the form
    :func:`fedclust.rng.choose_indices` takes; ``allowed`` itself where the
    graph is complete."""
    if reach is None:
        return allowed
    if allowed is None:
        return reach

    def rows(lo: int, hi: int) -> torch.Tensor:
        ok = allowed[lo:hi] if isinstance(allowed, torch.Tensor) else allowed(lo, hi)
        return ok.to(reach.device) & reach.rows(lo, hi)

    return rows


def within(choice, reach: Reach | None):
    """A choice (bool ``[C, n]`` mask or :class:`fedclust.peers.PeerIndex`)
    kept to the round's graph: a client receives only from its neighbours of
    that round.  The choice itself where the graph is complete."""
    if reach is None:
        return choice
    if isinstance(choice, PeerIndex):
        C, m = choice.idx.shape
        if m == 0:
            return choice
        ok = torch.zeros_like(choice.valid)
        step = max(1, rng.CHOOSE_CHUNK_ELEMENTS // max(reach.graph.n, 1))
        for lo in range(0, C, step):   # chunks of rows: no [C, n] mask
            hi = min(C, lo + step)
            ok[lo:hi] = reach.rows(lo, hi).gather(1, choice.idx[lo:hi])
        return keep_peers(choice, ok)
    return choice & reach.mask()


def keep_peers(choice: PeerIndex, ok: torch.Tensor) -> PeerIndex:
    """The peers of ``choice`` where ``ok`` (bool ``[C, m]``, beside its
    indices) holds, in their order, padded to the longest kept row."""
    valid = choice.valid & ok
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices   # kept peers first, in order
    width = int(valid.sum(1).max()) if valid.shape[0] else 0                  # the longest kept row
    idx = torch.where(valid, choice.idx, torch.zeros_like(choice.idx)).gather(1, order)[:, :width]
    return PeerIndex(idx, valid.gather(1, order)[:, :width], choice.n)


@dataclass(frozen=True)
class Delivery:
    """What arrives in a round, as one process's clients see it: a model
    comes only from a client online (``online`` bool ``[n]``, None: all) and
    is lost on the way from client j to client i with probability
    ``p_drop``, when ``rng.uniform(seed, round, "drop", i, j) < p_drop`` (the
    same loss for scoring it and for averaging it).  A client offline
    itself receives nothing."""

    seed: int
    round: int
    online: torch.Tensor | None
    p_drop: float
    ids: torch.Tensor        # [C] global ids of this process's clients

    def own_online(self) -> torch.Tensor:
        """Bool ``[C]``: this process's clients online this round."""
        return (torch.ones(len(self.ids), dtype=torch.bool) if self.online is None
                else self.online.to("cpu")[self.ids.to("cpu")])

    def arrived(self, rows: torch.Tensor, senders: torch.Tensor) -> torch.Tensor:
        """Bool, ``senders``' shape: whether the model each sender sent to the row's client (``rows`` local row
        indices, broadcast) arrived: the sender online and the model not lost."""
        ok = torch.ones(senders.shape, dtype=torch.bool, device=senders.device)
        if self.online is not None:
            ok &= self.online.to(senders.device)[senders]
        if self.p_drop > 0:
            receivers = self.ids.to(senders.device)[rows]
            ok &= rng.uniform(self.seed, self.round, "drop", receivers, senders) >= self.p_drop
        return ok

    def _mask_rows(self, lo: int, hi: int, n: int, device) -> torch.Tensor:
        rows = torch.arange(lo, hi, device=device)[:, None]
        return self.arrived(rows, torch.arange(n, device=device)[None, :].expand(hi - lo, n))

    def answering(self, pool: torch.Tensor) -> torch.Tensor:
        """A bool ``[C, n]`` pool of peers to score kept to the models that arrived (an offline client, or a lost
        model, gives no score)."""
        out = pool.clone()
        step = max(1, rng.CHOOSE_CHUNK_ELEMENTS // max(pool.shape[1], 1))
        for lo in range(0, pool.shape[0], step):   # chunks of rows: the loss keys [rows, n] at a time
            hi = min(pool.shape[0], lo + step)
            out[lo:hi] &= self._mask_rows(lo, hi, pool.shape[1], pool.device)
        return out

    def choice(self, choice):
        """A choice kept to what arrived: nothing from a client offline or a lost model, nothing for a client
        offline itself."""
        own = self.own_online()
        if isinstance(choice, PeerIndex):
            rows = torch.arange(choice.idx.shape[0], device=choice.idx.device)[:, None]
            ok = self.arrived(rows, choice.idx) & own.to(choice.idx.device)[:, None]
            return keep_peers(choice, ok)
        return self.answering(choice) & own.to(choice.device)[:, None]


def answering(pool: torch.Tensor, delivery: Delivery | None) -> torch.Tensor:
    """:meth:`Delivery.answering`, or the pool itself where every model arrives."""
    return pool if delivery is None else delivery.answering(pool)


def delivered(choice, delivery: Delivery | None):
    """:meth:`Delivery.choice`, or the choice itself where every model arrives."""
    return choice if delivery is None else delivery.choice(choice)


def edge_array(graph: Graph) -> np.ndarray:
    """``[E, 2]`` int64: each undirected edge once (i < j), in order (figures, tests)."""
    i = torch.arange(graph.n)[:, None].expand_as(graph.idx)
    keep = graph.valid & (graph.idx > i)
    return torch.stack([i[keep], graph.idx[keep]], dim=1).numpy()
