"""The config schema: typed dataclasses of the core sections, the sections
algorithms declare (registered by :mod:`fedclust.algorithms.registry`),
YAML merging with dotted overrides, and the checks of the core keys.

Every field carries its one-line meaning (:func:`option`), which
``fedclust check --keys`` prints beside its default.  Every error names the
field, the bad value and the fix; an unknown key names the closest valid one.
This module imports nothing of fedclust but errors: algorithms add their
sections to it (:func:`register_section`), and :mod:`fedclust.config` loads
and validates a whole config.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml

from fedclust.errors import ConfigError


def option(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING,
           resumable: bool = False, doc: str = "") -> Any:
    """A config field with its default (or ``factory`` for a list) and its
    one-line meaning, the text ``fedclust check --keys`` prints.
    ``resumable``: the key may change when a run continues from a checkpoint
    (run length and outputs: it changes no result of the rounds already
    run); any other key must keep the checkpoint's value.  ``doc``: the
    fuller meaning the config reference (docs/config.md, generated) gives
    instead of ``help`` (Markdown, links relative to docs/).  A field whose
    type is a ``Literal`` takes one of its values (:func:`check_choices`)."""
    if not help:
        raise ValueError("every config key needs a one-line meaning (help=...)")
    return field(default=default, default_factory=factory,
                 metadata={"help": help, "resumable": resumable, "doc": doc})


# Seeds key counter-based draws by their low 32 bits (fedclust.rng hashes seed * an odd constant mod 2**32),
# so a larger seed would repeat the draws of a smaller one.
SEED_LIMIT = 2**32


# Choice fields: each a Literal, whose values check_choices accepts and fedclust check --keys lists.
ClusterKind = Literal["rotation", "label_swap"]
Partition = Literal["iid", "dirichlet", "shards"]   # fedclust.data.skew.PARTITIONS
SyntheticInputs = Literal["client", "shared"]
WandbMode = Literal["", "online", "offline", "disabled"]
Engine = Literal["auto", "batched", "loop"]
Precision = Literal["default", "fp32", "tf32"]   # fedclust.engine.precision
Device = Literal["auto", "cpu", "cuda"]
ResumeMode = Literal["auto", "never", "require"]
GraphKind = Literal["complete", "ring", "regular", "erdos_renyi", "small_world", "file"]
AttackKind = Literal["sign_flip", "gaussian", "label_flip"]
PRECISIONS = typing.get_args(Precision)


@dataclass
class AlgorithmConfig:
    name: str = option("local", "the algorithm, by name (listed below; docs/algorithms.md; plugins add more)",
        doc=("see the tables in [What fedclust does](what-it-does.md) (`fedclust check --keys` lists the "
            "registered names)"))
    k: int = option(5, "neighbours a peer-to-peer client averages with per round",
        doc=("neighbours averaged with per round (peer-to-peer methods), at most `clients − 1`"))
    l: int = option(10, "candidates drawn per round (PANM, PENS); at least k",
        doc=("candidates drawn per round (PANM, PENS), at most `clients − 1`; at least `k`, since they "
            "keep the top `k` of the `l` drawn (with fewer, round 1 gives only `l` neighbours)"))   # noqa: E741 (the papers' l)


@dataclass
class DataConfig:
    name: str = option("fmnist", "data set: mnist, fmnist, cifar10, synthetic, npz (your arrays, data.path), "
                                 "torchvision:NAME (e.g. torchvision:KMNIST), or a plugin's",
        doc=("`mnist`, `fmnist`, `cifar10`, `synthetic`, `npz` (your arrays in `data.path`), "
            "`torchvision:NAME` (e.g. `torchvision:KMNIST`), or a plug-in's; see [Your own data "
            "set](own-model-and-data.md#your-own-data-set)"))
    root: str = option("data", "folder of the data sets (torchvision layout, or the four Fashion-MNIST IDX files)")
    clusters: ClusterKind = option("rotation", "what sets image clusters apart: rotation or label_swap "
                                               "(synthetic: each cluster's own (W, b))",
        doc=("`rotation` or `label_swap` (Synthetic: each cluster has its own (W, b))"))
    num_clusters: int = option(2, "latent clusters, any >= 1 (1: no transform, plain federated learning); "
                                  "rotation: evenly spaced angles 360/C*c unless data.rotations; label_swap: "
                                  "the papers' pairs for 2 or 4, else a fixed permutation a cluster",
        doc=("any number `>= 1`: `1` is plain federated learning (no transform); `rotation` turns cluster c of C "
            "by `360°·c/C` (the papers' 0°/180° and 0°/90°/180°/270°) unless `data.rotations` gives each "
            "cluster's angle; `label_swap` swaps the papers' label pairs for 2 or 4 clusters, and for any other "
            "count keeps cluster 0's labels and relabels cluster c by a fixed permutation (see [Common "
            "ground](algorithms.md#common-ground)); `synthetic`: each cluster its own (W, b); a file of your own "
            "clients: the number of clusters in its `cluster` array. `data.cluster_sizes` and `data.rotations` "
            "must give as many entries"))
    cluster_sizes: list[int] = option(help="clients of each cluster in order, contiguous blocks (cluster 0 the "
                                           "first ones): whole numbers >= 1, one a cluster (as many as "
                                           "data.num_clusters), summing to clients; []: near-equal blocks",
                                      factory=list,
        doc=("clients of each cluster, in order: cluster 0 is the first `cluster_sizes[0]` clients, cluster 1 "
            "the next `cluster_sizes[1]`, ...; whole numbers `>= 1`, as many as `data.num_clusters`, summing "
            "to `clients` (DAC's `[70,20,5,5]`); `[]`: near-equal blocks. Pools and `synthetic`; a file of "
            "your own clients has its own clusters. See [Common ground](algorithms.md#common-ground)"))
    rotations: list[float] = option(help="data.clusters=rotation: each cluster's angle in degrees, "
                                         "counter-clockwise (as many as data.num_clusters); multiples of 90 exact, "
                                         "other angles bilinear with zero fill; []: evenly spaced, 360/C*c "
                                         "(0/180 for 2 clusters, 0/90/180/270 for 4)",
                                    factory=list,
        doc=("`data.clusters=rotation`: each cluster's angle in degrees, counter-clockwise about the image "
            "centre, one a cluster (as many as `data.num_clusters`); multiples of 90° are exact `rot90`s, other "
            "angles bilinear interpolation with zero fill (DAC's `[0,180,10,350]`); `[]`: evenly spaced, "
            "`360°·c/C` for cluster c of C (the papers' 0°/180° for 2 clusters, 0°/90°/180°/270° for 4). See "
            "[Common ground](algorithms.md#common-ground)"))
    train_size: int = option(200, "training samples per client (class-balanced)",
        doc=("training samples per client (class-balanced), `>= 1`; ignored by a file of your own "
            "clients"))
    test_size: int = option(100, "test samples per client",
        doc=("test samples per client, `>= 1`; ignored by a file of your own clients"))
    validation: float = option(0.0, "share of each client's training examples held out for validation, in "
                                    "[0, 1); > 0: the summary adds each client's test accuracy at its "
                                    "best-validation round",
        doc=("share of each client's training examples held out for validation (never trained on), in `[0, 1)`; "
             "`> 0`: every record adds the validation accuracy and the summary each client's test accuracy at the "
             "round of its best validation accuracy (`best_validation_accuracy`, `best_validation_rounds`). See "
             "[Reports](reports.md#the-model-you-would-deploy)"))
    partition: Partition = option("iid", "how a pool's examples are dealt to clients: iid (class-balanced), "
                                         "dirichlet (label proportions from Dir(data.alpha)) or shards (McMahan "
                                         "et al.'s: sorted by label, data.shards_per_client shards a client); "
                                         "within each cluster, before its transform",
        doc=("how a pool's examples are dealt to the clients, before each cluster's transform: `iid` "
            "(class-balanced, the papers' split), `dirichlet` (each client's label proportions drawn from "
            "Dir(`data.alpha`), Hsu et al.'s per-client draw) or `shards` (McMahan et al.'s pathological split: "
            "the examples sorted by label, cut into `clients · data.shards_per_client` shards, "
            "`data.shards_per_client` a client). Combines with any `data.clusters` and `data.num_clusters` "
            "(`data.num_clusters=1`: plain federated learning). See [Partitions](algorithms.md#partitions-label-"
            "and-quantity-skew)"))
    alpha: float = option(0.5, "data.partition=dirichlet: the concentration of each client's label proportions, "
                               "a finite number > 0 (small: a few classes a client; large: near iid)",
        doc=("`data.partition=dirichlet`: the concentration alpha of each client's label proportions "
            "Dir(alpha·1), a finite number `> 0` (0.1: mostly one or two classes a client; 100: near "
            "class-balanced); refused with another partition"))
    shards_per_client: int = option(2, "data.partition=shards: shards each client takes (McMahan et al.: 2), "
                                       ">= 1 and at most data.train_size",
        doc=("`data.partition=shards`: shards each client takes (McMahan et al.'s 2), `>= 1` and at most "
            "`data.train_size` (a shard holds at least one example); refused with another partition"))
    quantity_skew: float = option(0.0, "0: every client data.train_size training examples; a > 0: sizes from a "
                                       "power law of tail exponent a (smaller a, more skew), mean data.train_size, "
                                       "at least min(10, data.train_size) each",
        doc=("`0`: every client holds `data.train_size` training examples; `a > 0` (finite): quantity skew, "
            "each client's share of the examples above a floor in proportion to a Pareto draw of tail exponent "
            "a (`P(x > s) = s^−a`: the smaller a, the more a few clients hold; at `a <= 1` one client may hold "
            "most), each client at least `min(10, data.train_size)` (and `data.shards_per_client`), summing to "
            "`clients · data.train_size` (with `data.share_images`, a client capped at the split's size); test "
            "sets keep `data.test_size`. Any `data.partition`. See [Partitions](algorithms.md#partitions-label-"
            "and-quantity-skew)"))
    share_images: bool = option(False, "allow one image on several clients (runs of thousands of clients)")
    download: bool = option(True, "let torchvision download a missing data set")
    options: dict = option(help="data.name=torchvision:NAME: keyword arguments of the torchvision class, e.g. "
                                "data.options.split=balanced for EMNIST ({}: none); other data sets take none",
                           factory=dict,
        doc=("`data.name=torchvision:NAME`: keyword arguments passed to the torchvision class (`{split: "
            "balanced}` for `torchvision:EMNIST`); `data.options.KEY=VALUE` sets one, `KEY=null` drops it. "
            "Other data sets take none (refused). See [Your own data "
            "set](own-model-and-data.md#your-own-data-set)"))
    path: str = option("", "data.name=npz: a .npz (or torch .pt) file of named arrays: x_train, y_train, x_test, "
                           "y_test (a pool split over clients like fmnist), plus client_train, client_test (each "
                           "example's client: naturally federated; data.train_size/test_size are then ignored) "
                           "and optionally cluster, num_classes; inputs normalized by x_train's per-channel "
                           "mean and std (docs/algorithms.md)",
        doc=("`data.name=npz`: your `.npz` (or torch `.pt`) file of named arrays, a pool (`x_train`, "
            "`y_train`, `x_test`, `y_test`) or your own clients (plus `client_train`, `client_test`, "
            "optionally `cluster`); see [Your own data set](own-model-and-data.md#your-own-data-set)"))
    synthetic_alpha: float = option(1.0, "Synthetic(alpha, beta) of FedProx: alpha >= 0, std of each cluster's "
                                         "model mean u_k")
    synthetic_beta: float = option(1.0, "Synthetic(alpha, beta): beta >= 0, std of each client's input mean B_i")
    synthetic_dim: int = option(60, "Synthetic: input dimension")
    synthetic_inputs: SyntheticInputs = option("client", "Synthetic inputs: client (around each client's own "
                                                         "mean, FedProx) or shared (all around one mean)",
        doc=("`client`: each client's inputs around its own mean v_i (FedProx's generator); `shared`: "
            "every client's around one mean v_0, so only the cluster's (W, b) tells clients apart. "
            "Every client has `train_size` samples: FedProx's lognormal(4, 2) + 50 sizes are not "
            "offered by the generator (clients of unequal sizes come from a file of your own clients, "
            "`data.name=npz`)"))


@dataclass
class TrainConfig:
    lr: float = option(0.08, "SGD learning rate of round 1, > 0",
        doc=("learning rate of round 1, a finite number `> 0`"))
    lr_decay: float = option(0.99, "lr of round t is lr * lr_decay^(t-1); in (0, 1]",
        doc=("lr of round t is `lr * lr_decay^(t-1)`; in (0, 1] (1: constant)"))
    lr_decay_every: int = option(1, "decay the lr once every this many rounds, >= 1: lr of round t is "
                                    "lr * lr_decay^floor((t-1)/lr_decay_every) (1: every round)",
        doc=("the lr decays once every this many rounds (`>= 1`): lr of round t is `lr * "
            "lr_decay^floor((t-1)/lr_decay_every)`; 1 is `lr_decay^(t-1)` (FPFC's official code: 0.9 "
            "every 5 rounds)"))
    momentum: float = option(0.9, "SGD momentum in [0, 1), buffer reset every round",
        doc=("SGD momentum in [0, 1) (buffer reset every round)"))
    batch_size: int = option(128, "local minibatch size",
        doc=("local minibatch size, `>= 1`"))
    local_epochs: int = option(3, "local epochs over the client's training set per round",
        doc=("local epochs per round, `>= 1`"))

    def round_lr(self, t: int) -> float:
        """The lr of round t (1-based): ``lr · lr_decay^⌊(t − 1)/lr_decay_every⌋``
        (with ``lr_decay_every = 1`` the same float as ``lr · lr_decay^(t − 1)``)."""
        return self.lr * self.lr_decay ** ((t - 1) // self.lr_decay_every)


@dataclass
class NetworkConfig:
    """The communication graph of a peer-to-peer run (fedclust.network; docs/algorithms.md, "Networks")."""

    graph: GraphKind = option("complete", "who can reach whom each round: complete (everyone, the papers' setting), "
                                          "ring, regular (random, network.degree), erdos_renyi (network.p_edge), "
                                          "small_world (Watts-Strogatz: network.degree, network.rewire) or file "
                                          "(network.path); peer-to-peer algorithms only")
    degree: int = option(4, "graph=regular: each client's neighbours; small_world: its ring neighbours before "
                            "rewiring (even); at least algorithm.k")
    p_edge: float = option(0.1, "graph=erdos_renyi: the probability of each edge, in (0, 1]")
    rewire: float = option(0.1, "graph=small_world: the probability that a ring edge is rewired, in [0, 1]")
    path: str = option("", "graph=file: an edge list, one 'i j' pair of client ids a line (networkx's "
                           "read_edgelist); it must be connected, without self-loops")
    redraw_every: int = option(0, "0: one graph for the whole run; T >= 1: a new graph drawn every T rounds (a "
                                  "time-varying graph), from (seed, round) alone")
    p_offline: float = option(0.0, "each round each client is offline with this probability, in [0, 1): it does "
                                   "not train, send or answer; a peer that chose it gets nothing from it; a server "
                                   "samples its participants among the online")
    availability: str = option("", "instead of p_offline: a .npy file of which clients are online in which round, "
                                   "[R, clients] booleans; round t reads row (t - 1) mod R")
    stragglers: float = option(0.0, "each round each client is a straggler with this probability, in [0, 1): its "
                                    "local training stops after network.straggler_work of its steps")
    straggler_work: float = option(0.5, "the share of a round's SGD steps a straggler completes, in (0, 1]")
    p_drop: float = option(0.0, "each model a client sends a peer is lost with this probability, in [0, 1) (keyed "
                                "on seed, round, receiver, sender); the receiver averages what arrived; "
                                "peer-to-peer algorithms only")


@dataclass
class AttackConfig:
    """Adversarial clients (fedclust.attack; docs/algorithms.md, "Networks")."""

    fraction: float = option(0.0, "share of clients, fixed for the run, that send poisoned models instead of "
                                  "their trained ones, in [0, 0.5); 0: no attack")
    kind: AttackKind = option("sign_flip", "what they send: sign_flip (the update reversed, times attack.scale), "
                                           "gaussian (the trained model plus noise of std attack.scale) or "
                                           "label_flip (the model trained on labels K - 1 - y)")
    scale: float = option(1.0, "sign_flip: the reversed update's factor; gaussian: the noise's standard "
                               "deviation; > 0")


@dataclass
class ShareConfig:
    """What a peer-to-peer client shares (docs/algorithms.md, "Partial sharing")."""

    personal: list = option(help="parameter tensors each client keeps to itself: the gossip averages the others and "
                                 "the client keeps its own trained values of these; names (fc3.weight), module "
                                 "prefixes (fc3) or head (the model's last layer); [] shares everything",
                            factory=list,
                            doc=("parameter tensors a client of a peer-to-peer method keeps to itself (a personal "
                                 "head): the gossip averages the others, and the client keeps its own trained values "
                                 "of these. Each entry a tensor's name (`fc3.weight`), a module prefix (`fc3`), or "
                                 "`head`, the model's last layer; `[]` shares everything. See [Partial "
                                 "sharing](algorithms.md#partial-sharing-sharepersonal)"))


@dataclass
class WandbConfig:
    """Weights & Biases tracking (rank 0).  An empty value is not passed to
    W&B, so the WANDB_* environment (WANDB_MODE, WANDB_PROJECT, ...) decides."""

    enabled: bool = option(False, "track the run in Weights & Biases (rank 0)", resumable=True)
    project: str = option("", "W&B project; empty: WANDB_PROJECT, else fedclust", resumable=True)
    entity: str = option("", "W&B entity (user or team); empty: WANDB_ENTITY or your default", resumable=True)
    mode: WandbMode = option(
        "", "online, offline (no account, no network) or disabled; empty: WANDB_MODE, else online", resumable=True)
    group: str = option("", "W&B run group; empty: WANDB_RUN_GROUP", resumable=True)
    name: str = option("", "W&B run name; empty: WANDB_NAME, else the run directory's name", resumable=True)
    tags: list = option(help="W&B tags, each 1-64 characters, e.g. [panm,cifar]", factory=list, resumable=True)


# Sections declared by algorithms: name -> dataclass (fedclust.algorithms.registry fills it).
SECTIONS: dict[str, type] = {}


def register_section(name: str, cls: type) -> None:
    """Add an algorithm's config section ``name`` (a dataclass with defaults
    and a ``validate(cfg)`` method).  The same class may be registered again
    (two algorithms sharing a section); another class under a taken name is
    refused, as is a name of a core key."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"config section '{name}' must be a dataclass, got {cls!r}")
    if name in CORE_KEYS:
        raise ValueError(f"config section '{name}' would hide the core key '{name}'; choose another name")
    if SECTIONS.get(name, cls) is not cls:
        raise ValueError(f"config section '{name}' is registered twice, by {SECTIONS[name].__qualname__} and "
                         f"{cls.__qualname__}")
    SECTIONS[name] = cls


