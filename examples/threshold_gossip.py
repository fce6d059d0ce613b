"""Threshold gossip: an algorithm written outside fedclust, as a template.

Each round, every client averages its model with all the peers whose
PANMGrad similarity (PANM paper Eq. 6: a mix, weighted by
``panm.alpha``, of the cosine of the two clients' updates and the cosine
of their distances from the initial weights) is above
``threshold_gossip.threshold``.

Run it (one process, or under torchrun with several):

    fedclust run configs/fmnist_rotation2.yaml plugins=[examples/threshold_gossip.py] \\
        algorithm.name=threshold_gossip threshold_gossip.threshold=0.3

One file holds all of it, in this order: the config section (its keys),
the state (what the algorithm carries from round to round, saved in
checkpoints), and the algorithm (how the runner builds it, what it declares
it needs, what it does each round).  ``@register`` makes it selectable; the
``plugins`` key imports the file.  See "Adding an algorithm" in the README
and :mod:`fedclust.algorithms.base` for the whole interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedclust.algorithms.base import Context, PeerAlgorithm, RoundView, client_rows
from fedclust.algorithms.registry import register
from fedclust.algorithms.similarity import grad_similarity
from fedclust.errors import ConfigError
from fedclust.schema import option


# ----------------------------------------------------------------------------
# 1. The config section: every field is a key, here threshold_gossip.threshold.
# option(default, help) gives its default and the one line `fedclust check --keys`
# prints; the config file, the overrides and a resumed run's saved config set it.


@dataclass
class ThresholdConfig:
    threshold: float = option(0.5, "average with the peers whose PANMGrad similarity is above this, in [-1, 1]")

    def validate(self, cfg) -> None:
        """Called once, when the config is loaded (before any data is read).
        ``cfg`` is the whole config, for checks that involve other keys.
        A ConfigError names the real key, the bad value and the fix."""
        if not -1.0 <= self.threshold <= 1.0:
            raise ConfigError("threshold_gossip.threshold", self.threshold,
                              "must lie in [-1, 1]: it is compared with a cosine similarity")


# ----------------------------------------------------------------------------
# 2. The state: a dataclass (or None for a stateless algorithm).  A field made
# with client_rows() holds one row per client of this process ([C, ...]); a
# checkpoint gathers the rows from every process and gives each row back to
# whichever process holds that client on resume.  Any other field is server
# state, the same on every process, saved once.


@dataclass
class ThresholdState:
    peers: torch.Tensor = client_rows()   # [C, n] bool: whom each client averaged with last round
    rounds: int = 0                       # rounds run so far (server state)


# ----------------------------------------------------------------------------
# 3. The algorithm.  PeerAlgorithm: each client trains from the model it holds,
# then select() says whom it averages with; the base class does the averaging
# (one mixing-matrix product over every client's model) and the metrics.
# A server algorithm derives from Algorithm instead and defines plan() and
# aggregate() (see fedclust/algorithms/fedavg.py).


@register
@dataclass
class ThresholdGossip(PeerAlgorithm):
    alpha: float   # panm.alpha, the weight PANMGrad gives the update cosine
    # The section itself, validated (named as the section, like every built-in algorithm's):
    threshold_gossip: ThresholdConfig = field(default_factory=ThresholdConfig)

    name = "threshold_gossip"                          # algorithm.name=threshold_gossip selects it
    sections = {"threshold_gossip": ThresholdConfig}   # its keys: threshold_gossip.*
    gathers_before = True   # the similarity needs every model from before local training (view.all_before)
    # Other declarations (see fedclust.algorithms.base.Algorithm): needs_k / needs_l to use algorithm.k /
    # algorithm.l (checked for you), needs_stages for a stage one of stage1_rounds rounds.  It reads whole
    # models (view.all_after, view.all_before), so it leaves column_exchange False, the default: the config
    # check refuses exchange_mb for it.  A method that reads the models only through view.blocks() (or no
    # model at all, as one choosing peers by their reported losses, view.all_loss) sets column_exchange = True.

    @classmethod
    def from_config(cls, cfg) -> "ThresholdGossip":
        """The algorithm for a validated config, built once per run on every process."""
        return cls(alpha=cfg.panm.alpha, threshold_gossip=cfg.threshold_gossip)

    def init(self, ctx: Context) -> ThresholdState:
        """The state before round 1.  ``ctx`` holds this process's clients
        (``ctx.client_ids``, C of the n in all), the device and the seed."""
        return ThresholdState(peers=torch.zeros(len(ctx.client_ids), ctx.n, dtype=torch.bool, device=ctx.device))

    def select(self, state: ThresholdState, ctx: Context, view: RoundView):
        """Whom each of this process's clients averages with this round:
        a bool [C, n] mask (row: own client, column: any client), never True
        on the diagonal.  ``view`` holds every client's model after this
        round's local training (and, with gathers_before, before it).
        Random draws, if any, come from fedclust.rng with a stream name, so
        that every process draws the same numbers."""
        sim = grad_similarity(view.all_after, view.all_before, ctx.w0, self.alpha, own=ctx.own_rows)   # [C, n]
        peers = (sim > self.threshold_gossip.threshold) & ~ctx.self_mask
        return ThresholdState(peers=peers, rounds=state.rounds + 1), peers
