"""What an algorithm sees and returns each round.

Every algorithm derives from :class:`Algorithm` (one file each, registered
by name, its config section and facilities declared as class attributes).
Peer-to-peer ones (:class:`PeerAlgorithm`) choose, for each of this rank's
clients, whom to average with; the base turns that choice into one
mixing-matrix product over the gathered weights (docs/algorithms.md).

Neighbour sets are bool masks ``[C, n]`` (row c is this rank's client
``ctx.client_ids[c]``, column j is global client j) or, for a choice of a
few peers each, :class:`fedclust.peers.PeerIndex` index lists (C·k numbers,
no [C, n] table).  A client is never its own neighbour.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator

import torch

from fedclust.algorithms.aggregation import gossip_view, own, own_mask
from fedclust.engine.layout import ParamLayout
from fedclust.errors import ConfigError
from fedclust.peers import PeerIndex, peer_counts
from fedclust.schema import check_choices


def _no_memory() -> tuple[int, str]:
    raise ValueError("RunFacts.free_memory was not given")


@dataclass(frozen=True)
class RunFacts:
    """What an algorithm may know of a run besides its config, before it
    starts: given to :meth:`Algorithm.from_config` and
    :meth:`Algorithm.check_run` by the config checks and the runner
    (:func:`fedclust.config.run_facts`).  An algorithm builds no model and
    asks no transport itself: what it needs of either comes from here or
    from the round's :class:`Context`."""

    layout: ParamLayout                     # the model's flat parameters (names, shapes, offsets); P = .numel
    init: Callable[[int], torch.Tensor]     # the model's default init under a seed, flat [P] float32 on the CPU
    world: int = 1                          # processes of the run
    ranks_per_node: int = 1                 # of them on one machine, sharing its host memory
    # (bytes free, where) on the device a rank of the run uses (asked when called)
    free_memory: Callable[[], tuple[int, str]] = _no_memory


@dataclass
class Context:
    """Static facts of one run on one rank."""

    n: int                       # clients in all
    client_ids: torch.Tensor     # [C] global ids held by this rank (contiguous)
    clusters: torch.Tensor | None  # [n] true cluster of every client (Oracle, metrics); None when the data does
    #                                not give them (a file without `cluster`: Oracle refuses it in its check)
    seed: int
    stage1_rounds: int
    w0: torch.Tensor             # [P] common initial weights
    device: torch.device
    # loss of models on the training sets of this rank's clients:
    # (models [M, P], local client index [M]) -> mean cross-entropy [M]
    pair_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    # the same losses grouped by client (faster): (models [M, P], peers [C, m] indices
    # into models) -> [C, m], row c on this rank's client c's training set
    pool_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    # every rank's tensor summed into it, in place, through the run's collective wrapper (a failed or stuck
    # collective becomes "rank X, round t" error); returns it.  One process: the tensor as it is.
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = lambda x: x

    @property
    def own_rows(self) -> slice:
        """This rank's clients as a slice of the gathered ``[n, ...]`` rows
        (shards are contiguous, :func:`fedclust.dist.shard_bounds`)."""
        ids = self.client_ids
        start = int(ids[0]) if len(ids) else 0
        if len(ids) and int(ids[-1]) - start + 1 != len(ids):
            raise ValueError(f"client_ids must be contiguous, got {ids.tolist()[:10]}...")
        return slice(start, start + len(ids))

    @property
    def self_mask(self) -> torch.Tensor:
        """[C, n] True where column j is the row's own client."""
        return own_mask(self.client_ids.to(self.device), self.n)


