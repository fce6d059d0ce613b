"""The config schema: typed dataclasses of the core sections, the sections
algorithms declare (registered by :mod:`fedclust.algorithms.registry`),
and the checks of the core keys.

Each key is described once, by the docstring under its field (as in
torchtitan's ``JobConfig``): its first paragraph is the one-line meaning
``fedclust check --keys`` prints, the whole docstring the config reference's
(docs/config.md, Markdown).  A plug-in's section may describe its keys so, or
with :func:`option`'s ``help`` (and ``doc``).  A ``Literal`` type lists a
key's choices.  Each section checks its own ranges (``validate(self, cfg)``);
every error names the field, the bad value and the fix.

Reading a config file and overrides (and writing config.yaml) is
:mod:`fedclust.configfile`'s, above this module (:mod:`fedclust.config`
re-exports both).  This module imports nothing of fedclust but errors: algorithms add their sections
to it (:func:`register_section`), and :mod:`fedclust.config` loads and
validates a whole config.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import math
import re
import textwrap
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from fedclust.errors import ConfigError


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING,
           resumable: bool = False, doc: str = "") -> Any:
    """A config field with its default (or ``factory`` for a list) and its
    one-line meaning, the text ``fedclust check --keys`` prints: the form of
    a plug-in's section (the core sections give each field a docstring
    instead, which a plug-in's may too, with :func:`resumable` where it
    needs the flag).  ``resumable``: the key may change when a run continues
    from a checkpoint (run length and outputs: it changes no result of the
    rounds already run); any other key must keep the checkpoint's value.
    ``doc``: the fuller meaning the config reference (docs/config.md,
    generated) gives instead of ``help`` (Markdown, links relative to
    docs/).  A field whose type is a ``Literal`` takes one of its values
    (:func:`check_choices`)."""
    if not help:
        raise ValueError("every config key needs a one-line meaning (help=...)")
    return field(default=default, default_factory=factory,
                 metadata={"help": help, "resumable": resumable, "doc": doc})


def resumable(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING) -> Any:
    """A config field that may change when a run continues from a checkpoint
    (run length and outputs: it changes no result of the rounds already run),
    with its default (or ``factory``); its meaning is the docstring under it."""
    return field(default=default, default_factory=factory, metadata={"resumable": True})


# Seeds key counter-based draws by their low 32 bits (fedclust.rng hashes seed * an odd constant mod 2**32),
# so a larger seed would repeat the draws of a smaller one.
SEED_LIMIT = 2**32


# Choice fields: each a Literal, whose values check_choices accepts and fedclust check --keys lists.
ClusterKind = Literal["rotation", "label_swap"]
Partition = Literal["iid", "dirichlet", "shards"]   # fedclust.data.skew.PARTITIONS
SyntheticInputs = Literal["client", "shared"]
Normalize = Literal["standard", "unit", "symmetric"]
WandbMode = Literal["", "online", "offline", "disabled"]
Engine = Literal["auto", "batched", "loop"]
Precision = Literal["default", "fp32", "tf32"]   # fedclust.engine.precision
Device = Literal["auto", "cpu", "cuda"]
ResumeMode = Literal["auto", "never", "require"]
GraphKind = Literal["complete", "ring", "regular", "erdos_renyi", "small_world", "file"]
AttackKind = Literal["sign_flip", "gaussian", "label_flip"]
JoinInit = Literal["initial", "peer"]   # fedclust.network.Join
InitKind = Literal["common", "per_client"]
PRECISIONS = typing.get_args(Precision)


# ----------------------------------------------------------------------------
# The checks a section's validate makes: each refuses a value naming the key, the value and the fix.

# Words people write for an allowed value, by key (difflib alone would take "gpu" for "cpu"); a model's are
# declared by the model (fedclust.models.base.BuiltinModel.aliases).
ALIASES: dict[str, dict[str, str]] = {
    "device": {"gpu": "cuda", "cuda:0": "cuda", "nvidia": "cuda", "cpu:0": "cpu", "host": "cpu"},
    "resume": {"true": "auto", "yes": "auto", "on": "auto", "continue": "auto", "false": "never", "no": "never",
               "off": "never", "always": "require", "must": "require"},
    "wandb.mode": {"off": "disabled", "none": "disabled", "false": "disabled", "no": "disabled", "local": "offline",
                   "on": "online", "cloud": "online", "true": "online"},
}


def suggest(path: str, value: Any, allowed, aliases: dict[str, str] | None = None) -> str | None:
    """The allowed value closest to ``value``: a known synonym (``aliases``, else :data:`ALIASES`),
    the same word in another case, else difflib's closest."""
    words = [str(a) for a in allowed]
    text = str(value).strip()
    alias = (aliases if aliases is not None else ALIASES.get(path, {})).get(text.lower())
    if alias in words:
        return alias
    for w in words:
        if w and w.lower() == text.lower():
            return w
    close = difflib.get_close_matches(text, words, n=1)
    return close[0] if close else None


def one_of(path: str, value: Any, allowed, why: str = "", aliases: dict[str, str] | None = None) -> None:
    """Refuse a value outside ``allowed``, naming the closest allowed one and, if given, what the key means."""
    if value not in allowed:
        close = suggest(path, value, allowed, aliases)
        hint = f" (did you mean '{close}'?)" if close else ""
        raise ConfigError(path, value, f"must be one of {sorted(allowed)}{hint}" + (f": {why}" if why else ""))


def finite(path: str, value, fix: str, low: float = 0.0, strict: bool = True) -> None:
    """Refuse a value that is not a finite number above ``low`` (or at least ``low`` when not strict)."""
    v = float(value)
    if not math.isfinite(v) or v < low or (strict and v == low):
        raise ConfigError(path, value, fix)


def at_least(path: str, value: int, low: int, fix: str) -> None:
    """Refuse a whole number below ``low``."""
    if value < low:
        raise ConfigError(path, value, f"must be >= {low}: {fix}")


