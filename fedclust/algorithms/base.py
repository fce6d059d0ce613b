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
from typing import Any, Callable, ClassVar, Iterator, Literal, Protocol, Union

import torch

from fedclust.algorithms.aggregation import gossip_view, own, own_mask
from fedclust.engine.layout import ParamLayout
from fedclust.errors import ConfigError
from fedclust.network import Delivery, Graph, Reach, delivered, within
from fedclust.peers import PeerIndex, peer_counts
from fedclust.schema import check_choices

Choice = Union[torch.Tensor, PeerIndex]   # a neighbour choice: a bool [C, n] mask, or index lists
State = Any    # an algorithm's own state: a dataclass of its choosing (client_rows, round_only fields), or None


class ColumnReader(Protocol):
    """The round's models in column blocks (:class:`fedclust.dist.ColumnBlocks`), as
    :meth:`RoundView.blocks` reads them."""

    width: int                              # P, the columns of a model
    parts: dict[str, torch.Tensor]          # this rank's own [C, P] parts ("after", "before"), gathered per block

    def blocks(self, names: tuple[str, ...] = ...) -> Iterator[tuple[int, int, dict[str, torch.Tensor]]]: ...


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


LOSS_FUNCTIONS = ("pair_loss", "pool_loss", "sample_loss")   # the Context's loss functions, by field name


class LossNotGiven:
    """What a :class:`Context` holds for a loss function its maker did not give (a test's fake Context): calling
    it raises ValueError naming the function, instead of ``'NoneType' object is not callable``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any) -> torch.Tensor:
        raise ValueError(f"ctx.{self.name} was not given: the runner gives every Context the engine's loss "
                         f"functions, and a Context made by hand (a test's) must give {self.name}= to an algorithm "
                         "that reads it")

    def __repr__(self) -> str:
        return f"LossNotGiven({self.name!r})"


def loss_given(fn: Callable | None) -> bool:
    """Whether a Context's loss function was given (neither None nor :class:`LossNotGiven`)."""
    return fn is not None and not isinstance(fn, LossNotGiven)


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
    # The engine's losses on this rank's clients' training data; the runner gives all three.  A Context made by
    # hand (a test's) that leaves one out (or gives None) holds a LossNotGiven, which raises ValueError naming it
    # when called (loss_given tells them apart).
    # loss of models on the training sets of this rank's clients:
    # (models [M, P], local client index [M]) -> mean cross-entropy [M]
    pair_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(
        default_factory=lambda: LossNotGiven("pair_loss"))
    # the same losses grouped by client (faster): (models [M, P], peers [C, m] indices
    # into models) -> [C, m], row c on this rank's client c's training set
    pool_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(
        default_factory=lambda: LossNotGiven("pool_loss"))
    # the loss of each own client's model on each of its training examples: models [C, P] -> [C, N], +inf at a
    # padding position (fedclust.engine.train.sample_losses)
    sample_loss: Callable[[torch.Tensor], torch.Tensor] = field(default_factory=lambda: LossNotGiven("sample_loss"))
    # pair_loss on the validation split instead (fedclust.data.validation: data.validation, or the algorithm's
    # validation_share): (models [M, P], local client index [M]) -> mean cross-entropy [M] on client owner[m]'s
    # held-out examples; given by the runner only where a split is carved (DPFL's rewards), a LossNotGiven else
    val_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = field(
        default_factory=lambda: LossNotGiven("val_loss"))
    # gradients on chosen training examples: (models [M, P], local client index [M], examples [M, B] positions in
    # client owner[m]'s training rows, weights [M, B]) -> [M, P], the gradient of Σ_b weights[m, b]·CE(models[m];
    # example examples[m, b]) (fedclust.engine.train.batch_grads; CoBo's gradients at midpoints); the runner gives it
    batch_grad: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] = field(
        default_factory=lambda: LossNotGiven("batch_grad"))
    # [C] int64: the training examples each own client holds, and the width N of the training data's rows
    # ([C, N, ...], padding beyond a client's examples); None / 0 where not given
    train_examples: torch.Tensor | None = None
    train_width: int = 0
    # every rank's tensor summed into it, in place, through the run's collective wrapper (a failed or stuck
    # collective becomes "rank X, round t" error); returns it.  One process: the tensor as it is.
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = lambda x: x
    # round t -> who this rank's clients can reach in round t (fedclust.network.Reach: the bool rows of their
    # graph neighbours), or None: the complete graph, every other client (config network.graph)
    reach: Callable[[int], Reach | None] = lambda t: None
    # round t -> the round's whole graph (fedclust.network.Graph, every client's neighbours), for a method whose
    # draws are made by the senders (Epidemic Learning's pushes); None: complete
    graph: Callable[[int], Graph | None] = lambda t: None
    # round t -> bool [n] (CPU), the clients online in round t, the same on every rank; None: everyone
    # (config network.p_offline, network.availability)
    online: Callable[[int], torch.Tensor | None] = lambda t: None
    # round t -> what arrives at this rank's clients in round t (fedclust.network.Delivery: online senders, lost
    # models); None: every model sent arrives (config network.p_offline, network.availability, network.p_drop)
    delivery: Callable[[int], Delivery | None] = lambda t: None
    # flat columns (start, stop) every client keeps to itself (config share.personal): the gossip of a peer method
    # averages the others; () shares everything
    personal: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        for name in (*LOSS_FUNCTIONS, "val_loss", "batch_grad"):   # None (a test's "not given") reads as not given
            if getattr(self, name) is None:
                setattr(self, name, LossNotGiven(name))

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