@dataclass
class RoundView:
    """What the round's single all-gather makes visible.  Every client's
    models are read through :meth:`blocks`, whether the exchange brought
    them whole (one block) or a column block at a time (config
    ``exchange_mb``; ``columns`` then reads them, one gather a block)."""

    round: int                          # 1-based
    before: torch.Tensor | None         # [C, P] this rank's models before local training (gathers_before only)
    after: torch.Tensor                 # [C, P] after local training
    all_after: torch.Tensor | None = None   # [n, P] every client's model after local training (None: in blocks)
    all_before: torch.Tensor | None = None  # [n, P], only if the algorithm sets gathers_before (None: in blocks)
    all_labels: torch.Tensor | None = None  # [n] int64 every client's RoundPlan.labels (gathers_labels only)
    # The exchange in column blocks (fedclust.dist.ColumnBlocks: .width, .blocks(names), .parts); None: whole.
    columns: Any = None

    @property
    def whole(self) -> bool:
        """The models came whole (all_after, all_before), not in column blocks."""
        return self.columns is None

    @property
    def width(self) -> int:
        """P, the columns of a model."""
        return int(self.columns.width if self.columns is not None else self.after.shape[1])

    def whole_after(self) -> torch.Tensor:
        """``all_after`` ([n, P], every client's model after local training), for an algorithm that reads whole
        models; ValueError when the exchange came in column blocks (refused by the config checks for an
        algorithm that does not declare ``column_exchange``)."""
        if self.all_after is None:
            raise ValueError("the round's models came in column blocks (exchange_mb), not whole: the algorithm "
                             "reads whole models, so the exchange in column blocks is refused for it")
        return self.all_after

    def gathered_labels(self) -> torch.Tensor:
        """``all_labels`` ([n] int64, every client's RoundPlan.labels), for an algorithm that declares
        ``gathers_labels``; ValueError when the round's gather carries none."""
        if self.all_labels is None:
            raise ValueError("the round's gather carries no labels: an algorithm that reads them declares "
                             "gathers_labels")
        return self.all_labels

    def blocks(self, names: tuple[str, ...] = ("after",)) -> Iterator[tuple[int, int, dict[str, torch.Tensor]]]:
        """``(start, stop, {name: [n, stop - start]})`` over the gathered models' columns in increasing order
        (``names`` among "after", "before"): the whole models as one block when they came whole, else one
        block (and one gather) at a time."""
        if self.columns is not None:
            yield from self.columns.blocks(names)
            return
        got = {k: getattr(self, f"all_{k}") for k in names}
        missing = [k for k, v in got.items() if v is None]
        if missing:
            raise ValueError(f"the round's gather holds no {missing[0]!r} models: an algorithm that reads them "
                             "declares gathers_before")
        yield 0, self.width, got

    def drop_before(self) -> None:
        """Let go of the models from before training (the gossip needs only the new ones): one [n, P] less, or
        one [C, P], at the gossip's peak."""
        self.before = self.all_before = None
        if self.columns is not None:
            self.columns.parts.pop("before", None)


@dataclass
class RoundPlan:
    """What each of this rank's clients trains from in a round."""

    start: torch.Tensor                  # [C, P] models local training starts from
    anchor: torch.Tensor | None = None   # [C, P] proximal centre (FedProx, FPFC); None: plain SGD
    mu: float = 0.0                      # proximal weight: grad += mu * (w - anchor)
    # names of the parameter tensors (ParamLayout.names) that carry the proximal term; None: all of them
    # (FPFC's fpfc.fuse=head: the classifier head only, the body trains plain)
    prox_layers: tuple[str, ...] | None = None
    # bool [n], every client's, the same on every rank: the clients that train this round (the participants of
    # an algorithm with participation < 1, whose aggregate reads no one else's trained model); None: all
    trains: torch.Tensor | None = None
    # int64 [C], this rank's clients': a number each, below 2^24, that every rank's aggregate reads (the cluster
    # model a client started from: IFCA, CFL), carried in the round's gather as one more column
    # (view.all_labels); an algorithm that sets it declares gathers_labels
    labels: torch.Tensor | None = None


@dataclass
class RoundResult:
    """What a round leaves: the models clients hold (and are evaluated
    with), and what the metrics need."""

    models: torch.Tensor                        # [C, P] each own client's model after the round
    lists: Any = None         # neighbour lists (peer-to-peer) for precision/recall: [C, n] bool or a PeerIndex
    averaged: Any = None      # whom each own client averaged with this round: [C, n] bool or a PeerIndex
    assignment: torch.Tensor | None = None      # [n] long cluster of every client (centralized), replicated
    received: torch.Tensor | None = None        # [C] models each own client received this round
    server_received: int = 0                    # models the server received this round (0: no server)
    server_sent: int = 0                        # models the server sent this round