def within(path: str, value: float, interval: str, why: str) -> None:
    """Refuse a number outside ``interval``, written as the message and the key's docstring write it:
    ``"(0, 1]"``, ``"[0, 0.5)"`` (a parenthesis leaves its bound out).  The fix is ``must lie in INTERVAL``,
    then ``why`` after a colon (or a space, where ``why`` opens a parenthesis)."""
    low, high = (float(end) for end in interval[1:-1].split(","))
    v = float(value)
    above = low < v if interval[0] == "(" else low <= v
    below = v < high if interval[-1] == ")" else v <= high
    if not (above and below):   # NaN is neither
        raise ConfigError(path, value, f"must lie in {interval}" + (f" {why}" if why.startswith("(") else f": {why}"))


WANDB_PROJECT_CHARS = "/\\#?%:"   # W&B refuses a project name holding any of these, or longer than 128


# ----------------------------------------------------------------------------
# The core sections.  Under each field, its docstring: the first paragraph is the meaning fedclust check --keys
# prints (its final full stop left out), the whole the config reference's (Markdown, links relative to docs/).


@dataclass
class AlgorithmConfig:
    """Which algorithm runs, and the neighbours of the peer-to-peer ones."""

    name: str = "local"
    """the algorithm, by name: a built-in or a plug-in's (`fedclust check --keys` lists them).

    See the tables in [What fedclust does](what-it-does.md), and each method in [The algorithms](algorithms.md).
    """
    k: int = 5
    """neighbours a peer-to-peer client averages with per round, at most `clients − 1`."""
    l: int = 10   # noqa: E741 (the papers' l)
    """candidates drawn per round (PANM, PENS), at most `clients − 1`; at least `algorithm.k`, since they keep
    the top `k` of the `l` drawn (with fewer, round 1 gives only `l` neighbours)."""

    def validate(self, cfg: Config) -> None:
        """None here: the algorithm checks its name, k and l against the clients
        (:meth:`fedclust.algorithms.base.Algorithm.check`, called by :func:`fedclust.config.validate`)."""