BLOCKS_NOT_WHOLE = ("the round's models came in column blocks (exchange_mb), not whole: an algorithm that reads "
                    "whole models (view.all_after, view.all_before, view.whole_after()) leaves column_exchange False, "
                    "and the config check then refuses exchange_mb for it; one that declares column_exchange = True "
                    "reads them through view.blocks()")


class RoundView:
    """What the round's single all-gather makes visible.  Every client's
    models are read through :meth:`blocks`, whether the exchange brought
    them whole (one block) or a column block at a time (config
    ``exchange_mb``; ``columns`` then reads them, one gather a block).
    :attr:`all_after` and :attr:`all_before` are the whole models, for an
    algorithm that does not declare ``column_exchange``: ValueError when the
    round came in blocks."""

    def __init__(self, round: int, before: torch.Tensor | None, after: torch.Tensor,
                 all_after: torch.Tensor | None = None, all_before: torch.Tensor | None = None,
                 all_labels: torch.Tensor | None = None, columns: ColumnReader | None = None,
                 all_loss: torch.Tensor | None = None) -> None:
        self.round = round                # 1-based
        self.before = before              # [C, P] this rank's models before local training (gathers_before only)
        self.after = after                # [C, P] after local training
        self._all_after = all_after       # [n, P] every client's model after local training (None: in blocks)
        self._all_before = all_before     # [n, P], only if the algorithm sets gathers_before (None: in blocks)
        self.all_labels = all_labels      # [n] int64 every client's RoundPlan.labels (gathers_labels only)
        # The exchange in column blocks (config exchange_mb); None: the models came whole.
        self.columns = columns
        self._all_loss = all_loss         # [n] every client's mean training loss this round (NaN: it did not train)

    def __repr__(self) -> str:
        how = "whole" if self.whole else "in column blocks"
        return f"RoundView(round={self.round}, {len(self.after)} own clients, models {how})"

    @property
    def whole(self) -> bool:
        """The models came whole (all_after, all_before), not in column blocks."""
        return self.columns is None

    @property
    def width(self) -> int:
        """P, the columns of a model."""
        return int(self.columns.width if self.columns is not None else self.after.shape[1])

    @property
    def all_after(self) -> torch.Tensor:
        """``[n, P]`` every client's model after local training, for an algorithm that reads whole models (it
        leaves ``column_exchange`` False); ValueError when the round came in column blocks (``exchange_mb``)."""
        if self.columns is not None:
            raise ValueError(BLOCKS_NOT_WHOLE)
        if self._all_after is None:
            raise ValueError("the round's view holds no models after training (a RoundView made by hand, a "
                             "test's, gives all_after=)")
        return self._all_after

    @property
    def all_before(self) -> torch.Tensor | None:
        """``[n, P]`` every client's model before local training (None: the algorithm does not set
        ``gathers_before``, or the gossip has let go of them); ValueError when the round came in column blocks."""
        if self.columns is not None:
            raise ValueError(BLOCKS_NOT_WHOLE)
        return self._all_before

    @property
    def all_loss(self) -> torch.Tensor:
        """``[n]`` every client's mean training loss this round, as each reported it in the round's gather (NaN
        where a client did not train: not a participant, offline), the same on every process; whole or in column
        blocks alike.  ValueError on a RoundView made by hand without it (a test's: ``all_loss=``)."""
        if self._all_loss is None:
            raise ValueError("the round's view holds no training losses (a RoundView made by hand, a test's, gives "
                             "all_loss=)")
        return self._all_loss

    @all_loss.setter
    def all_loss(self, value: torch.Tensor) -> None:
        self._all_loss = value

    def whole_after(self) -> torch.Tensor:
        """:attr:`all_after` ([n, P], every client's model after local training), for an algorithm that reads
        whole models; ValueError when the exchange came in column blocks (refused by the config checks for an
        algorithm that does not declare ``column_exchange``)."""
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
        whole = {"after": self._all_after, "before": self._all_before}
        got = {k: whole.get(k) for k in names}
        missing = [k for k, v in got.items() if v is None]
        if missing:
            raise ValueError(f"the round's gather holds no {missing[0]!r} models: an algorithm that reads them "
                             "declares gathers_before")
        yield 0, self.width, {k: v for k, v in got.items() if v is not None}

    def drop_before(self) -> None:
        """Let go of the models from before training (the gossip needs only the new ones): one [n, P] less, or
        one [C, P], at the gossip's peak."""
        self.before = self._all_before = None
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
    # local training in phases: ((epochs, names of the tensors kept frozen), ...), one momentum buffer throughout
    # (fedclust.engine.train.train_round); the round trains the phases' epochs in all.  None: train.local_epochs
    # epochs of every tensor
    phases: tuple[tuple[int, tuple[str, ...]], ...] | None = None
    # bool [C, N]: the training examples each own client trains on this round (FedSPD's examples of one cluster);
    # the round trains on those alone, shuffled as a client of that many examples; a client with none does not
    # train.  None: all its examples
    samples: torch.Tensor | None = None