def server_result(ctx: Context, models: torch.Tensor, assignment: torch.Tensor, received: torch.Tensor,
                  uploads: int) -> RoundResult:
    """RoundResult of a server round: ``models [C, P]`` held (and evaluated)
    by this rank's clients, ``assignment [n]``, ``received [n]`` models each
    client got from the server this round (replicated; this rank's rows are
    reported), ``uploads`` models the server received."""
    return RoundResult(models=models.contiguous(), assignment=assignment.to(torch.int64),
                       received=own(ctx, received).to(torch.float64),
                       server_received=int(uploads), server_sent=int(received.sum()))


# ----------------------------------------------------------------------------
# Algorithm state: per-client rows and replicated server state


def client_rows(**kwargs):
    """A state dataclass field whose rows are this rank's clients (``[C, ...]``
    tensors, or None): checkpoints gather them from every rank and hand each
    row back to whichever rank holds that client on resume.  Other fields
    are server state, replicated on every rank and saved once."""
    return field(metadata={"rows": "client"}, **kwargs)


def round_only(**kwargs):
    """A state dataclass field read only in the round that sets it (e.g. the
    peers a client contacted this round, for the traffic count): never saved,
    and back at its default after a resume."""
    return field(metadata={"rows": "round"}, **kwargs)


def _is_client_field(f) -> bool:
    return f.metadata.get("rows") == "client"


def split_state(state) -> tuple[dict, dict]:
    """``(client rows, server state)`` of a state: a dataclass (fields marked
    :func:`client_rows` are rows, those marked :func:`round_only` are left
    out), or None."""
    if state is None:
        return {}, {}
    if not dataclasses.is_dataclass(state):
        raise TypeError(f"algorithm state must be a dataclass or None to be saved, got {type(state).__name__}; "
                        "override Algorithm.state_dict / load_state_dict")
    rows: dict[str, Any] = {}
    server: dict[str, Any] = {}
    for f in dataclasses.fields(state):
        if f.metadata.get("rows") != "round":
            (rows if _is_client_field(f) else server)[f.name] = getattr(state, f.name)
    return rows, server


# ----------------------------------------------------------------------------
# The algorithm base