@dataclass
class DataConfig:
    """The data set and how it is dealt to the clients and their clusters (fedclust.data)."""

    name: str = "fmnist"
    """data set: `mnist`, `fmnist`, `cifar10`, `synthetic`, `npz` (your arrays, `data.path`),
    `torchvision:NAME` (e.g. `torchvision:KMNIST`), `leaf` and `hf` (naturally federated clients: LEAF's JSON
    folder, a saved Hugging Face data set; `data.path`), or a plug-in's.

    See [Your own data set](own-model-and-data.md#your-own-data-set).
    """
    root: str = "data"
    """folder of the data sets (torchvision layout, or the four Fashion-MNIST IDX files)."""
    clusters: ClusterKind = "rotation"
    """what sets image clusters apart: `rotation` or `label_swap` (`synthetic`: each cluster's own (W, b))."""
    num_clusters: int = 2
    """latent clusters, any number `>= 1` (`1`: no transform, plain federated learning); `rotation`: evenly
    spaced angles unless `data.rotations`; `label_swap`: the papers' pairs for 2 or 4, else a fixed permutation
    a cluster.

    `rotation` turns cluster c of C by `360°·c/C` (the papers' 0°/180° and 0°/90°/180°/270°); `label_swap`
    keeps cluster 0's labels under a count other than 2 or 4 (see [Common ground](algorithms.md#common-ground));
    a file of your own clients: the number of clusters in its `cluster` array. `data.cluster_sizes` and
    `data.rotations` must give as many entries.
    """
    cluster_sizes: list[int] = field(default_factory=list)
    """clients of each cluster in order, contiguous blocks: whole numbers `>= 1`, one a cluster (as many as
    `data.num_clusters`), summing to `clients`; `[]`: near-equal blocks.

    Cluster 0 is the first `cluster_sizes[0]` clients, cluster 1 the next `cluster_sizes[1]`, ... (DAC's
    `[70,20,5,5]`). Pools and `synthetic`; a file of your own clients has its own clusters. See [Common
    ground](algorithms.md#common-ground).
    """
    rotations: list[float] = field(default_factory=list)
    """`data.clusters=rotation`: each cluster's angle in degrees, counter-clockwise (as many as
    `data.num_clusters`); multiples of 90 exact, other angles bilinear with zero fill; `[]`: evenly spaced,
    `360°·c/C` for cluster c of C.

    Images turn about their centre (DAC's angles: `[0,180,10,350]`); the even spacing is the papers'
    0°/180° for 2 clusters, 0°/90°/180°/270° for 4. See [Common ground](algorithms.md#common-ground).
    """
    train_size: int = 200
    """training samples per client (class-balanced), `>= 1`; ignored by a file of your own clients."""
    test_size: int = 100
    """test samples per client, `>= 1`; ignored by a file of your own clients."""
    validation: float = 0.0
    """share of each client's training examples held out for validation (never trained on), in `[0, 1)`;
    `> 0`: the summary adds each client's test accuracy at its best-validation round.

    Every record then adds the validation accuracy, and the summary each client's test accuracy at the round of
    its best validation accuracy (`best_validation_accuracy`, `best_validation_rounds`). See
    [Reports](reports.md#the-model-you-would-deploy).
    """
    normalize: Normalize = "standard"
    """how an image pool's inputs are scaled before training: `standard` (per channel, minus the training
    split's mean, divided by its std), `unit` (to [0, 1] only: x / 255, as IFCA's code) or `symmetric` (to [-1, 1]:
    (x / 255 - 0.5) / 0.5, as PENS's code).

    A pool only (`fmnist`, `mnist`, `cifar10`, `torchvision:NAME`, `npz`; a file's inputs are taken as already in
    [0, 1]: `unit` leaves them as stored); refused for data that makes its own inputs (`synthetic`). The export
    records the rule it ran. See [The PANM paper's unknowns](algorithms.md#the-panm-papers-unknowns).
    """
    partition: Partition = "iid"
    """how a pool's examples are dealt to clients: `iid` (class-balanced), `dirichlet` (label proportions from
    Dir(`data.alpha`)) or `shards` (McMahan et al.'s: sorted by label, `data.shards_per_client` shards a
    client); within each cluster, before its transform.

    `iid` is the papers' split; `dirichlet` draws each client's label proportions (Hsu et al.'s per-client
    draw); `shards` is McMahan et al.'s pathological split, the examples sorted by label and cut into
    `clients · data.shards_per_client` shards. Combines with any `data.clusters` and `data.num_clusters`
    (`data.num_clusters=1`: plain federated learning). See
    [Partitions](algorithms.md#partitions-label-and-quantity-skew).
    """
    alpha: float = 0.5
    """`data.partition=dirichlet`: the concentration alpha of each client's label proportions Dir(alpha·1), a
    finite number `> 0` (small: a few classes a client; large: near iid).

    0.1 gives mostly one or two classes a client, 100 near class-balanced ones; refused with another partition.
    """
    shards_per_client: int = 2
    """`data.partition=shards`: shards each client takes (McMahan et al.: 2), `>= 1` and at most
    `data.train_size` (a shard holds at least one example); refused with another partition."""
    quantity_skew: float = 0.0
    """`0`: every client `data.train_size` training examples; `a > 0` (finite): sizes from a power law of tail
    exponent a (smaller a, more skew), mean `data.train_size`, at least `min(10, data.train_size)` each.

    Each client's share of the examples above a floor is in proportion to a Pareto draw of tail exponent a
    (`P(x > s) = s^−a`: the smaller a, the more a few clients hold; at `a <= 1` one client may hold most), each
    client at least `min(10, data.train_size)` (and `data.shards_per_client`), summing to
    `clients · data.train_size` (with `data.share_images`, a client capped at the split's size); test sets keep
    `data.test_size`. Any `data.partition`. See [Partitions](algorithms.md#partitions-label-and-quantity-skew).
    """
    share_images: bool = False
    """allow one image on several clients (runs of thousands of clients)."""
    drift_round: int = 0
    """`0`: no drift; a round `t` in `[2, rounds]`: at round t a share `data.drift_fraction` of each cluster's
    clients moves to another cluster, its training and test data under that cluster's transform from then on.

    The moved clients and their new clusters are drawn from (seed, t, client); the same examples, the new
    cluster's transform. Pools only (`data.clusters` transforms), `data.num_clusters >= 2`. Several events:
    `data.drift_rounds`. See [Drift](algorithms.md#drift-clients-that-change-cluster).
    """
    drift_rounds: list[int] = field(default_factory=list)
    """several drift events: increasing rounds in `[2, rounds]`, each moving `data.drift_fraction` of every
    current cluster (`[]`: `data.drift_round`'s one event, or none); not with `data.drift_round`.

    A client may move at several events, back to its first cluster too. See
    [Drift](algorithms.md#drift-clients-that-change-cluster).
    """
    drift_fraction: float = 0.25
    """with drift: the share of each cluster's clients that moves at an event, in `(0, 1]`; `ceil(share ·
    size)` of a cluster of `size`, so at least one a cluster."""
    download: bool = True
    """let torchvision download a missing data set."""
    options: dict = field(default_factory=dict)
    """`data.name=torchvision:NAME`: keyword arguments of the torchvision class, e.g.
    `data.options.split=balanced` for EMNIST; `leaf` and `hf`: their readers' options (`min_samples`, `shape`,
    `num_classes`; `hf`: `client_column`, `input_column`, `label_column`; `leaf`: `images`, `image_size`)
    (`{}`: none); other data sets take none (refused).

    `data.options.KEY=VALUE` sets one, `KEY=null` drops it; a file gives a mapping (`{split: balanced}`). See
    [Your own data set](own-model-and-data.md#your-own-data-set).
    """
    path: str = ""
    """`data.name=npz`: a `.npz` (or torch `.pt`) file of named arrays: `x_train`, `y_train`, `x_test`,
    `y_test` (a pool split over clients like `fmnist`), plus `client_train`, `client_test` (each example's
    client: your own clients, naturally federated) and optionally `cluster`, `num_classes`. `data.name=leaf`:
    the folder holding LEAF's `train/` and `test/`; `hf`: the folder `save_to_disk` wrote (every file under a
    folder is hashed: a resume after one changed is refused).

    With `client_train` and `client_test`, `data.train_size` and `data.test_size` are ignored. Inputs are
    normalized by `x_train`'s per-channel mean and std. See [Your own data
    set](own-model-and-data.md#your-own-data-set).
    """
    synthetic_alpha: float = 1.0
    """Synthetic(alpha, beta) of FedProx: alpha `>= 0`, std of each cluster's model mean u_k."""
    synthetic_beta: float = 1.0
    """Synthetic(alpha, beta): beta `>= 0`, std of each client's input mean B_i."""
    synthetic_dim: int = 60
    """Synthetic: input dimension, `>= 1` (FedProx: 60)."""
    synthetic_inputs: SyntheticInputs = "client"
    """Synthetic inputs: `client` (around each client's own mean, FedProx) or `shared` (all around one mean).

    `client`: each client's inputs around its own mean v_i (FedProx's generator); `shared`: every client's
    around one mean v_0, so only the cluster's (W, b) tells clients apart. Every client has `train_size`
    samples: FedProx's lognormal(4, 2) + 50 sizes are not offered by the generator (clients of unequal sizes
    come from a file of your own clients, `data.name=npz`).
    """

    def validate(self, cfg: Config) -> None:
        """None here: the data set checks its keys, with the data-set plug-ins imported
        (:func:`fedclust.data.check_data`, called by :func:`fedclust.config.validate`)."""