@dataclass
class RoundResult:
    """What a round leaves: the models clients hold (and are evaluated
    with), and what the metrics need."""

    models: torch.Tensor                        # [C, P] each own client's model after the round
    lists: Choice | None = None      # neighbour lists (peer-to-peer) scored by precision/recall; None: no lists
    averaged: Choice | None = None   # whom each own client averaged with this round (stage-one counts)
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

    The contract, in the order the run calls it:

    1. :meth:`check` (and :meth:`check_run`) refuse a config the algorithm
       cannot run with, before any data is read or process group starts;
    2. :meth:`from_config` builds the object from the validated config;
    3. :meth:`init` gives the state before round 1 (or :meth:`load_state_dict`
       the state of a checkpoint);
    4. each round, on every process: :meth:`plan` (what each client trains
       from) -> the engine trains, and the round's one gather runs ->
       :meth:`aggregate` (what each client holds after the round);
    5. when a round is evaluated: :meth:`report_models` (the models scored),
       :meth:`extra_accuracy`; at a checkpoint: :meth:`state_dict`.

    An algorithm never touches the transport: every client's models come in
    the :class:`RoundView` (:meth:`RoundView.blocks`), a sum over processes
    is ``ctx.all_reduce``, and what it needs of the model or the machine is
    in :class:`RunFacts`.  Every method runs on every process with that
    process's clients (``ctx.client_ids``, C of them) and must give every
    process the same server state: draws come from :mod:`fedclust.rng`,
    keyed on (seed, round, client).

    Its declarations, class attributes read by the config checks, the
    runner, the figures and the report (none is a name in a central list),
    are typed and explained where they are declared, below.
    """

    # The `algorithm.name` that selects it.
    name: ClassVar[str] = ""
    # {section name: dataclass} of its config keys.  Each field is declared once there (fedclust.schema.option:
    # default, meaning, Literal choices), and the dataclass's validate(self, cfg) is its one check, raising
    # ConfigError with the real key ("fpfc.lam").  A section may be shared by name.  from_config hands the object
    # the section instances themselves, held under the section's name and read as self.fpfc.lam.
    sections: ClassVar[dict[str, type]] = {}
    # It uses algorithm.k / algorithm.l / a stage one of stage1_rounds rounds (checked by check).
    needs_k: ClassVar[bool] = False
    needs_l: ClassVar[bool] = False
    needs_stages: ClassVar[bool] = False
    # Each round it draws l candidates and keeps the top k of them, so it needs l >= k.
    keeps_k_of_l: ClassVar[bool] = False
    # The round's gather also carries the models before local training (view.all_before): twice the exchange.
    # (An instance attribute: a plug-in may set it from its config.)
    gathers_before: bool = False
    # Numbers it keeps per client between rounds beyond the model it trains (DFCA's bank of k models, k·P;
    # Facade's k heads, k·H): the growth law of fedclust bench-scale counts them twice, the kept ones and the
    # round's new ones.  (An instance attribute, set from the config and the model.)
    kept_numbers: int = 0
    # It honours share.personal (a personal part of the model the gossip leaves alone): the peer methods whose
    # aggregate is PeerAlgorithm's.
    personal_layers: ClassVar[bool] = False
    # Bytes it keeps per client pair, replicated on every process (DAC's score tables: 5): the growth law counts
    # them twice, the kept tables and the round's new ones.
    pair_bytes: ClassVar[int] = 0
    # Its plan gives labels, a number per client below 2^24 that the gather carries as one more column
    # (view.all_labels: a client's cluster, say).
    gathers_labels: ClassVar[bool] = False
    # Its aggregate reads the gathered models only through view.blocks, never a whole model of another client,
    # so the exchange may come in column blocks (config exchange_mb).  An algorithm opts in: False by default,
    # a PeerAlgorithm's too (its gossip reads blocks, but its select may read view.all_after); with False the
    # config check refuses exchange_mb for it, and view.all_after / all_before are always there.
    column_exchange: ClassVar[bool] = False
    # "peer": clients average with peers (PeerAlgorithm); "server": a server aggregates.
    topology: ClassVar[Literal["peer", "server"]] = "server"
    # Its round's neighbour choice holds bool [C, n] masks (PANM, PENS: lists that may hold a whole cluster);
    # False for index lists of a few peers (PeerIndex) or none.  The growth law of fedclust bench-scale reads it.
    choice_masks: ClassVar[bool] = False
    # Stage-one similarity and precision figures apply (its state keeps similarity_client0).
    stage_one_figures: ClassVar[bool] = False
    # {(data, cluster kind or None, clusters): (mean, std)}: the accuracy a paper reports, which fedclust report
    # prints beside the run's; report_position: its row in that table (lower first).
    paper_results: ClassVar[dict[tuple[str, str | None, int], tuple[float, float]]] = {}
    report_position: ClassVar[float] = 1000.0
    # Record keys of extra_accuracy, each in every evaluated round's record (null where the method gives none)
    # and, as final_<key>, in summary.json; none by default (the record is unchanged).
    extra_accuracies: ClassVar[tuple[str, ...]] = ()
    # The config key of validation_share, named by the errors about it.
    validation_key: ClassVar[str] = ""
    # The key of the number of clusters (models, heads, groups) it looks for ("ifca.clusters"); a run whose data
    # has another known number of clusters is warned at start.  "": it takes no such number.
    cluster_count_key: ClassVar[str] = ""

    @classmethod
    def from_config(cls, cfg) -> "Algorithm":
        """Build the algorithm for a run.

        Parameters: ``cfg``, the validated config (:meth:`check` has
        passed); one that needs the model (its layout, its default init) or
        the run's processes takes a second parameter, ``facts``
        (:class:`RunFacts`), and gets them.

        Returns the algorithm object holding its sections as they are and the
        core keys it uses as values.  It keeps no per-run tensors: those
        belong in the state (:meth:`init`)."""
        raise NotImplementedError(f"{cls.__name__} must define from_config(cfg)")

    @classmethod
    def check(cls, cfg) -> None:
        """Refuse a config this algorithm cannot run with, before anything starts.

        Parameters: ``cfg``, the parsed config (core keys already checked).

        Raises :class:`fedclust.errors.ConfigError` naming the key, the value
        and the fix.  The default checks the declared needs (``needs_k``,
        ``needs_l``, ``keeps_k_of_l``, ``needs_stages``), then each section's
        choices and ``validate``; override to add more (call super)."""
        a, n = cfg.algorithm, cfg.clients
        if cfg.train.init == "per_client" and cls.topology != "peer":
            raise ConfigError("train.init", "per_client", f"{cls.name} is a server method: every client starts a "
                              "round from the server's model, so an initial model a client is undone at once; use "
                              "train.init=common")
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
    def phase_marks(cls, cfg) -> list[tuple[int, str]]:
        """The rounds after which a new phase of the run starts, each with its legend label, for the figures
        (``accuracy.png`` draws a dashed line halfway between round R and R + 1 for each ``(R, label)``).

        Parameters: ``cfg``, the validated config.  Default: for a method that declares ``needs_stages``,
        ``[(stage1_rounds, "stage two from round T1+1")]`` where stage two starts before the last round; none
        otherwise.  Override to mark another method's phases (FedSPD: its fine-tuning)."""
        t1 = cfg.stage1_rounds
        if not cls.needs_stages or t1 is None or int(t1) >= int(cfg.rounds):
            return []
        return [(int(t1), f"stage two from round {int(t1) + 1}")]

    @classmethod
    def check_run(cls, cfg, facts: RunFacts) -> None:
        """Refuse a config whose run cannot fit this machine, before any data is read.

        Parameters: ``cfg``, the validated config; ``facts``, the model and
        the processes (:class:`RunFacts`).  Raises ConfigError (FPFC: its
        pairwise state would not fit the free memory).  Default: nothing."""

    # -- the round -------------------------------------------------------

    def init(self, ctx: Context) -> State:
        """The state before round 1.

        Parameters: ``ctx``, this process's facts (:class:`Context`).

        Returns a dataclass whose per-client fields are :func:`client_rows`
        (``[C, ...]``, this process's clients), fields read only in the round
        that sets them :func:`round_only`, the others server state, the same
        on every process; or None (stateless)."""
        return None

    def plan(self, state: State, ctx: Context, round_: int, models: torch.Tensor) -> tuple[State, "RoundPlan"]:
        """What each of this process's clients trains from in round ``round_`` (1-based).

        Parameters: ``state``, the state after the last round; ``ctx``;
        ``round_``; ``models`` ``[C, P]``, what the clients hold.

        Returns (the new state, a :class:`RoundPlan`: the models training
        starts from, a proximal centre and weight, the clients that train,
        the labels the gather carries).  Default: every client trains the
        model it holds."""
        return state, RoundPlan(start=models)

    def aggregate(self, state: State, ctx: Context, view: RoundView) -> tuple[State, "RoundResult"]:
        """What each of this process's clients holds after the round.

        Parameters: ``state`` (after :meth:`plan`); ``ctx``; ``view``, what
        the round's one gather makes visible (:class:`RoundView`: this
        process's models before and after training, every client's through
        :meth:`RoundView.blocks`, and the gathered labels).

        Returns (the new state, a :class:`RoundResult`: the ``[C, P]`` models
        the clients hold and are evaluated with, and what the metrics need:
        neighbour lists or a cluster assignment, the models received).  A
        server algorithm builds it with :func:`server_result`; a
        :class:`PeerAlgorithm` defines :meth:`PeerAlgorithm.select`
        instead."""
        raise NotImplementedError(f"{type(self).__name__} must define aggregate (or derive from PeerAlgorithm)")

    # -- data and evaluation hooks ---------------------------------------

    @property
    def validation_share(self) -> float:
        """Share of each client's training examples held out as its validation
        split (:func:`fedclust.data.validation.carve_validation`, never trained
        on); 0 by default: every example trains."""
        return 0.0

    def extra_accuracy(self, state: State, ctx: Context, data: Any, models: torch.Tensor, accuracy: torch.Tensor,
                       score: Callable) -> dict[str, torch.Tensor]:
        """More test accuracies of this rank's clients for an evaluated round:
        ``{key in extra_accuracies: [C] accuracy in [0, 1]}`` (a key left out
        is null).  ``data``: this rank's FederatedData; ``models [C, P]`` what
        the clients hold and ``accuracy [C]`` its test accuracy;
        ``score(models [M, P], x, y, counts)`` -> (accuracy [M], mean loss
        [M]) of model m on x[m], y[m].  Every rank must give the same keys
        (their columns travel in the round's one gather).  Default: none."""
        return {}

    def report_models(self, state: State, ctx: Context, data: Any, models: torch.Tensor,
                      score: Callable) -> torch.Tensor:
        """The models an evaluated round scores for this rank's clients (the record's accuracy and loss, the
        validation accuracy, the accuracy given to :meth:`extra_accuracy`): ``[C, P]``.  ``models``, ``data`` and
        ``score`` as :meth:`extra_accuracy` takes them.  Default: ``models``, what the clients hold; a method that
        reports another model of its own (Facade's ``facade.report_head=lowest_test_loss``) returns it.  Training
        goes on from the held models either way."""
        return models

    def unseen_candidates(self, saved: dict, weights: torch.Tensor) -> torch.Tensor:
        """The models a client the run never saw may take (``fedclust evaluate --unseen``, FLUX's unseen-client
        protocol: the one of lowest loss on the first half of its examples, scored on the rest).

        Parameters: ``saved``, the method's state as a checkpoint holds it (:meth:`state_dict`'s ``{"clients":
        {field: [n, ...]}, "server": {field: value}}``, every client's rows, on the CPU); ``weights``, ``[n, P]``
        every client's model.  Returns ``[M, P]``.  Default: the clients' models (a peer method's peers: the
        new client has no model for a similarity that needs one, so its lowest loss stands in); a method with
        models of its own (cluster models, banks, heads) gives those."""
        return weights

    # -- checkpoints -----------------------------------------------------

    def state_dict(self, state: State) -> dict:
        """The state as a checkpoint saves it.

        Returns ``{"clients": {field: [C, ...] rows}, "server": {field:
        value}}``: the checkpoint gathers the rows of every process in
        global client order and saves the server state once.  Default: the
        state dataclass's fields as :func:`client_rows` marks them."""
        rows, server = split_state(state)
        return {"clients": rows, "server": server}

    def upgrade_state(self, clients: dict, server: dict, n: int) -> None:
        """Bring the algorithm's state in a checkpoint of an earlier version to today's form, in place (a
        dropped field, a changed layout): :func:`fedclust.upgrade.checkpoint` calls it before
        :meth:`load_state_dict`, on every process alike.

        Parameters: ``clients``, ``{field: [n, ...] rows}`` of every client in global client order (bool masks
        packed as checkpoints hold them, :func:`fedclust.peers.pack_bits`), and ``server``, ``{field: value}``,
        both as saved (dicts of the caller's own, whose tensors are the checkpoint's: replace an entry, never
        write into its tensor); ``n``, the run's clients.  Each step leaves a state already in today's form as
        it is.  Default: nothing (the state has never changed form)."""

    def load_state_dict(self, ctx: Context, saved: dict) -> State:
        """The state of a checkpoint, on a run of any number of processes.

        Parameters: ``ctx``; ``saved``, :meth:`state_dict`'s output in
        today's form (:func:`fedclust.upgrade.checkpoint` has converted an
        older one), ``saved["clients"]`` holding only ``ctx.client_ids``'
        rows, on ``ctx.device``.

        Returns the state; refuses (ValueError) a field the state does not
        know."""
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


