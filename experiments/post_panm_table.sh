#!/usr/bin/env bash
# Issue 35's table (docs/results_post_panm.md): every method, the seed papers' and those published since PANM,
# on the same splits, then fedclust report's tables (final accuracy, the worst cluster's, neighbour precision,
# ARI) and curves.
#   (A) Fashion-MNIST, 2 rotations, PANM's Table 2 setting (configs/fmnist_rotation2.yaml: 100 clients, 200
#       images, 300 rounds, T1 = 100), SEEDS_A (default "0 1 2");
#   (B) DAC's covariate shift on Fashion-MNIST (configs/fmnist_dac_covariate.yaml: 70/20/5/5 clients rotated
#       0/180/10/350), SEEDS_B (default "0"); methods that keep one model per cluster get 4.
#
#   OUT=runs/post_panm bash experiments/post_panm_table.sh            # both settings, then the report
#   SET=A bash experiments/post_panm_table.sh                          # (A) only; SET=B likewise
#   METHODS="dpfl cobo" SEEDS_A=0 bash experiments/post_panm_table.sh  # some methods only
#
# LANES runs at once (default 1; THREADS threads each, default 2 on a CPU); a run whose summary.json exists is
# skipped, so an interrupted sweep resumes. EXTRA adds overrides to every run (e.g. EXTRA="device=cuda");
# FEDCLUST is the command (default fedclust; e.g. "python3 -m fedclust").
set -euo pipefail
OUT=${OUT:-runs/post_panm}
SEEDS_A=${SEEDS_A:-0 1 2}
SEEDS_B=${SEEDS_B:-0}
THREADS=${THREADS:-2}
LANES=${LANES:-1}
SET=${SET:-all}
EXTRA=${EXTRA:-}
FEDCLUST=${FEDCLUST:-fedclust}
export OUT THREADS EXTRA FEDCLUST
. "$(dirname "$0")/sweep_lib.sh"

SEED_METHODS=(local random fixtopology oracle pens panm_loss panm_grad fedavg fedprox ifca cfl fedgroup fedgrouprox
              fpfc)
NEW_METHODS=(dac deprl facade epidemic dfca fedspd dpfl cobo)
# METHODS="dpfl cobo": only those (the others' runs are kept elsewhere)
if [ -n "${METHODS:-}" ]; then read -r -a SEED_METHODS <<< "$METHODS"; NEW_METHODS=(); fi

run_one() {   # SETTING CONFIG SEED METHOD [KEY=VALUE ...]
  local setting=$1 config=$2 s=$3 method=$4; shift 4
  run_dir "$OUT/$setting/$method-s$s" "$config" algorithm.name="$method" "$@" seed="$s" label="$method"
}
export -f run_one

lines() {   # SETTING CONFIG "SEEDS" CLUSTERS
  local setting=$1 config=$2 seeds=$3 c=$4
  # every method's cluster count in one line: other_sections=true (each method reads its own; docs/running.md)
  local per="ifca.clusters=$c dfca.clusters=$c facade.heads=$c fedspd.clusters=$c fedgroup.groups=$c other_sections=true"
  for s in $seeds; do for m in "${SEED_METHODS[@]}" "${NEW_METHODS[@]}"; do
    echo "$setting $config $s $m $per"
  done; done
}

mkdir -p "$OUT"
{
  case $SET in A|all) lines A configs/fmnist_rotation2.yaml "$SEEDS_A" 2 ;; esac
  case $SET in B|all) lines B configs/fmnist_dac_covariate.yaml "$SEEDS_B" 4 ;; esac
} | xargs -P "$LANES" -L 1 bash -c 'run_one "$@"' _
METRICS=final_accuracy,worst_cluster_accuracy,neighbor_precision,ari
$FEDCLUST report "$OUT"/*/*-s*/ --metrics "$METRICS" > "$OUT/table.md"
$FEDCLUST report "$OUT"/*/*-s*/ --metrics "$METRICS" --curves "$OUT/curves.png" > /dev/null
echo "tables: $OUT/table.md, curves: $OUT/curves.png"