class Algorithm:
    """One algorithm: subclass, declare, register (:func:`fedclust.algorithms.registry.register`).

    Declared (class attributes, read by the config checks, the runner, the
    figures and the report; none is a name in a central list):

    - ``name``: the ``algorithm.name`` that selects it.
    - ``sections``: ``{section name: dataclass}`` of its config keys; each
      field is declared once there (:func:`fedclust.schema.option`: default
      and meaning), and ``validate(self, cfg)`` is its one check, raising
      ConfigError with the real key (``fpfc.lam``).  A section may be shared
      by name.  :meth:`from_config` hands the object the section instances
      themselves, which it holds under the section's name and reads as
      ``self.fpfc.lam``: no copy of a key, no second check.
    - ``needs_k``, ``needs_l``, ``needs_stages``: it uses ``algorithm.k``,
      ``algorithm.l``, a stage one of ``stage1_rounds`` rounds.
    - ``keeps_k_of_l``: each round it draws l candidates and keeps the top k
      of them, so it needs ``l >= k``.
    - ``gathers_before``: the round's gather also carries the models before
      local training (``view.all_before``).
    - ``gathers_labels``: its :meth:`plan` gives ``labels``, a number per
      client that the gather carries as one more column (``view.all_labels``).
    - ``column_exchange``: its :meth:`aggregate` can read the gathered models
      in column blocks (``view.columns``, config ``exchange_mb``), never
      needing a whole model of another client.
    - ``topology``: "peer" (clients average with peers) or "server".
    - ``choice_masks``: its round's neighbour choice holds bool ``[C, n]``
      masks (PANM, PENS: lists that may hold a whole cluster); False for
      index lists of a few peers (:class:`fedclust.peers.PeerIndex`) or
      none.  The growth law of ``fedclust bench-scale`` reads it.
    - ``stage_one_figures``: stage-one similarity and precision figures apply.
    - ``paper_results``: ``{(data, cluster kind or None, clusters): (mean, std)}``
      accuracy a paper reports, and ``report_position``, its row in
      ``fedclust report``'s table.

    The round: :meth:`init` the state, then each round :meth:`plan` (what
    each client trains from) and :meth:`aggregate` (after the gather).
    State is a dataclass whose per-client fields are :func:`client_rows`,
    or None; :meth:`state_dict` / :meth:`load_state_dict` save and restore it.
    """

    name: ClassVar[str] = ""
    sections: ClassVar[dict] = {}
    needs_k: ClassVar[bool] = False
    needs_l: ClassVar[bool] = False
    needs_stages: ClassVar[bool] = False
    keeps_k_of_l: ClassVar[bool] = False
    gathers_before: bool = False
    gathers_labels: ClassVar[bool] = False
    column_exchange: ClassVar[bool] = False
    topology: ClassVar[str] = "server"
    choice_masks: ClassVar[bool] = False
    stage_one_figures: ClassVar[bool] = False
    paper_results: ClassVar[dict] = {}
    report_position: ClassVar[float] = 1000.0   # where fedclust report's table lists it (lower first)
    # record keys of :meth:`extra_accuracy`, each in every evaluated round's record (null where the method gives
    # none) and, as ``final_<key>``, in summary.json; none by default (the record is unchanged)
    extra_accuracies: ClassVar[tuple[str, ...]] = ()
    validation_key: ClassVar[str] = ""   # the config key of validation_share, named by the errors about it

    @classmethod
    def from_config(cls, cfg) -> "Algorithm":
        """The algorithm object for a validated config (:meth:`check` has passed):
        its sections as they are, the core keys it uses as values.  One that
        needs the model (its layout, its init) or the run's processes takes a
        second parameter, ``facts`` (:class:`RunFacts`), and gets them."""
        raise NotImplementedError(f"{cls.__name__} must define from_config(cfg)")

    @classmethod
    def check(cls, cfg) -> None:
        """Refuse a config this algorithm cannot run with: its declared needs
        and its sections' own checks.  Override to add more (call super)."""
        a, n = cfg.algorithm, cfg.clients
        if cls.needs_k:
            if a.k < 1:
                raise ConfigError("algorithm.k", a.k, f"{cls.name} averages with k >= 1 neighbours")
            if a.k >= n:
                raise ConfigError("algorithm.k", a.k, f"must be smaller than clients ({n}): at most {n - 1}")
        if cls.needs_l:
            if a.l < 1:
                raise ConfigError("algorithm.l", a.l, f"{cls.name} draws l >= 1 candidates per round")
            if a.l > n - 1:
                raise ConfigError("algorithm.l", a.l,
                                  f"must be at most clients - 1 = {n - 1} (candidates are other clients)")
        if cls.keeps_k_of_l and a.l < a.k:
            raise ConfigError("algorithm.l", a.l,
                              f"{cls.name} keeps the top k = {a.k} of the l candidates it draws each round, so l "
                              f"must be at least k (with fewer, round 1 gives only l neighbours): raise algorithm.l "
                              f"to {a.k} or more, or lower algorithm.k to {a.l} or less")
        if cls.needs_stages and not 1 <= cfg.stage1_rounds <= cfg.rounds:
            raise ConfigError("stage1_rounds", cfg.stage1_rounds,
                              f"{cls.name} needs 1 <= stage1_rounds <= rounds ({cfg.rounds}): stage two starts "
                              "from stage one's neighbour list")
        for section in cls.sections:
            check_choices(getattr(cfg, section), section + ".")
            getattr(cfg, section).validate(cfg)

    @classmethod
    def check_run(cls, cfg, facts: RunFacts) -> None:
        """Refuse a config whose run cannot fit this machine (its model and
        processes: ``facts``), before any data is read; default: nothing."""

    # -- the round -------------------------------------------------------

    def init(self, ctx: Context) -> Any:
        """The state before round 1 (None: stateless)."""
        return None

    def plan(self, state: Any, ctx: Context, round_: int, models: torch.Tensor) -> tuple[Any, "RoundPlan"]:
        """What each of this rank's clients trains from; default: the models it holds."""
        return state, RoundPlan(start=models)

    def aggregate(self, state: Any, ctx: Context, view: RoundView) -> tuple[Any, "RoundResult"]:
        raise NotImplementedError(f"{type(self).__name__} must define aggregate (or derive from PeerAlgorithm)")

    # -- data and evaluation hooks ---------------------------------------

    @property
    def validation_share(self) -> float:
        """Share of each client's training examples held out as its validation
        split (:func:`fedclust.data.validation.carve_validation`, never trained
        on); 0 by default: every example trains."""
        return 0.0

    def extra_accuracy(self, state: Any, ctx: Context, data: Any, models: torch.Tensor, accuracy: torch.Tensor,
                       score: Callable) -> dict[str, torch.Tensor]:
        """More test accuracies of this rank's clients for an evaluated round:
        ``{key in extra_accuracies: [C] accuracy in [0, 1]}`` (a key left out
        is null).  ``data``: this rank's FederatedData; ``models [C, P]`` what
        the clients hold and ``accuracy [C]`` its test accuracy;
        ``score(models [M, P], x, y, counts)`` -> (accuracy [M], mean loss
        [M]) of model m on x[m], y[m].  Every rank must give the same keys
        (their columns travel in the round's one gather).  Default: none."""
        return {}

    # -- checkpoints -----------------------------------------------------

    def state_dict(self, state: Any) -> dict:
        """``{"clients": {field: [C, ...] rows}, "server": {field: value}}``."""
        rows, server = split_state(state)
        return {"clients": rows, "server": server}

    def load_state_dict(self, ctx: Context, saved: dict) -> Any:
        """The state from :meth:`state_dict`'s output with this rank's rows
        (``saved["clients"]`` already holds only ``ctx.client_ids``' rows, on
        ``ctx.device``)."""
        template = self.init(ctx)
        if template is None:
            return None
        kept = {f.name for f in dataclasses.fields(template)}
        values = {**saved["clients"], **saved["server"]}
        unknown = sorted(set(values) - kept)
        if unknown:
            raise ValueError(f"{self.name}: the checkpoint's algorithm state has fields {unknown} that this version "
                             "does not know: resume with the fedclust version that wrote it")
        return dataclasses.replace(template, **{k: v for k, v in values.items() if k in kept})