class ServerMethod(Algorithm):
    """A server algorithm whose fields are its config sections, each named as its section, and
    ``participation`` (config ``participation``, the share of clients that train a round): :meth:`from_config`
    builds it from those keys (FedAvg, FedProx, CFL, FedGroup, FedGrouProx)."""

    @classmethod
    def from_config(cls, cfg) -> "Algorithm":
        build: Callable[..., Algorithm] = cls
        return build(participation=cfg.participation, **{section: getattr(cfg, section) for section in cls.sections})


def keep_rows(old: State, new: State, keep: torch.Tensor) -> State:
    """``new`` with the per-client rows (:func:`client_rows` fields) of the
    clients where ``keep`` (bool ``[C]``) holds taken from ``old``: what a
    client offline in the round leaves of the state (it did nothing).
    Server state is ``new``'s."""
    if new is None or not bool(keep.any()):
        return new
    changes = {}
    for f in dataclasses.fields(new):
        if not _is_client_field(f):
            continue
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a is None or b is None:
            continue
        if a.shape != b.shape:
            raise ValueError(f"state field {f.name!r} changed shape in a round ({tuple(a.shape)} -> "
                             f"{tuple(b.shape)}): an offline client's row cannot be kept")
        k = keep.to(b.device).view(-1, *([1] * (b.dim() - 1)))
        changes[f.name] = torch.where(k, a, b)
    return dataclasses.replace(new, **changes)