def _default_sections() -> dict:
    return {name: cls() for name, cls in SECTIONS.items()}




@dataclass
class Config:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    share: ShareConfig = field(default_factory=ShareConfig)
    participation: float = option(1.0, "share of clients taking part each round (centralized methods), in (0, 1]",
        doc=("share of clients taking part each round (centralized methods), in (0, 1]; only they train, "
            "and `train_loss` is their mean"))
    model: str = option("auto", "logreg, mlp (784-200-200-10), cnn (CIFAR-10), or your own: FILE.py:NAME or "
                                "package.module:NAME, NAME(input_shape, num_classes) returning an nn.Module; auto: "
                                "the data set's default",
        doc=("`logreg` (multinomial logistic regression, FedProx's and FPFC's Synthetic model), `mlp` "
            "(784-200-200-10), `cnn` (CIFAR-10), or your own: `FILE.py:NAME` or `package.module:NAME` "
            "(see [Your own model](own-model-and-data.md#your-own-model)); `auto` picks the data set's "
            "model: `logreg` for `synthetic`, `cnn` for `cifar10`, `mlp` otherwise"))
    engine: Engine = option("auto", "how a model trains all clients: batched (torch.func.vmap; the built-ins' "
                                 "hand-written paths), loop (one client after another), auto (batched, except "
                                 "convolutions on a CPU or a model vmap cannot batch)",
        doc=("how the model trains all of a process's clients: `batched` (`torch.func.vmap`; the "
            "built-ins keep their hand-written paths), `loop` (one client after another), `auto` "
            "(batched, except a model with convolutions on a CPU or one `vmap` cannot batch: loop)"))
    precision: Precision = option("default", "matrix products and convolutions on an NVIDIA GPU: default (PyTorch's: "
                                       "convolutions in TF32, products in float32), fp32 (IEEE float32 throughout) "
                                       "or tf32 (both on TF32 tensor cores, fastest); a CPU computes float32 "
                                       "under each",
        doc=("the arithmetic of matrix products and convolutions on an NVIDIA GPU: `default` (PyTorch's: "
            "convolutions on TF32 tensor cores from Ampere on, products in IEEE float32), `fp32` (IEEE "
            "float32 throughout) or `tf32` (both in TF32: 10-bit mantissa products, float32 sums; the "
            "batched MLP's products run on tensor cores). Each run sets both flags for its process. A "
            "CPU computes float32 under each (a run there with `fp32` or `tf32` says it changes "
            "nothing)"))
    exchange_mb: float = option(0.0, "the most MiB a process spends receiving the round's models, "
                                     "gathered in column blocks (0: all at once, the fastest; "
                                     "for the algorithms that read no whole peer model: random, fixtopology, "
                                     "oracle, local, panm_grad, fedavg, fedprox, ifca)",
        doc=("the most MiB a process spends receiving the round's models: gathered in column blocks, one "
            "all-gather per block (0: all at once, the fastest); for `random`, `fixtopology`, `oracle`, "
            "`local`, `panm_grad`, `fedavg`, `fedprox` and `ifca`, the others are refused; see [Scale: "
            "thousands of clients](speed-and-scale.md#scale-thousands-of-clients)"))
    clients: int = option(100, "number of clients n, at least 2",
        doc=("number of clients `n`, `>= 2` (and at least `data.num_clusters`)"))
    rounds: int = option(300, "total rounds (stage one + stage two); a run continued from its checkpoint may "
                              "run more, never fewer", resumable=True,
        doc=("total rounds (stage one + stage two), `>= 1`"))
    stage1_rounds: int = option(100, "rounds of stage one, T1 (PANM, PENS: 1 <= T1 <= rounds)",
        doc=("rounds of stage one (T1), `>= 0`; PANM and PENS need `1 <= T1 <= rounds`"))
    seed: int = option(0, "seed of every draw (data split, init, candidates, batches), 0 <= seed < 2^32",
        doc=("seed of every draw (data split, initial model, candidates, batches); `0 <= seed < 2^32`, "
            "since the draws are keyed on the seed's low 32 bits and a larger seed would repeat a "
            "smaller one's"))
    out: str = option("", "run directory; empty: runs/<algorithm>-<data>-s<seed>-<time>; a run there is continued "
                          "from its newest checkpoint", resumable=True,
        doc=("run directory; running again into it continues from its newest checkpoint; a run there "
            "that this config cannot continue is refused unless `overwrite=true`"))
    label: str = option("", "the run's name in fedclust report tables and W&B; empty: algorithm.name",
                        resumable=True,
        doc=("the run's name in `summary.json` and in `fedclust report` tables (variants of one "
            "algorithm)"))
    device: Device = option("auto", "auto (cuda if visible, else cpu), cpu or cuda",
        doc=("`auto` (`cuda` if visible, else `cpu`), `cpu`, `cuda`"))
    eval_every: int = option(1, "evaluate every this many rounds (and the last)", resumable=True,
        doc=("evaluate every this many rounds (and the last), `>= 1`"))
    progress: bool = option(True, "progress on rank 0: a bar on a terminal, else a line every 10 rounds or 60 s",
                            resumable=True,
        doc=("progress on rank 0: a bar on a terminal; where stderr is not a terminal (Slurm logs, "
            "`nohup`), one plain line every 10 rounds or 60 s and at the end (round, accuracy, s/round, "
            "ETA)"))
    figures: bool = option(True, "write PNG figures into the run directory at the end", resumable=True,
        doc=("write PNG figures into the run directory"))
    plugins: list = option(help="modules or .py files imported first; they register more algorithms",
                           factory=list, resumable=True,
        doc=("modules or `.py` files to import first; they register more algorithms and their config "
            "sections (see [Adding an algorithm](adding-an-algorithm.md))"))
    checkpoint_every: int = option(0, "rounds between checkpoints; 0: by the clock (5 min or 50x a checkpoint's "
                                      "cost); always at the end and on SIGUSR1/SIGTERM", resumable=True,
        doc=("rounds between checkpoints, `>= 0`; 0: by the clock, every 5 minutes or 50x the last "
            "checkpoint's cost, whichever is longer (so checkpoints take at most 2% of the run and a "
            "kill loses at most a few minutes); always at the end and on SIGUSR1/SIGTERM"))
    resume: ResumeMode = option(
        "auto", "auto: continue from out's newest checkpoint if any; never: refuse a directory holding a run; "
        "require: error without a checkpoint", resumable=True,
        doc=("`auto`: a run directory with checkpoints is continued from the newest; `never`: start "
            "afresh, refusing a directory that holds a run unless `overwrite=true`; `require`: error if "
            "there is no checkpoint"))
    overwrite: bool = option(False, "true: a run in out that this config cannot continue is replaced, not "
                                    "refused (a checkpoint of this same config is still resumed)", resumable=True,
        doc=("`true`: a run in `out` that this config cannot continue is replaced instead of refused (a "
            "checkpoint of this same config is still resumed)"))
    collective_timeout: float = option(600.0, "seconds a rank waits for the others in a collective before the "
                                              "run stops", resumable=True,
        doc=("seconds (finite, `> 0`) a rank waits for the others in a collective before the run stops "
            "with an error naming the rank and the round"))
    startup_timeout: float = option(180.0, "seconds the processes of a run of several wait for each other to "
                                           "start (a rank that died or hangs in start-up is named after this)",
                                    resumable=True,
        doc=("seconds (finite, `> 0`) the processes of a run of several wait for each other to start; a "
            "rank that died or hangs before the process group forms is named after it"))
    other_sections: bool = option(False, "true: the config may set keys of other algorithms' sections (one file "
                                         "for a sweep over algorithm.name); they are not read. false: such a key "
                                         "is refused, since it would have no effect", resumable=True,
        doc=("`true`: the config may set keys in sections of algorithms other than `algorithm.name` (one "
            "file shared by a sweep over `algorithm.name`, e.g. `ifca.clusters` beside `fpfc`); they are not "
            "read. `false`: such a key, which would have no effect on the run, is refused naming it"))
    # sections of the registered algorithms (pens, panm, fedprox, ...), reached as cfg.<name>
    sections: dict = field(default_factory=_default_sections, repr=False)

    def __getattr__(self, name: str):
        sections = self.__dict__.get("sections")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"config has no key or section '{name}'")