def received_models(averaged, extra: torch.Tensor | None, own_ids: torch.Tensor) -> torch.Tensor:
    """``[C]`` models each client receives: the peers it averages with
    (``averaged``, a bool [C, n] mask or a :class:`fedclust.peers.PeerIndex`,
    which never holds the client itself) and those in ``extra`` (bool
    [C, n] or None), each counted once, never the client itself.  Index
    lists are counted by their indices, with no [C, n] temporary."""
    if isinstance(averaged, PeerIndex):
        if extra is None:
            return averaged.counts()
        own = own_ids.to(extra.device)
        rows = torch.arange(len(own), device=extra.device)
        in_extra = extra.gather(1, averaged.idx)
        return peer_counts(extra) - extra[rows, own].to(torch.int64) + (averaged.valid & ~in_extra).sum(1)
    contacted = averaged if extra is None else averaged | extra
    return peer_counts(contacted & ~own_mask(own_ids.to(contacted.device), contacted.shape[1]))


class PeerAlgorithm(Algorithm):
    """Peer-to-peer: each client trains from the model it holds, then
    :meth:`select` chooses whom it averages with, and the gossip average
    (docs/algorithms.md) is one mixing-matrix product.  A client receives
    the models of every peer it averages with and of every peer whose
    similarity it computes (:meth:`contacted`)."""

    topology: ClassVar[str] = "peer"
    choice_masks: ClassVar[bool] = True   # a select that returns a PeerIndex sets False
    column_exchange = True   # the gossip average is column by column; a select reading whole models sets False

    def select(self, state: Any, ctx: Context, view: RoundView) -> tuple[Any, Any]:
        """New state and whom each client averages with this round: a bool [C, n]
        mask, or a :class:`fedclust.peers.PeerIndex` (no [C, n] table)."""
        raise NotImplementedError(f"{type(self).__name__} must define select")

    def neighbor_list(self, state: Any, averaged: Any) -> Any:
        """The neighbour list scored by precision and recall (either form); default: this round's ``averaged``."""
        return averaged

    def contacted(self, state: Any, round_: int) -> torch.Tensor | None:
        """Bool [C, n]: peers whose models a client fetched this round beyond
        those it averages with (e.g. to rank candidates); default: none."""
        return None

    def aggregate(self, state: Any, ctx: Context, view: RoundView):
        state, averaged = self.select(state, ctx, view)
        view.drop_before()
        own_ids = ctx.client_ids
        received = received_models(averaged, self.contacted(state, view.round), own_ids)
        return state, RoundResult(
            models=gossip_view(averaged, own_ids, view),
            lists=self.neighbor_list(state, averaged),
            averaged=averaged,
            received=received,
        )
