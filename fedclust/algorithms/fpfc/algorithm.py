"""FPFC's config section, its state and its round (the class ``fpfc``
registers): the server step of each round in the compact layout
(:mod:`fedclust.algorithms.fpfc.compact`), the clusters read off it
(:mod:`fedclust.algorithms.fpfc.readout`).

Paper: X. Yu, Z. Liu, Y. Sun, W. Wang, "Clustered Federated Learning based on Nonconvex Pairwise
Fusion", https://arxiv.org/abs/2211.04218 (AAAI 2023 student abstract: "Clustered Federated Learning
for Heterogeneous Data")
"""

from __future__ import annotations

import sys
import typing
from dataclasses import dataclass, field
from typing import Literal

import torch

from fedclust.algorithms.aggregation import own, participants, trainers
from fedclust.algorithms.base import Algorithm, Context, RoundPlan, RoundView, RunFacts, server_result
from fedclust.algorithms.fpfc.compact import (
    diametric_pairs,
    from_literal,
    literal_pairs,
    read_norms,
    row_slots,
    shard_finish,
    shard_sweep_,
    slot_norm_matrix,
    sum_over_ranks,
)
from fedclust.algorithms.fpfc.head import average_body_, fused_columns
from fedclust.algorithms.fpfc.memory import check_fpfc_memory
from fedclust.algorithms.fpfc.pairs import n_pairs
from fedclust.algorithms.fpfc.penalty import check_official, check_theorem1
from fedclust.algorithms.fpfc.readout import clusters_from_theta, held_models, threshold_labels, threshold_models
from fedclust.algorithms.registry import register
from fedclust.errors import ConfigError
from fedclust.schema import finite, option

# fpfc.mode: "paper" runs Algorithm 1 as the paper states it and enforces Theorem 1; "official" runs it as the
# authors' code (github.com/xueyu-ubc/FPFC) does (docs/algorithms.md, FPFC, "As its official code runs it").
FpfcMode = Literal["paper", "official"]
MODES = typing.get_args(FpfcMode)
# fpfc.evaluate: what a client holds and is evaluated with (docs/algorithms.md, FPFC).
FpfcEvaluate = Literal["cluster", "own", "own_then_cluster"]
EVALUATE = typing.get_args(FpfcEvaluate)
# fpfc.fuse: what the pairs fuse.  "all": the whole model (the paper; the official Synthetic code, whose model is
# one layer).  "head": the model's last layer only, the body averaged over the round's participants (the official
# LABELSWAP code for MNIST/FMNIST, FLAlgorithms/FPFC.py; docs/algorithms.md, FPFC).
FpfcFuse = Literal["all", "head"]
FUSE = typing.get_args(FpfcFuse)