def keep_personal(models: torch.Tensor, own: torch.Tensor, personal: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """``models [C, P]`` with the ``personal`` column ranges taken from ``own`` (each client's trained model): a
    personal head the gossip does not touch.  In place; returns ``models``."""
    for a, b in personal:
        models[:, a:b] = own[:, a:b].to(models.dtype)
    return models


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

    topology: ClassVar[Literal["peer", "server"]] = "peer"
    choice_masks: ClassVar[bool] = True   # a select that returns a PeerIndex sets False
    personal_layers = True   # the base aggregate keeps ctx.personal's columns as each client trained them

    def select(self, state: State, ctx: Context, view: RoundView) -> tuple[State, Choice]:
        """Whom each of this process's clients averages with this round.

        Parameters: ``state``; ``ctx``; ``view`` (:meth:`Algorithm.aggregate`).

        Returns (the new state, the choice: a bool ``[C, n]`` mask, or a
        :class:`fedclust.peers.PeerIndex` of a few peers each, never the
        client itself).  The gossip average of the chosen peers' models and
        the client's own is done for it."""
        raise NotImplementedError(f"{type(self).__name__} must define select")

    def neighbor_list(self, state: State, averaged: Choice) -> Choice:
        """The neighbour list scored by precision and recall (either form); default: this round's ``averaged``."""
        return averaged

    def contacted(self, state: State, round_: int) -> torch.Tensor | None:
        """Bool [C, n]: peers whose models a client fetched this round beyond
        those it averages with (e.g. to rank candidates); default: none."""
        return None

    def aggregate(self, state: State, ctx: Context, view: RoundView) -> tuple[State, RoundResult]:
        before = state
        state, averaged = self.select(state, ctx, view)
        averaged = within(averaged, ctx.reach(view.round))   # only from this round's graph neighbours
        delivery = ctx.delivery(view.round)
        averaged = delivered(averaged, delivery)   # nothing lost, nothing from or for a client offline
        contacted = self.contacted(state, view.round)
        if delivery is not None:   # an offline client chose nothing and fetched nothing: its state is as it was
            own_online = delivery.own_online().to(ctx.device)
            state = keep_rows(before, state, ~own_online)
            if contacted is not None:
                contacted = delivery.answering(contacted) & own_online[:, None]
        view.drop_before()
        own_ids = ctx.client_ids
        received = received_models(averaged, contacted, own_ids)
        return state, RoundResult(
            models=keep_personal(gossip_view(averaged, own_ids, view), view.after, ctx.personal),
            lists=self.neighbor_list(state, averaged),
            averaged=averaged,
            received=received,
        )


@dataclass
class KPeers(PeerAlgorithm):
    """A peer method whose one field is ``algorithm.k``, the peers each client averages with, chosen as index
    lists (Random, Oracle, FixTopology).  It reads no model of another client: the gossip average is column by
    column, so the exchange may come in column blocks."""

    k: int   # algorithm.k

    needs_k = True
    choice_masks = False      # its choice is k index lists a client (fedclust.peers.PeerIndex)
    column_exchange = True    # the gossip average reads the models through view.blocks

    @classmethod
    def from_config(cls, cfg) -> "KPeers":
        return cls(k=cfg.algorithm.k)