CORE_KEYS = {f.name for f in dataclasses.fields(Config)}


# ----------------------------------------------------------------------------
# Loading and overrides

def _field_types(cls) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name != "sections"}


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


def _described(cls, prefix: str = "") -> list[tuple[str, str, str]]:
    rows = []
    types = _field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name not in types:
            continue
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(types[f.name]):
            rows += _described(types[f.name], path + ".")
            continue
        default = _field_default(f)
        rows.append((path, _format_default(default), str(f.metadata.get("help", "")).strip()))
    return rows


def describe_keys() -> list[tuple[str, str, str]]:
    """``(key, default, meaning)`` of every key, in :func:`valid_keys` order;
    the meaning is the field's ``help`` (:func:`option`), empty where a
    plugin's section gives none."""
    rows = _described(Config)
    for name, cls in SECTIONS.items():
        rows += _described(cls, name + ".")
    return rows


def key_records(cls, prefix: str = "") -> list[dict]:
    """Every key of a config dataclass, each as ``{key, default, type, choices, help, doc, resumable}`` (the
    config reference's rows, :func:`fedclust.config.reference_markdown`)."""
    rows = []
    types = _field_types(cls)
    for f in dataclasses.fields(cls):
        if f.name not in types:
            continue
        tp, path = types[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            rows += key_records(tp, path + ".")
            continue
        default = _field_default(f)
        rows.append({"key": path, "default": _format_default(default), "choices": choices(tp),
                     "type": "choice" if choices(tp) is not None else getattr(tp, "__name__", str(tp)),
                     "help": str(f.metadata.get("help", "")).strip(), "doc": str(f.metadata.get("doc", "")).strip(),
                     "resumable": bool(f.metadata.get("resumable"))})
    return rows


KEYS_HINT = "see the valid keys with fedclust check --keys"


def _unknown_key(path: str) -> ConfigError:
    if path in RENAMED_KEYS:
        return ConfigError(path, "(renamed)", f"this key is now {RENAMED_KEYS[path]}: write {RENAMED_KEYS[path]}=VALUE")
    bare = path.lstrip("+~")
    if bare != path:    # Hydra's +key=value (add a key) or ~key (delete one)
        known = bare in valid_keys()
        return ConfigError(path, "(unknown key)",
                           f"a leading '{path[:len(path) - len(bare)]}' is Hydra syntax for adding or removing a key; "
                           "fedclust's keys all exist and are set as KEY=VALUE: "
                           + (f"write {bare}=VALUE" if known else f"'{bare}' is no key either; {KEYS_HINT}"))
    close = difflib.get_close_matches(path, valid_keys(), n=1, cutoff=0.5)
    if not close:  # try matching the last component alone
        last = path.rsplit(".", 1)[-1]
        close = [k for k in valid_keys() if k.rsplit(".", 1)[-1] == last][:1]
    if close:
        return ConfigError(path, "(unknown key)", f"did you mean '{close[0]}'? ({KEYS_HINT})")
    return ConfigError(path, "(unknown key)", f"no such key; {KEYS_HINT}")


def _coerce(path: str, value: Any, tp: Any) -> Any:
    """Check a YAML value against the field's type (ints may fill floats)."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, value, "expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(path, value, "expected a whole number")
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(path, value, "expected a number")
    if tp is list:   # a list of strings; one string may stand for a list of one
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        if value is None:
            return []
        raise ConfigError(path, value, "expected a list of strings, e.g. [my_package.my_algorithm]")
    if tp is str or choices(tp) is not None:   # a choice is a string; check_choices checks which
        if value is None:
            return ""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, bool):   # YAML 1.1 reads yes/no/on/off/true/false as booleans
            meant = ALIASES.get(path, {}).get(str(value).lower())
            raise ConfigError(path, value, "expected a string, and YAML reads yes, no, on, off, true and false as "
                              "booleans: " + (f"did you mean {path}={meant}?" if meant else
                                              f"quote the word to keep it, e.g. {path}='no'"))
        raise ConfigError(path, value, "expected a string")
    return value


def _plain_value(value: Any) -> bool:
    """A YAML scalar (string, number, true/false), or a list of them."""
    if isinstance(value, list):
        return all(_plain_value(v) and not isinstance(v, list) for v in value)
    return isinstance(value, (str, int, float, bool))


def _merge_mapping(path: str, current: dict, value: Any) -> dict:
    """A mapping key (``data.options``) merged as a section is: each key given replaces its value, a key set
    to null is dropped; an empty mapping or null clears it.  Keys are Python identifiers (keyword arguments),
    values YAML scalars or lists of them."""
    if value is None or value == {}:
        return {}
    example = f"e.g. {path}={{split: balanced}}, or one key: {path}.split=balanced"
    if not isinstance(value, dict):
        raise ConfigError(path, value, f"expected a mapping of keyword arguments, {example}")
    out = dict(current)
    for k, v in value.items():
        if not isinstance(k, str) or not k.isidentifier():
            raise ConfigError(path, value, f"key {k!r} is no keyword argument name (a Python identifier); {example}")
        if v is None:
            out.pop(k, None)
        elif _plain_value(v):
            out[k] = v
        else:
            raise ConfigError(f"{path}.{k}", v, "expected a string, a number, true/false or a list of them")
    return out


def _merge(obj: Any, mapping: dict, prefix: str = "") -> None:
    types = _field_types(type(obj))
    if not isinstance(mapping, dict):
        raise ConfigError(prefix.rstrip(".") or "(top level)", mapping, "expected a mapping of keys")
    sections = obj.__dict__.get("sections") if isinstance(obj, Config) else None
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if sections is not None and key in sections:
            _merge(sections[key], value or {}, path + ".")
            continue
        if key not in types:
            while isinstance(value, dict) and value:  # name the full dotted key of a misspelt section
                key, value = next(iter(value.items()))
                path = f"{path}.{key}"
            raise _unknown_key(path)
        tp = types[key]
        if dataclasses.is_dataclass(tp):
            _merge(getattr(obj, key), value or {}, path + ".")
        elif tp is dict:
            setattr(obj, key, _merge_mapping(path, getattr(obj, key), value))
        else:
            setattr(obj, key, _coerce(path, value, tp))


def set_key(cfg: Config, path: str, value: Any) -> None:
    """Set one dotted key, with the same checks as a file."""
    parts = path.split(".")
    nested: dict = {}
    cur = nested
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    _merge(cfg, nested)


def parse_override(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` -> (key, value parsed as YAML scalar)."""
    if "=" not in text:
        raise ConfigError(text, "(override)", "write overrides as KEY=VALUE, e.g. algorithm.k=5")
    key, raw = text.split("=", 1)
    key = key.strip()
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (plain YAML
    keeps the last silently), naming its dotted path and both lines."""

    def construct_document(self, node):
        self._refuse_duplicates(node, "")
        return super().construct_document(node)

    def _refuse_duplicates(self, node, prefix: str) -> None:
        if isinstance(node, yaml.SequenceNode):
            for item in node.value:
                self._refuse_duplicates(item, prefix)
            return
        if not isinstance(node, yaml.MappingNode):
            return
        seen: dict = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":   # <<: *anchor merges on purpose
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else repr(key_node.value)
            path = f"{prefix}{key}"
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(path, "(given twice)",
                                  f"{key_node.start_mark.name} sets it on line {seen[key]} and again on line "
                                  f"{line}; YAML would keep only the last: keep one (merge the two blocks)")
            seen[key] = line
            self._refuse_duplicates(value_node, path + ".")


def read_yaml(path) -> dict:
    """The mapping in a YAML config file (ConfigError naming the file if it
    is missing, not YAML, or sets a key twice)."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise ConfigError("CONFIG", str(path), "no such file; pass a YAML file such as configs/fmnist_rotation2.yaml")
    try:
        with open(p, encoding="utf-8") as stream:   # marks name the file by its path
            raw = yaml.load(stream, Loader=_StrictLoader) or {}
    except yaml.YAMLError as exc:
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise ConfigError("CONFIG", str(path), f"not valid YAML: {text}") from None
    if not isinstance(raw, dict):
        raise ConfigError("CONFIG", str(path), "must hold a mapping of keys, e.g. 'clients: 100'")
    return raw


def parse(raw: dict | None, overrides=()) -> Config:
    """A Config from a YAML mapping and ``KEY=VALUE`` overrides, types
    checked, values not yet validated (:func:`fedclust.config.load_config`
    does both)."""
    cfg = Config()
    if raw:
        _merge(cfg, raw)
    for text in overrides:
        key, value = parse_override(text)
        set_key(cfg, key, value)
    return cfg


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


# Keys that moved: {old dotted key: new one}.  A config giving an old key is refused naming the new one; a
# checkpoint's or run directory's config is read with them moved (fedclust.upgrade.config).
RENAMED_KEYS = {"algorithm.tau": "panm.tau", "algorithm.alpha": "panm.alpha"}


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


def dump(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


# ----------------------------------------------------------------------------
# Validation: the one place every value is checked.

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


WANDB_PROJECT_CHARS = "/\\#?%:"   # W&B refuses a project name holding any of these, or longer than 128


def choices(tp: Any) -> tuple | None:
    """The values a ``Literal`` field type allows (None: not a choice field)."""
    return typing.get_args(tp) if typing.get_origin(tp) is Literal else None


def check_choices(obj: Any, prefix: str = "") -> None:
    """Refuse a value outside its field's ``Literal`` choices, in ``obj`` (a
    config dataclass) and the dataclasses it holds; ``prefix``: its dotted
    path.  The error names the closest allowed value and the key's meaning."""
    fields = {f.name: f for f in dataclasses.fields(obj)}
    for name, tp in _field_types(type(obj)).items():
        value = getattr(obj, name)
        if dataclasses.is_dataclass(tp):
            check_choices(value, f"{prefix}{name}.")
        elif (allowed := choices(tp)) is not None:
            one_of(f"{prefix}{name}", value, set(allowed), str(fields[name].metadata.get("help", "")))


def resumable_keys() -> set[str]:
    """The dotted keys declared ``resumable`` (:func:`option`): the core keys', then each registered section's."""
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


def validate_core(cfg: Config) -> None:
    """The range checks of the core keys, each key once (the algorithm's
    own, its sections' and the data's are made by :func:`fedclust.config.validate`)."""
    check_choices(cfg)
    if cfg.clients < 2:
        raise ConfigError("clients", cfg.clients, "federated learning needs at least 2 clients")
    at_least("rounds", cfg.rounds, 1, "the total number of rounds")
    at_least("stage1_rounds", cfg.stage1_rounds, 0, "the rounds of stage one (two-stage methods need >= 1)")
    at_least("eval_every", cfg.eval_every, 1, "evaluate every this many rounds (1: every round; the last is "
             "always evaluated)")
    if not 0 <= cfg.seed < SEED_LIMIT:
        raise ConfigError("seed", cfg.seed, f"must lie in [0, 2^32 = {SEED_LIMIT}): the draws are keyed on the "
                          "seed's low 32 bits, so a larger or negative seed would repeat another seed's draws")
    if not 0.0 < cfg.participation <= 1.0:
        raise ConfigError("participation", cfg.participation, "must lie in (0, 1]: the share of clients per round")
    if not (math.isfinite(cfg.exchange_mb) and cfg.exchange_mb >= 0):
        raise ConfigError("exchange_mb", cfg.exchange_mb, "must be a finite number of MiB >= 0 (0: gather the "
                          "round's models all at once)")
    t = cfg.train
    finite("train.lr", t.lr, "must be a finite number > 0 (the default: 0.08)")
    if not 0.0 < t.lr_decay <= 1.0:
        raise ConfigError("train.lr_decay", t.lr_decay, "must lie in (0, 1]: lr of round t is lr * lr_decay^(t-1) "
                          "(1: a constant lr; the default: 0.99)")
    at_least("train.lr_decay_every", t.lr_decay_every, 1, "rounds between two lr decays (1: every round; FPFC's "
             "official code decays x0.9 every 5 rounds)")
    if not 0.0 <= t.momentum < 1.0:
        raise ConfigError("train.momentum", t.momentum, "must lie in [0, 1) (0: plain SGD; the default: 0.9)")
    at_least("train.batch_size", t.batch_size, 1, "samples per local SGD step")
    at_least("train.local_epochs", t.local_epochs, 1, "passes over a client's training set per round")
    w = cfg.wandb
    bad = sorted(set(WANDB_PROJECT_CHARS) & set(w.project))
    if bad or len(w.project) > 128:
        raise ConfigError("wandb.project", w.project, "W&B takes a project name of at most 128 characters, none of "
                          f"them {' '.join(WANDB_PROJECT_CHARS[:-1])} or {WANDB_PROJECT_CHARS[-1]} (for ENTITY/PROJECT "
                          "write wandb.entity=ENTITY wandb.project=PROJECT)")
    if not isinstance(w.tags, list) or not all(isinstance(x, str) and 1 <= len(x) <= 64 for x in w.tags):
        raise ConfigError("wandb.tags", w.tags, "must be a list of strings of 1 to 64 characters (W&B's limit), e.g. "
                          "wandb.tags=[panm,cifar]")
    net = cfg.network
    at_least("network.degree", net.degree, 1, "neighbours of each client in the graph")
    if not 0.0 < net.p_edge <= 1.0:
        raise ConfigError("network.p_edge", net.p_edge, "must lie in (0, 1]: the probability of each edge of an "
                          "erdos_renyi graph")
    if not 0.0 <= net.rewire <= 1.0:
        raise ConfigError("network.rewire", net.rewire, "must lie in [0, 1]: the probability that a small_world "
                          "ring edge is rewired")
    at_least("network.redraw_every", net.redraw_every, 0, "rounds between two graphs (0: one graph for the run)")
    if not 0.0 <= net.p_offline < 1.0:
        raise ConfigError("network.p_offline", net.p_offline, "must lie in [0, 1): the probability that a client is "
                          "offline in a round (1 would leave every round empty)")
    if not 0.0 <= net.stragglers < 1.0:
        raise ConfigError("network.stragglers", net.stragglers, "must lie in [0, 1): the probability that a client "
                          "straggles in a round")
    if not 0.0 < net.straggler_work <= 1.0:
        raise ConfigError("network.straggler_work", net.straggler_work, "must lie in (0, 1]: the share of its "
                          "steps a straggler completes")
    if not 0.0 <= net.p_drop < 1.0:
        raise ConfigError("network.p_drop", net.p_drop, "must lie in [0, 1): the probability that a model sent is "
                          "lost")
    if not 0.0 <= cfg.attack.fraction < 0.5:
        raise ConfigError("attack.fraction", cfg.attack.fraction, "must lie in [0, 0.5): the share of attackers "
                          "(from half on they are no minority)")
    finite("attack.scale", cfg.attack.scale, "must be a finite number > 0 (sign_flip: the reversed update's "
           "factor; gaussian: the noise's std)")
    if net.p_offline > 0 and net.availability:
        raise ConfigError("network.availability", net.availability, "gives who is online itself: set "
                          "network.p_offline=0, or leave network.availability empty")
    at_least("checkpoint_every", cfg.checkpoint_every, 0,
             "rounds between checkpoints (0: by the clock, every 5 minutes or 50x the last checkpoint's cost; "
             "always at the end and on SIGUSR1/SIGTERM)")
    finite("collective_timeout", cfg.collective_timeout,
           "must be a finite number of seconds > 0 (how long a rank waits for the others in a collective)")
    finite("startup_timeout", cfg.startup_timeout,
           "must be a finite number of seconds > 0 (how long the processes of a run wait for each other to start)")