@dataclass
class TrainConfig:
    """Local training: SGD on each client's data every round (fedclust.engine)."""

    lr: float = 0.08
    """SGD learning rate of round 1, a finite number `> 0`."""
    lr_decay: float = 0.99
    """lr of round t is `lr * lr_decay^(t-1)`; in `(0, 1]` (1: constant)."""
    lr_decay_every: int = 1
    """decay the lr once every this many rounds, `>= 1`: lr of round t is
    `lr * lr_decay^floor((t-1)/lr_decay_every)` (1: every round).

    FPFC's official code decays by 0.9 every 5 rounds.
    """
    momentum: float = 0.9
    """SGD momentum in `[0, 1)`, buffer reset every round."""
    batch_size: int = 128
    """local minibatch size, `>= 1`."""
    local_epochs: int = 3
    """local epochs over the client's training set per round, `>= 1`."""
    init: InitKind = "common"
    """the clients' models before round 1: `common` (every client from one model, the model's default init under
    `seed`: the PANM paper's setting) or `per_client` (each client its own, the default init under a seed of (seed,
    client), as decentralizepy's DAC, DePRL, D-PSGD and Facade nodes start); `per_client` for peer-to-peer methods.

    A method's own further models (Facade's heads, DFCA's, FedSPD's and IFCA's cluster models) start as with
    `common`; only each client's model differs. See [Common ground](algorithms.md#common-ground).
    """

    def round_lr(self, t: int) -> float:
        """The lr of round t (1-based): ``lr · lr_decay^⌊(t − 1)/lr_decay_every⌋``
        (with ``lr_decay_every = 1`` the same float as ``lr · lr_decay^(t − 1)``)."""
        return self.lr * self.lr_decay ** ((t - 1) // self.lr_decay_every)

    def validate(self, cfg: Config) -> None:
        finite("train.lr", self.lr, "must be a finite number > 0 (the default: 0.08)")
        within("train.lr_decay", self.lr_decay, "(0, 1]", "lr of round t is lr * lr_decay^(t-1) (1: a constant lr; "
               "the default: 0.99)")
        at_least("train.lr_decay_every", self.lr_decay_every, 1, "rounds between two lr decays (1: every round; "
                 "FPFC's official code decays x0.9 every 5 rounds)")
        within("train.momentum", self.momentum, "[0, 1)", "(0: plain SGD; the default: 0.9)")
        at_least("train.batch_size", self.batch_size, 1, "samples per local SGD step")
        at_least("train.local_epochs", self.local_epochs, 1, "passes over a client's training set per round")


@dataclass
class NetworkConfig:
    """The communication graph of a peer-to-peer run (fedclust.network; docs/algorithms.md, "Networks")."""

    graph: GraphKind = "complete"
    """who can reach whom each round: `complete` (everyone, the papers' setting), `ring`, `regular` (random,
    `network.degree`), `erdos_renyi` (`network.p_edge`), `small_world` (Watts-Strogatz: `network.degree`,
    `network.rewire`) or `file` (`network.path`); peer-to-peer algorithms only.

    See [Networks](algorithms.md#networks-graphs-and-what-each-method-does-on-one).
    """
    degree: int = 4
    """`network.graph=regular`: each client's neighbours; `small_world`: its ring neighbours before rewiring
    (even); `>= 1`, below `clients` and at least `algorithm.k`."""
    p_edge: float = 0.1
    """`network.graph=erdos_renyi`: the probability of each edge, in `(0, 1]`."""
    rewire: float = 0.1
    """`network.graph=small_world`: the probability that a ring edge is rewired, in `[0, 1]`."""
    path: str = ""
    """`network.graph=file`: an edge list, one pair `i j` of client ids a line (networkx's `read_edgelist`); it
    must be connected, without self-loops."""
    redraw_every: int = 0
    """rounds between two graphs, `>= 0`: `0`, one graph for the whole run; T, a new graph drawn every T rounds
    (a time-varying graph), from (seed, round) alone; random graphs only (`regular`, `erdos_renyi`,
    `small_world`)."""
    p_offline: float = 0.0
    """each round each client is offline with this probability, in `[0, 1)`: it does not train, send or
    answer; a peer that chose it gets nothing from it; a server samples its participants among the online.

    See [Clients offline, lost messages, stragglers,
    attackers](algorithms.md#clients-offline-lost-messages-stragglers-attackers).
    """
    availability: str = ""
    """instead of `network.p_offline`: a `.npy` file of which clients are online in which round,
    `[R, clients]` booleans; round t reads row `(t - 1) mod R`."""
    stragglers: float = 0.0
    """each round each client is a straggler with this probability, in `[0, 1)`: its local training stops
    after `network.straggler_work` of its steps."""
    straggler_work: float = 0.5
    """the share of a round's SGD steps a straggler completes, in `(0, 1]`."""
    p_drop: float = 0.0
    """each model a client sends a peer is lost with this probability, in `[0, 1)` (keyed on seed, round,
    receiver, sender); the receiver averages what arrived; peer-to-peer algorithms only."""
    join_round: int = 0
    """late joiners: `0`, none; a round `t` in `[2, rounds]`: the `network.join_fraction` share of clients is
    absent before round t (it does not train, send, answer or count in any average, as an offline client) and
    joins at round t with the model of `network.join_init`.

    See [Late joiners](algorithms.md#late-joiners-clients-that-arrive-mid-run).
    """
    join_fraction: float = 0.0
    """with `network.join_round`: the share of clients that join late, in `(0, 1)`; the `ceil(share ·
    clients)` of lowest key (seed, client), at least one client present from the start."""
    join_init: JoinInit = "initial"
    """with `network.join_round`: the model a joiner starts from at its join: `initial` (the run's initial
    model, its own under `train.init=per_client`) or `peer` (a copy of a random present client's model, drawn
    from (seed, client))."""

    def validate(self, cfg: Config) -> None:
        at_least("network.degree", self.degree, 1, "neighbours of each client in the graph")
        within("network.p_edge", self.p_edge, "(0, 1]", "the probability of each edge of an erdos_renyi graph")
        within("network.rewire", self.rewire, "[0, 1]", "the probability that a small_world ring edge is rewired")
        at_least("network.redraw_every", self.redraw_every, 0, "rounds between two graphs (0: one graph for the run)")
        within("network.p_offline", self.p_offline, "[0, 1)", "the probability that a client is offline in a round "
               "(1 would leave every round empty)")
        within("network.stragglers", self.stragglers, "[0, 1)", "the probability that a client straggles in a round")
        within("network.straggler_work", self.straggler_work, "(0, 1]", "the share of its steps a straggler "
               "completes")
        within("network.p_drop", self.p_drop, "[0, 1)", "the probability that a model sent is lost")
        if self.p_offline > 0 and self.availability:
            raise ConfigError("network.availability", self.availability, "gives who is online itself: set "
                              "network.p_offline=0, or leave network.availability empty")
        _check_join(self, cfg.rounds, cfg.clients)


def _check_join(net: NetworkConfig, rounds: int, clients: int) -> None:
    """``network.join_round``, ``network.join_fraction`` and ``network.join_init`` in range and given together;
    ConfigError naming the key, the value and the fix."""
    t, share = net.join_round, net.join_fraction
    if not isinstance(t, int) or isinstance(t, bool) or t < 0:
        raise ConfigError("network.join_round", t, "use 0 (no late joiners) or the round at which they join, a "
                          f"whole number in [2, rounds = {rounds}]")
    if t and not 2 <= t <= rounds:
        raise ConfigError("network.join_round", t, f"late joiners join at a round of the run after its first: use "
                          f"a round in [2, rounds = {rounds}], or 0 for none")
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 <= share < 1:
        raise ConfigError("network.join_fraction", share, "the share of clients that join late must lie in (0, 1) "
                          "(e.g. 0.25): some clients must be present from the start")
    if not t:
        if share:
            raise ConfigError("network.join_fraction", share, "has no effect: no client joins late "
                              "(network.join_round = 0); set network.join_round, or drop the key")
        if net.join_init != NetworkConfig.join_init:
            raise ConfigError("network.join_init", net.join_init, "has no effect: no client joins late "
                              "(network.join_round = 0); set network.join_round, or drop the key")
        return
    if not share:
        raise ConfigError("network.join_fraction", share, f"network.join_round={t} asks for late joiners: give "
                          "their share in (0, 1), e.g. network.join_fraction=0.25, or set network.join_round=0")
    if math.ceil(share * clients - 1e-9) >= clients:
        raise ConfigError("network.join_fraction", share, f"would make all {clients} clients join late (ceil(share "
                          "· clients)); lower it so that at least one client is present from the start")


@dataclass
class AttackConfig:
    """Adversarial clients (fedclust.attack; docs/algorithms.md, "Networks")."""

    fraction: float = 0.0
    """share of clients, fixed for the run, that send poisoned models instead of their trained ones, in
    `[0, 0.5)` (from half on they are no minority); 0: no attack."""
    kind: AttackKind = "sign_flip"
    """what they send: `sign_flip` (the update reversed, times `attack.scale`), `gaussian` (the trained model
    plus noise of std `attack.scale`) or `label_flip` (the model trained on labels K - 1 - y)."""
    scale: float = 1.0
    """`sign_flip`: the reversed update's factor; `gaussian`: the noise's standard deviation; a finite number
    `> 0`."""

    def validate(self, cfg: Config) -> None:
        within("attack.fraction", self.fraction, "[0, 0.5)", "the share of attackers (from half on they are no "
               "minority)")
        finite("attack.scale", self.scale, "must be a finite number > 0 (sign_flip: the reversed update's factor; "
               "gaussian: the noise's std)")


@dataclass
class ShareConfig:
    """What a peer-to-peer client shares (docs/algorithms.md, "Partial sharing")."""

    personal: list = field(default_factory=list)
    """parameter tensors each client keeps to itself: the gossip averages the others and the client keeps its
    own trained values of these; names (`fc3.weight`), module prefixes (`fc3`) or `head` (the model's last
    layer); `[]` shares everything.

    Peer-to-peer methods only (a personal head). See [Partial sharing](algorithms.md#partial-sharing-sharepersonal).
    """

    def validate(self, cfg: Config) -> None:
        """None here: the names are checked against the algorithm and the model's tensors
        (:func:`fedclust.config.personal_columns`)."""


@dataclass
class WandbConfig:
    """Weights & Biases tracking (rank 0).  An empty value is not passed to
    W&B, so the WANDB_* environment (WANDB_MODE, WANDB_PROJECT, ...) decides."""

    enabled: bool = resumable(False)
    """track the run in Weights & Biases (rank 0)."""
    project: str = resumable("")
    """W&B project; empty: `WANDB_PROJECT`, else `fedclust`.

    At most 128 characters, none of them `/`, `\\`, `#`, `?`, `%` or `:` (W&B's rule; for ENTITY/PROJECT write
    `wandb.entity=ENTITY wandb.project=PROJECT`).
    """
    entity: str = resumable("")
    """W&B entity (user or team); empty: `WANDB_ENTITY` or your default."""
    mode: WandbMode = resumable("")
    """`online`, `offline` (no account, no network) or `disabled`; empty: `WANDB_MODE`, else `online`."""
    group: str = resumable("")
    """W&B run group; empty: `WANDB_RUN_GROUP`."""
    name: str = resumable("")
    """W&B run name; empty: `WANDB_NAME`, else the run directory's name."""
    tags: list = resumable(factory=list)
    """W&B tags, each 1-64 characters, e.g. `[panm,cifar]`."""

    def validate(self, cfg: Config) -> None:
        bad = sorted(set(WANDB_PROJECT_CHARS) & set(self.project))
        if bad or len(self.project) > 128:
            raise ConfigError("wandb.project", self.project, "W&B takes a project name of at most 128 characters, "
                              f"none of them {' '.join(WANDB_PROJECT_CHARS[:-1])} or {WANDB_PROJECT_CHARS[-1]} (for "
                              "ENTITY/PROJECT write wandb.entity=ENTITY wandb.project=PROJECT)")
        if not isinstance(self.tags, list) or not all(isinstance(x, str) and 1 <= len(x) <= 64 for x in self.tags):
            raise ConfigError("wandb.tags", self.tags, "must be a list of strings of 1 to 64 characters (W&B's "
                              "limit), e.g. wandb.tags=[panm,cifar]")


# Sections declared by algorithms: name -> dataclass (fedclust.algorithms.registry fills it).
SECTIONS: dict[str, type] = {}


def register_section(name: str, cls: type) -> None:
    """Add an algorithm's config section ``name`` (a dataclass with defaults
    and a ``validate(cfg)`` method).  The same class may be registered again
    (two algorithms sharing a section); another class under a taken name is
    refused, as is a name of a core key or of a method of the config."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"config section '{name}' must be a dataclass, got {cls!r}")
    if name in CORE_KEYS:
        raise ValueError(f"config section '{name}' would hide the core key '{name}'; choose another name")
    if callable(getattr(Config, name, None)):
        raise ValueError(f"config section '{name}' would hide the config's method '{name}'; choose another name")
    if SECTIONS.get(name, cls) is not cls:
        raise ValueError(f"config section '{name}' is registered twice, by {SECTIONS[name].__qualname__} and "
                         f"{cls.__qualname__}")
    SECTIONS[name] = cls


def _default_sections() -> dict:
    return {name: cls() for name, cls in SECTIONS.items()}


@dataclass
class Config:
    """A whole config: the core sections and top-level keys, and the registered algorithms' sections (reached
    as ``cfg.<name>``)."""

    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    share: ShareConfig = field(default_factory=ShareConfig)
    participation: float = 1.0
    """share of clients taking part each round (centralized methods), in `(0, 1]`; only they train, and
    `train_loss` is their mean."""
    model: str = "auto"
    """`logreg`, `mlp` (784-200-200-10), `cnn` (CIFAR-10), or your own: `FILE.py:NAME` or
    `package.module:NAME`, `NAME(input_shape, num_classes)` returning an `nn.Module`; `auto`: the data set's
    default.

    `logreg` is multinomial logistic regression, FedProx's and FPFC's Synthetic model; `auto` picks `logreg` for
    `synthetic`, `cnn` for `cifar10`, `mlp` otherwise. See [Your own model](own-model-and-data.md#your-own-model).
    """
    engine: Engine = "auto"
    """how a model trains all clients: `batched` (`torch.func.vmap`; the built-ins' hand-written paths), `loop`
    (one client after another), `auto` (batched, except convolutions on a CPU or a model vmap cannot batch).

    Either way it trains all of a process's clients in one round step; `fedclust bench --user-models SPEC` measures
    both on your model.
    """
    precision: Precision = "default"
    """matrix products and convolutions on an NVIDIA GPU: `default` (PyTorch's: convolutions in TF32, products
    in float32), `fp32` (IEEE float32 throughout) or `tf32` (both on TF32 tensor cores, fastest); a CPU
    computes float32 under each.

    `default` runs convolutions on TF32 tensor cores from Ampere on and products in IEEE float32; `tf32`'s
    products have 10-bit mantissas and float32 sums (the batched MLP's products run on tensor cores). Each run
    sets both flags for its process; a run on a CPU with `fp32` or `tf32` says it changes nothing.
    """
    exchange_mb: float = 0.0
    """the most MiB a process spends receiving the round's models, gathered in column blocks, a finite number
    `>= 0` (0: all at once, the fastest); for the algorithms that read no whole peer model: `deprl`, `dfca`,
    `epidemic`, `facade`, `fedavg`, `fedprox`, `fedspd`, `fixtopology`, `ifca`, `local`, `oracle`, `panm_grad`,
    `random` (and plug-ins that declare `column_exchange`).

    One all-gather per block; the other algorithms are refused. See [Scale: thousands of
    clients](speed-and-scale.md#scale-thousands-of-clients).
    """
    clients: int = 100
    """number of clients `n`, `>= 2` (and at least `data.num_clusters`)."""
    rounds: int = resumable(300)
    """total rounds (stage one + stage two), `>= 1`; a run continued from its checkpoint may run more, never
    fewer."""
    stage1_rounds: int = 100
    """rounds of stage one, T1, `>= 0` (PANM, PENS: `1 <= T1 <= rounds`)."""
    seed: int = 0
    """seed of every draw (data split, initial model, candidates, batches), `0 <= seed < 2^32`.

    The draws are keyed on the seed's low 32 bits, so a larger seed would repeat a smaller one's.
    """
    out: str = resumable("")
    """run directory; empty: `runs/<algorithm>-<data>-s<seed>-<time>`; a run there is continued from its
    newest checkpoint.

    A run there that this config cannot continue is refused unless `overwrite=true`.
    """
    label: str = resumable("")
    """the run's name in `summary.json`, `fedclust report` tables and W&B (variants of one algorithm); empty:
    `algorithm.name`."""
    device: Device = "auto"
    """`auto` (`cuda` if visible, else `cpu`), `cpu` or `cuda`."""
    eval_every: int = resumable(1)
    """evaluate every this many rounds (and the last), `>= 1`."""
    progress: bool = resumable(True)
    """progress on rank 0: a bar on a terminal, else a line every 10 rounds or 60 s.

    The plain lines (where stderr is not a terminal: Slurm logs, `nohup`) give the round, accuracy, s/round and
    ETA, and one more at the end.
    """
    figures: bool = resumable(True)
    """write PNG figures into the run directory at the end."""
    plugins: list = resumable(factory=list)
    """modules or `.py` files imported first; they register more algorithms, their config sections and data
    sets.

    See [Adding an algorithm](adding-an-algorithm.md).
    """
    checkpoint_every: int = resumable(0)
    """rounds between checkpoints, `>= 0`; 0: by the clock (5 min or 50x a checkpoint's cost); always at the
    end and on SIGUSR1/SIGTERM.

    By the clock: every 5 minutes or 50x the last checkpoint's cost, whichever is longer, so checkpoints take at
    most 2% of the run and a kill loses at most a few minutes.
    """
    resume: ResumeMode = resumable("auto")
    """`auto`: continue from `out`'s newest checkpoint if any; `never`: refuse a directory holding a run;
    `require`: error without a checkpoint.

    `never` starts afresh, and refuses a directory that holds a run unless `overwrite=true`.
    """
    overwrite: bool = resumable(False)
    """`true`: a run in `out` that this config cannot continue is replaced, not refused (a checkpoint of this
    same config is still resumed)."""
    collective_timeout: float = resumable(600.0)
    """seconds a rank waits for the others in a collective before the run stops, a finite number `> 0`.

    The error names the rank and the round.
    """
    startup_timeout: float = resumable(180.0)
    """seconds the processes of a run of several wait for each other to start, a finite number `> 0` (a rank
    that died or hangs in start-up, before the process group forms, is named after this)."""
    other_sections: bool = resumable(False)
    """`true`: the config may set keys of other algorithms' sections (one file for a sweep over
    `algorithm.name`, e.g. `ifca.clusters` beside `fpfc`); they are not read. `false`: such a key is refused,
    since it would have no effect."""
    # sections of the registered algorithms (pens, panm, fedprox, ...), reached as cfg.<name>
    sections: dict = field(default_factory=_default_sections, repr=False)

    def __getattr__(self, name: str):
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"config has no key or section '{name}'")

    def validate(self) -> None:
        """The ranges of the top-level keys (each section checks its own: :func:`validate_core`)."""
        if self.clients < 2:
            raise ConfigError("clients", self.clients, "federated learning needs at least 2 clients")
        at_least("rounds", self.rounds, 1, "the total number of rounds")
        at_least("stage1_rounds", self.stage1_rounds, 0, "the rounds of stage one (two-stage methods need >= 1)")
        at_least("eval_every", self.eval_every, 1, "evaluate every this many rounds (1: every round; the last is "
                 "always evaluated)")
        if not 0 <= self.seed < SEED_LIMIT:
            raise ConfigError("seed", self.seed, f"must lie in [0, 2^32 = {SEED_LIMIT}): the draws are keyed on the "
                              "seed's low 32 bits, so a larger or negative seed would repeat another seed's draws")
        within("participation", self.participation, "(0, 1]", "the share of clients per round")
        finite("exchange_mb", self.exchange_mb, "must be a finite number of MiB >= 0 (0: gather the round's models "
               "all at once)", strict=False)
        at_least("checkpoint_every", self.checkpoint_every, 0,
                 "rounds between checkpoints (0: by the clock, every 5 minutes or 50x the last checkpoint's cost; "
                 "always at the end and on SIGUSR1/SIGTERM)")
        finite("collective_timeout", self.collective_timeout,
               "must be a finite number of seconds > 0 (how long a rank waits for the others in a collective)")
        finite("startup_timeout", self.startup_timeout,
               "must be a finite number of seconds > 0 (how long the processes of a run wait for each other to start)")


CORE_KEYS = {f.name for f in dataclasses.fields(Config)}
# The core sections, in Config's order (each a dataclass with a validate(self, cfg) method).
CORE_SECTIONS = tuple(f.name for f in dataclasses.fields(Config)
                      if dataclasses.is_dataclass(f.default_factory) and f.name != "sections")

# Keys that moved: {old dotted key: new one}.  A config giving an old key is refused naming the new one; a
# checkpoint's or run directory's config is read with them moved (fedclust.upgrade.config).
RENAMED_KEYS = {"algorithm.tau": "panm.tau", "algorithm.alpha": "panm.alpha"}


def validate_core(cfg: Config) -> None:
    """The checks of the core keys, each key once: every key's choices, the top-level keys' ranges
    (:meth:`Config.validate`), then each core section's (its ``validate(cfg)``) in :data:`CORE_SECTIONS`'
    order.  The algorithm's own, its sections' and the data's are made by :func:`fedclust.config.validate`."""
    check_choices(cfg)
    cfg.validate()
    for name in CORE_SECTIONS:
        getattr(cfg, name).validate(cfg)


# ----------------------------------------------------------------------------
# The keys: their names, defaults, choices and meanings

# A class's field types, resolved once: its annotations are strings (postponed evaluation), and resolving them on
# every lookup was 0.1 s of a small run's start
_FIELD_TYPES: dict[type, Mapping[str, Any]] = {}


def _field_types(cls: type) -> Mapping[str, Any]:
    got = _FIELD_TYPES.get(cls)
    if got is None:
        hints = typing.get_type_hints(cls)
        got = _FIELD_TYPES[cls] = MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(cls)
                                                    if f.name != "sections"})
    return got


def _valid_keys(cls, prefix: str = "") -> list[str]:
    keys = []
    for name, tp in _field_types(cls).items():
        path = f"{prefix}{name}"
        if dataclasses.is_dataclass(tp):
            keys += _valid_keys(tp, path + ".")
        else:
            keys.append(path)
    return keys


def valid_keys() -> list[str]:
    """Every dotted key a config file or override may set (the core keys,
    then each registered section's)."""
    keys = _valid_keys(Config)
    for name, cls in SECTIONS.items():
        keys += _valid_keys(cls, name + ".")
    return keys


def choices(tp: Any) -> tuple | None:
    """The values a ``Literal`` field type allows (None: not a choice field)."""
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


@functools.cache
def _docstrings(cls: type) -> dict[str, str]:
    """``{field: the docstring under it}`` of the fields ``cls`` declares itself, read once from its source (a
    string statement right after the field); none where the source cannot be read (a class made by ``exec``)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    node = tree.body[0] if tree.body else None
    if not isinstance(node, ast.ClassDef):
        return {}
    docs = {}
    for stmt, after in zip(node.body, node.body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def field_doc(cls: type, name: str) -> str:
    """The docstring under field ``name`` of the dataclass ``cls`` (or of the class it inherits the field
    from), "" where it has none."""
    for klass in cls.__mro__:
        if name in vars(klass).get("__annotations__", {}) and name in _docstrings(klass):
            return _docstrings(klass)[name]
    return ""


def plain(text: str) -> str:
    """Markdown as a terminal shows it: a link as its text, code without its backticks."""
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "")


def _no_stop(text: str) -> str:
    return text[:-1] if text.endswith(".") and not text.endswith("..") else text


def meaning(cls: type, f: dataclasses.Field) -> tuple[str, str]:
    """``(line, whole)``: a field's one-line meaning (plain text, what ``fedclust check --keys`` prints) and
    its whole meaning (Markdown, the config reference's).  From the docstring under the field: its first
    paragraph, and all of it; else from :func:`option`: ``help``, and ``doc`` ("" where it gives none)."""
    doc = field_doc(cls, f.name)
    if doc:
        paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", doc) if p.strip()]
        return plain(_no_stop(paragraphs[0])), _no_stop(" ".join(paragraphs))
    return str(f.metadata.get("help", "")).strip(), str(f.metadata.get("doc", "")).strip()


def _format_default(value: Any) -> str:
    """A default as it would be written on the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_format_default(v)}" for k, v in value.items()) + "}"
    if value == "":
        return '""'
    return str(value)


def _field_default(f: dataclasses.Field) -> Any:
    """A config field's default value (its default, else its default factory's value)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    raise TypeError(f"config field '{f.name}' has no default: every config key needs one (option(default, ...))")


def key_records(cls, prefix: str = "") -> list[dict]:
    """Every key of a config dataclass, each as ``{key, default, type, choices, help, doc, resumable}`` (the
    config reference's rows, :func:`fedclust.config.reference_markdown`): ``help`` and ``doc`` its one-line
    and whole meaning (:func:`meaning`)."""
    rows = []
    types = _field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name not in types:
            continue
        tp, path = types[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            rows += key_records(tp, path + ".")
            continue
        line, whole = meaning(cls, f)
        rows.append({"key": path, "default": _format_default(_field_default(f)), "choices": choices(tp),
                     "type": "choice" if choices(tp) is not None else getattr(tp, "__name__", str(tp)),
                     "help": line, "doc": whole, "resumable": bool(f.metadata.get("resumable"))})
    return rows


def describe_keys() -> list[tuple[str, str, str]]:
    """``(key, default, meaning)`` of every key, in :func:`valid_keys` order;
    the meaning is the field's one-line meaning (:func:`meaning`), empty
    where a plugin's section gives none."""
    records = key_records(Config)
    for name, cls in SECTIONS.items():
        records += key_records(cls, name + ".")
    return [(r["key"], r["default"], r["help"]) for r in records]


def check_choices(obj: Any, prefix: str = "") -> None:
    """Refuse a value outside its field's ``Literal`` choices, in ``obj`` (a
    config dataclass) and the dataclasses it holds; ``prefix``: its dotted
    path.  The error names the closest allowed value and the key's meaning."""
    fields = {f.name: f for f in dataclasses.fields(obj)}
    for name, tp in _field_types(type(obj)).items():
        value = getattr(obj, name)
        if dataclasses.is_dataclass(tp):
            check_choices(value, f"{prefix}{name}.")
        elif (allowed := choices(tp)) is not None and value not in allowed:   # the meaning read only then:
            one_of(f"{prefix}{name}", value, set(allowed), meaning(type(obj), fields[name])[0])   # 0.25 s


def resumable_keys() -> set[str]:
    """The dotted keys declared ``resumable`` (:func:`resumable`, :func:`option`): the core keys', then each
    registered section's."""
    def walk(cls, prefix: str) -> set[str]:
        out: set[str] = set()
        types = _field_types(cls)
        for f in dataclasses.fields(cls):
            if f.name not in types:
                continue
            if dataclasses.is_dataclass(types[f.name]):
                out |= walk(types[f.name], f"{prefix}{f.name}.")
            elif f.metadata.get("resumable"):
                out.add(f"{prefix}{f.name}")
        return out

    keys = walk(Config, "")
    for name, cls in SECTIONS.items():
        keys |= walk(cls, name + ".")
    return keys


# ----------------------------------------------------------------------------
# The config as plain data (config.yaml, W&B, a checkpoint's comparison)

def _plain(value: Any) -> Any:
    """A core key's value as config.yaml holds it: a config dataclass as a dict, a list copied."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return list(value) if isinstance(value, list) else value


def to_dict(cfg: Config) -> dict:
    """Core keys, then every section, as plain nested dicts (config.yaml, W&B)."""
    out = {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.name != "sections"}
    for name, section in cfg.sections.items():
        out[name] = dataclasses.asdict(section)
    return out


def flatten(d: dict, prefix: str = "") -> dict:
    """A nested config dict (:func:`to_dict`) as {dotted key: value}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def absent_key_values() -> dict:
    """What each key reads as in a config written before it existed (a
    checkpoint's, a run directory's config.yaml), flattened to dotted keys:
    its default, since a new key's default keeps the earlier behaviour,
    except where a section declares otherwise in its ``before_the_key``
    class attribute ({key: the value that describes how runs behaved before
    it}; e.g. CFL carved no validation split before ``cfl.validation``)."""
    values = flatten(to_dict(Config()))
    for name, cls in SECTIONS.items():
        values.update({f"{name}.{k}": v for k, v in getattr(cls, "before_the_key", {}).items()})
    return values
