#!/usr/bin/env bash
# Issue 48's results (docs/results_dynamics.md): eleven methods on Fashion-MNIST with 4 rotations
# (configs/fmnist_rotation2.yaml with data.num_clusters=4: n = 100 clients of 200 images, 300 rounds, T1 = 100,
# l = 10, k = 5) when the clusters are not fixed:
#   (a) drift: at round 150, 25% of the clients move to another rotation (data.drift_round, data.drift_fraction);
#   (b) join:  25% of the clients are absent until round 150, then join from the run's initial model
#       (network.join_round, network.join_fraction, network.join_init=initial).
# Methods that keep one model per cluster get 4 (the true number).
#
#   SEEDS="0" OUT=runs/dynamics bash experiments/dynamics.sh       # both conditions, then the tables
#   SET=drift bash experiments/dynamics.sh                          # (a) only; SET=join likewise
#   SET=drift METHODS=panm_grad EXTRA=panm.hnm_alpha=0.5 OUT=runs/dynamics_hnm05 bash experiments/dynamics.sh
#                                                                   # some methods (METHODS) with a key
#
# LANES runs at once (default 1; THREADS threads each, default 1 on a CPU, leaving the other core free); a run
# whose summary.json exists is skipped and a stopped one continues from its newest checkpoint (the same command
# again), so an interrupted sweep resumes. EXTRA adds overrides to every run (e.g. EXTRA="device=cuda").
set -euo pipefail
SEEDS=${SEEDS:-0}
OUT=${OUT:-runs/dynamics}
THREADS=${THREADS:-1}
LANES=${LANES:-1}
SET=${SET:-all}
EXTRA=${EXTRA:-}
FEDCLUST=${FEDCLUST:-fedclust}
export OUT THREADS EXTRA FEDCLUST
. "$(dirname "$0")/sweep_lib.sh"

read -r -a METHODS <<< "${METHODS:-random oracle panm_grad panm_loss pens dac ifca dfca facade dpfl cobo}"
DRIFT="drift data.drift_round=150 data.drift_fraction=0.25"
JOIN="join network.join_round=150 network.join_fraction=0.25 network.join_init=initial"
case $SET in
  drift) CONDS=("$DRIFT") ;;
  join) CONDS=("$JOIN") ;;
  all) CONDS=("$DRIFT" "$JOIN") ;;
  *) echo "SET must be drift, join or all, got '$SET'" >&2; exit 2 ;;
esac
# every method's cluster count in one line: other_sections=true (each method reads its own; docs/running.md)
PER="ifca.clusters=4 dfca.clusters=4 facade.heads=4 other_sections=true"

run_one() {   # SEED METHOD CONDITION [KEY=VALUE ...]
  local s=$1 method=$2 cond=$3; shift 3
  run_dir "$OUT/$cond/$method-s$s" configs/fmnist_rotation2.yaml data.num_clusters=4 algorithm.name="$method" "$@" \
    seed="$s" label="$method"
}
export -f run_one

mkdir -p "$OUT"
preflight configs/fmnist_rotation2.yaml data.num_clusters=4 $PER
for s in $SEEDS; do for cond in "${CONDS[@]}"; do for m in "${METHODS[@]}"; do echo "$s $m $cond $PER"; done; done; done \
  | xargs -P "$LANES" -L 1 bash -c 'run_one "$@"' _
# figures beside the table; the page's: --docs docs
python3 experiments/dynamics_table.py "$OUT" --docs "$OUT" > "$OUT/table.md"
echo "tables: $OUT/table.md"