@dataclass
class FpfcConfig:
    """The ``fpfc`` section; why the defaults: docs/algorithms.md, FPFC, "Defaults from Theorem 1"."""

    lam: float = option(2.0, "lambda of the SCAD fusion penalty, > 0")
    a: float = option(3.7, "SCAD's a, > 1 (Fan & Li 2001: 3.7)")
    xi: float = option(0.5, "width of the smooth surrogate, in (0, lam)")
    rho: float = option(10.0, "ADMM penalty, also the local proximal weight; > max(2 lam/xi, 2/(a-1)) (FPFC "
                              "paper Theorem 1)")
    nu: float = option(0.5, "||theta_ij|| <= nu puts i and j in one cluster, >= 0 (paper: in [xi, 0.5])")
    scale_to_model: bool = option(True, "read lam, xi and nu in units of round 1's mean update norm")
    mode: FpfcMode = option("paper", "paper: Algorithm 1 as the paper states it, Theorem 1 enforced; official: as the "
                                "authors' code runs it (Theorem 1 only warned about, pairs with both ends "
                                "participating stepped twice, clusters read as its threshold(): equal lists of "
                                "||theta_ij|| < nu)",
        doc=("`paper`: Algorithm 1 as the paper states it, Theorem 1's `rho > max(2·lam/xi, 2/(a−1))` "
            "required; `official`: as the authors' code (`xueyu-ubc/FPFC`) runs it: a breach of Theorem "
            "1 is a printed warning naming the values (the code runs `rho = 1` where the bound is "
            "1200), `rho·(a−1) > 1` is still required, a pair of two participants is stepped twice in a "
            "round, and clusters are read as the code's `threshold()` (distinct lists of `‖θ_ij‖ < nu`)"))
    evaluate: FpfcEvaluate = option("cluster", "what a client holds and is evaluated with: cluster (its cluster's mean "
                                      "model), own (its own omega_i; the official MNIST/FMNIST code), "
                                      "own_then_cluster (own omega_i, its cluster's mean in the last round; the "
                                      "official Synthetic code)",
        doc=("what an FPFC client holds and is evaluated with: `cluster` (its cluster's mean model), "
            "`own` (its own `ω_i`; the code's MNIST/FMNIST runs), `own_then_cluster` (its own `ω_i`, "
            "and its cluster's mean in the last round; the code's Synthetic run). Training is the same "
            "under all three"))
    fuse: FpfcFuse = option("all", "what the pairs fuse: all (the whole model) or head (the model's last layer, with "
                              "the local proximal term on it alone; the body is the round's participants' plain "
                              "mean: the official MNIST/FMNIST code)",
        doc=("what FPFC's pairs fuse: `all`, the whole model; `head`, the model's last layer only (its "
            "tensors as the flat layout lists them, e.g. the MLP's `fc3.weight`, `fc3.bias`; refused "
            "for a model whose last tensor belongs to no submodule), which alone carries the local "
            "proximal term, while the body is the plain mean of the round's participants, handed to "
            "them only: as the official MNIST/FMNIST code (`configs/fpfc_official_fmnist.yaml`); θ and "
            "ζ then cover only the head's columns"))
    reset_theta: bool = option(False, "false: a pair neither of whose ends takes part in a round keeps its theta "
                                      "(Algorithm 1); true: it reads theta = 0, its v kept, until it is stepped "
                                      "again (the official MNIST/FMNIST code's server makes a fresh zero theta "
                                      "every round); matters only with participation < 1",
        doc=("`false`: a pair of FPFC clients neither of which takes part in a round keeps its θ "
            "(Algorithm 1); `true`: it reads θ = 0 in ζ and in the clusters, its v kept, until a round "
            "steps it again, as the official MNIST/FMNIST server, which makes a fresh zero θ every "
            "round (`configs/fpfc_official_fmnist.yaml`). Matters only with `participation` below 1"))

    def validate(self, cfg) -> None:
        if self.mode == "official":
            warning = check_official(self.lam, self.a, self.xi, self.rho)
            if warning:
                print(f"fedclust: warning: {warning}", file=sys.stderr)
        else:
            check_theorem1(self.lam, self.a, self.xi, self.rho)
        if self.reset_theta and cfg.participation >= 1:
            print("fedclust: warning: fpfc.reset_theta=true changes nothing with participation = 1 (every pair is "
                  "stepped every round); set participation below 1, as the official code's 0.5", file=sys.stderr)
        finite("fpfc.nu", self.nu, "the cluster threshold must be a finite number >= 0 (paper: in [xi, 0.5])",
               strict=False)


@dataclass
class FpfcState:
    """The server's state in the compact layout (:func:`shard_sweep_`): θ
    and one scalar c per pair, ``v = c·θ``, the pairs split between the
    clients' rows; computed from the gathered ω.  :attr:`theta` and :attr:`v`
    give Algorithm 1's literal ``[E, P]`` pair arrays where this rank holds
    every client.  With ``fpfc.reset_theta`` a pair the last round did not
    step keeps its last θ here (v = c·θ), and reads as θ = 0 (:func:`read_norms`)."""

    # Every field is given whenever an FpfcState is made: none has a default.  zeta and theta_rows are client
    # rows, as base.client_rows() marks them, written out as the field() call it makes so that type checkers
    # see fields without a default.
    omega: torch.Tensor                       # [n, P] every client's latest ω
    zeta: torch.Tensor = field(metadata={"rows": "client"})        # [C, P] ζ_i of this rank's clients
    theta_rows: torch.Tensor = field(metadata={"rows": "client"})  # [C, K, P] θ of its clients' pairs (slot_pairs)
    theta_diam: torch.Tensor                  # [D, P] θ of the diametric pairs (even n), on every rank
    ratio: torch.Tensor                       # [E] float64 c of every pair, v = c·θ (slot_pairs' order)
    norms: torch.Tensor                       # [E] float64 ‖θ‖ of every pair
    scale: float | None                       # u_1 (1.0 without scale_to_model); None until round 1 sets it
    labels: torch.Tensor                      # [n] int64 clusters read off ‖θ_ij‖ <= ν

    @property
    def theta(self) -> torch.Tensor:
        """θ ``[E, P]`` in the literal layout (:func:`literal_pairs`)."""
        return literal_pairs(self.theta_rows, self.theta_diam, self.ratio)[0]

    @property
    def v(self) -> torch.Tensor:
        """v ``[E, P]`` in the literal layout (:func:`literal_pairs`)."""
        return literal_pairs(self.theta_rows, self.theta_diam, self.ratio)[1]


