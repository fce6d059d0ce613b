"""FPFC, clustered federated learning by nonconvex pairwise fusion (Yu, Liu,
Sun & Wang, AAAI 2023 student abstract; full version arXiv 2211.04218), as
the server algorithm ``fpfc``: ADMM on ``Σ_i f_i(ω_i) + 1/(2m) Σ_{i,j}
g(‖ω_i − ω_j‖, λ)`` with g the SCAD penalty, over the pairwise differences
``θ_ij = ω_i − ω_j``; clients whose ``‖θ_ij‖ ≤ ν`` share a cluster.  What
fedclust runs, its keys and why: docs/algorithms.md, "FPFC".

A package of one part a module, each name re-exported here
(``fedclust.algorithms.fpfc.NAME``):

- :mod:`~fedclust.algorithms.fpfc.pairs`: the pairs i < j, their count, chunks of pairs;
- :mod:`~fedclust.algorithms.fpfc.penalty`: SCAD, its surrogate, Theorem 1's checks, the closed-form θ-step;
- :mod:`~fedclust.algorithms.fpfc.reference`: the server step in Algorithm 1's literal ``[E, P]`` layout, the
  reference the tests hold the compact one to;
- :mod:`~fedclust.algorithms.fpfc.compact`: the compact, sharded pair state a run keeps, and its server step;
- :mod:`~fedclust.algorithms.fpfc.readout`: the clusters read off ``‖θ_ij‖`` and the models clients hold;
- :mod:`~fedclust.algorithms.fpfc.head`: head-only fusion (``fpfc.fuse=head``);
- :mod:`~fedclust.algorithms.fpfc.memory`: what a run holds, checked before it starts;
- :mod:`~fedclust.algorithms.fpfc.algorithm`: the config section, the state and the round (``Fpfc``, registered
  once, when this package is imported).

Paper: X. Yu, Z. Liu, Y. Sun, W. Wang, "Clustered Federated Learning based on Nonconvex Pairwise
Fusion", https://arxiv.org/abs/2211.04218 (AAAI 2023 student abstract: "Clustered Federated Learning
for Heterogeneous Data")
"""

from __future__ import annotations

from fedclust.algorithms.fpfc.algorithm import (
    EVALUATE,
    FUSE,
    MODES,
    Fpfc,
    FpfcConfig,
    FpfcEvaluate,
    FpfcFuse,
    FpfcMode,
    FpfcState,
)
from fedclust.algorithms.fpfc.compact import (
    add_zeta_terms_,
    compact_pair_update,
    diametric_pairs,
    from_literal,
    kept_coef,
    literal_pairs,
    pair_bounds,
    pairwise_state_bytes,
    read_norms,
    row_slots,
    shard_finish,
    shard_sweep_,
    slot_literal_index,
    slot_norm_matrix,
    slot_pairs,
    stepped_pairs,
    sum_over_ranks,
    zeta_units,
)
from fedclust.algorithms.fpfc.head import (
    average_body_,
    fused_columns,
    head_layers,
)
from fedclust.algorithms.fpfc.memory import (
    check_fpfc_memory,
    checkpoint_gather_bytes,
    fpfc_memory_need,
)
from fedclust.algorithms.fpfc.pairs import (
    CHUNK_ELEMENTS,
    n_pairs,
    pair_chunk,
    pair_index,
)
from fedclust.algorithms.fpfc.penalty import (
    check_official,
    check_penalty,
    check_theorem1,
    scad,
    scad_surrogate,
    shrink_factor,
    theorem1_breach,
    theorem1_rho_bound,
    theta_shrink,
    theta_update,
)
from fedclust.algorithms.fpfc.readout import (
    cluster_models,
    clusters_from_theta,
    held_models,
    theta_norm_matrix,
    threshold_groups,
    threshold_labels,
    threshold_models,
)
from fedclust.algorithms.fpfc.reference import (
    init_pair_state,
    pair_update,
    server_update_,
    zeta,
)

__all__ = [
    "CHUNK_ELEMENTS",
    "n_pairs",
    "pair_index",
    "pair_chunk",
    "check_penalty",
    "theorem1_rho_bound",
    "theorem1_breach",
    "check_theorem1",
    "check_official",
    "scad",
    "scad_surrogate",
    "theta_shrink",
    "shrink_factor",
    "theta_update",
    "pair_update",
    "init_pair_state",
    "server_update_",
    "zeta",
    "row_slots",
    "diametric_pairs",
    "slot_pairs",
    "slot_literal_index",
    "pairwise_state_bytes",
    "compact_pair_update",
    "pair_bounds",
    "zeta_units",
    "kept_coef",
    "add_zeta_terms_",
    "shard_sweep_",
    "sum_over_ranks",
    "shard_finish",
    "stepped_pairs",
    "read_norms",
    "slot_norm_matrix",
    "literal_pairs",
    "from_literal",
    "theta_norm_matrix",
    "clusters_from_theta",
    "threshold_groups",
    "threshold_labels",
    "threshold_models",
    "cluster_models",
    "held_models",
    "head_layers",
    "fused_columns",
    "average_body_",
    "checkpoint_gather_bytes",
    "fpfc_memory_need",
    "check_fpfc_memory",
    "FpfcMode",
    "MODES",
    "FpfcEvaluate",
    "EVALUATE",
    "FpfcFuse",
    "FUSE",
    "FpfcConfig",
    "FpfcState",
    "Fpfc",
]