@register
@dataclass
class Fpfc(Algorithm):
    """FPFC's round (FPFC paper Algorithm 1; docs/algorithms.md, "FPFC")."""

    fpfc: FpfcConfig = field(default_factory=FpfcConfig)
    participation: float = 1.0
    rounds: int = 0            # the run's last round (fpfc.evaluate=own_then_cluster reads the clusters there)
    prox_layers: tuple[str, ...] | None = None   # fpfc.fuse=head: the head's tensors (None: the whole model)
    first: int = 0             # the pairs fuse columns first .. P - 1 (fpfc.fuse=head: the head's); 0 .. first - 1
    #                            (the body) are averaged over the participants

    name = "fpfc"
    report_position = 13
    sections = {"fpfc": FpfcConfig}
    paper_results = {("synthetic", None, 4): (89.46, 0.04)}

    @classmethod
    def from_config(cls, cfg, facts: RunFacts) -> "Fpfc":  # type: ignore[override]  # takes the run's facts (registry.build passes them to a from_config that names them)
        prox_layers, first = fused_columns(cfg, facts.layout)
        return cls(cfg.fpfc, cfg.participation, cfg.rounds, prox_layers, first)

    @classmethod
    def check_run(cls, cfg, facts: RunFacts) -> None:
        check_fpfc_memory(cfg, facts)

    def init(self, ctx: Context) -> FpfcState:
        """ω_i^0 all equal (w0), ζ_i^0 = ω_i^0, θ^0 = 0, v^0 = 0 (c = 0); ζ and
        θ over the fused columns (``fpfc.fuse=head``: the head's)."""
        n, w0 = ctx.n, ctx.w0.detach()
        P, C, E = w0.numel() - self.first, len(ctx.client_ids), n_pairs(n)
        return FpfcState(omega=w0.expand(n, -1).clone(), zeta=w0[self.first:].expand(C, -1).clone(),
                         theta_rows=torch.zeros(C, row_slots(n), P, dtype=w0.dtype, device=w0.device),
                         theta_diam=torch.zeros(diametric_pairs(n), P, dtype=w0.dtype, device=w0.device),
                         ratio=torch.zeros(E, dtype=torch.float64, device=w0.device),
                         norms=torch.zeros(E, dtype=torch.float64, device=w0.device),
                         scale=None, labels=torch.zeros(n, dtype=torch.int64, device=w0.device))

    def plan(self, state: FpfcState, ctx: Context, round_: int, models: torch.Tensor):
        """Client i trains from its own ω_i with the proximal term ``ρ/2‖ω − ζ_i‖²``
        (Algorithm 1 step 3: ``ω ← ω − α[∇f_i(ω) + ρ(ω − ζ_i)]``); with
        ``fpfc.fuse=head`` on the head alone, the body trains plain (the
        official LABELSWAP code's ``FPFC.client``)."""
        start = own(ctx, state.omega)
        # only participants' training is read
        trains = trainers(ctx.seed, round_, ctx.n, self.participation, ctx.online(round_))
        if self.prox_layers is None:
            return state, RoundPlan(start=start, anchor=state.zeta, mu=self.fpfc.rho, trains=trains)
        anchor = start.clone()   # the body's columns are never read (no proximal term there)
        anchor[:, self.first:] = state.zeta
        return state, RoundPlan(start=start, anchor=anchor, mu=self.fpfc.rho, prox_layers=self.prox_layers,
                                trains=trains)

    def aggregate(self, state: FpfcState, ctx: Context, view: RoundView):
        """Participants' ω become their trained models; then each rank steps
        its clients' pairs and the diametric ones (:func:`shard_sweep_`), one
        all-reduce sums the exact ζ terms and shares every pair's c and ‖θ‖,
        and every rank reads the clusters off ‖θ_ij‖ ≤ ν (official mode: as
        the authors' code, :func:`threshold_labels`).  A client holds, and is evaluated with, the model
        ``fpfc.evaluate`` names (:func:`held_models`).  ``fpfc.fuse=head``: the
        pairs and ζ cover the head's columns; the participants' bodies become
        their plain mean (:func:`average_body_`; the pairs never read the
        body, so that it follows their step, as in the code, changes nothing).
        ``fpfc.reset_theta``: the pairs not stepped read θ = 0 in ζ and the
        clusters (:func:`kept_coef`, :func:`read_norms`)."""
        f, after, head = self.fpfc, view.whole_after(), self.first
        active = participants(ctx.seed, view.round, ctx.n, self.participation, after.device, ctx.online(view.round))
        scale = state.scale
        if scale is None:   # u_1 = participants' mean ‖ω_i^1 − ω_i^0‖, fused columns: λ, ξ and ν in its units
            moved = after[active] - state.omega[active]
            moved = moved[:, head:] if head else moved
            scale = float(moved.norm(dim=1).mean()) if f.scale_to_model else 1.0
            if not scale > 0:
                raise ValueError("FPFC: no client moved in round 1 (mean update norm 0); "
                                 "check train.lr, or set fpfc.scale_to_model=false")
        lam, xi, nu = f.lam * scale, f.xi * scale, f.nu * scale
        omega = average_body_(torch.where(active[:, None], after, state.omega), active, head)
        fused = omega[:, head:].contiguous() if head else omega
        first, count = ctx.own_rows.start, len(ctx.client_ids)
        official = f.mode == "official"
        buffer = shard_sweep_(fused, state.theta_rows, state.theta_diam, state.ratio, state.norms, first, active,
                              lam, f.a, xi, f.rho, twice=official, reset=f.reset_theta)
        zeta_own = shard_finish(sum_over_ranks(buffer, ctx.all_reduce), fused, state.ratio, state.norms, first, count)
        del fused
        del buffer
        norms = slot_norm_matrix(read_norms(state.norms, ctx.n, active, f.reset_theta), ctx.n)
        if official:   # the code's threshold(): groups of equal neighbour lists, means taken group after group
            labels = threshold_labels(norms, nu)
            held = held_models(ctx, omega, labels, f.evaluate, view.round == self.rounds,
                               means=lambda: threshold_models(omega, norms, nu))
        else:
            labels = clusters_from_theta(norms, nu)
            held = held_models(ctx, omega, labels, f.evaluate, view.round == self.rounds)
        state = FpfcState(omega=omega, zeta=zeta_own, theta_rows=state.theta_rows, theta_diam=state.theta_diam,
                          ratio=state.ratio, norms=state.norms, scale=scale, labels=labels)
        return state, server_result(ctx, held, labels, active.to(torch.float64), int(active.sum()))

    def upgrade_state(self, clients: dict, server: dict, n: int) -> None:
        """Checkpoints that kept θ and v as literal ``[E, P]`` pair arrays: now the compact layout (θ rows per
        client, one c per pair, v = c·θ: :func:`from_literal`)."""
        if "v" not in server:
            return
        theta, v = server.pop("theta"), server.pop("v")
        try:
            rows, diam, ratio, norms = from_literal(theta, v, n, 0, n, self.fpfc.rho)
        except ValueError as exc:
            raise ConfigError("resume", "fpfc checkpoint", f"its pair state cannot be converted to the compact "
                              f"layout ({exc}); start afresh with overwrite=true") from exc
        clients["theta_rows"] = rows
        server.update(theta_diam=diam, ratio=ratio, norms=norms)

    def load_state_dict(self, ctx: Context, saved: dict) -> FpfcState:
        """The state from a checkpoint, built from the saved tensors alone (no
        zero state of the same size first)."""
        server = dict(saved["server"])
        width = server["theta_diam"].shape[-1]
        want = int(ctx.w0.numel()) - self.first
        if width != want:
            raise ConfigError("fpfc.fuse", self.fpfc.fuse, f"the checkpoint's pair state covers {width} columns but "
                              f"fpfc.fuse={self.fpfc.fuse} fuses {want}; resume with the fpfc.fuse the run started "
                              f"with, or start afresh with overwrite=true")
        return FpfcState(**saved["clients"], **server)

