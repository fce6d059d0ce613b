#!/usr/bin/env bash
# papers/001 Table 2, Fashion-MNIST column (SPEC §7), plus the centralized
# rivals of issue 4, on configs/fmnist_rotation2.yaml (n = 100, 200 images,
# rotations {0°, 180°}, l = 10, k = 5, 300 rounds), then the results table.
#
#   SEEDS="0 1 2" OUT=runs/fmnist bash experiments/reproduce_fmnist.sh           # everything
#   SET=p2p bash experiments/reproduce_fmnist.sh      # the seven of Table 2, and PENS's two other counts
#   SET=central bash experiments/reproduce_fmnist.sh  # FedAvg, IFCA (c = 2), CFL, FedGroup, FPFC
#   SET=custom SPECS_LINES=$'cfl-e3.2 algorithm.name=cfl cfl.eps2=3.2\n...' bash experiments/reproduce_fmnist.sh
#
# LANES runs go at once (default 2, one thread each on a CPU: THREADS); a run
# whose summary.json exists is skipped, so an interrupted sweep resumes; a run another sweep is running is
# refused (its directory is locked) and its log, appended to, keeps both.
# EXTRA adds config overrides to every run (e.g. EXTRA="device=cuda");
# FEDCLUST is the command (default: fedclust; e.g. "python3 -m fedclust").
set -euo pipefail
SEEDS=${SEEDS:-0}
OUT=${OUT:-runs/fmnist}
THREADS=${THREADS:-1}
LANES=${LANES:-2}
SET=${SET:-all}
EXTRA=${EXTRA:-}
FEDCLUST=${FEDCLUST:-fedclust}
export OUT THREADS EXTRA FEDCLUST

# TAG [KEY=VALUE ...]: TAG names the run directory and its label in the table
P2P=("panm_loss algorithm.name=panm_loss" "pens algorithm.name=pens" "panm_grad algorithm.name=panm_grad"
     "random algorithm.name=random" "oracle algorithm.name=oracle" "fixtopology algorithm.name=fixtopology"
     "local algorithm.name=local" "pens[drawn_and_selected] algorithm.name=pens pens.count=drawn_and_selected"
     "pens[selected] algorithm.name=pens pens.count=selected")
CENTRAL=("fpfc algorithm.name=fpfc" "ifca algorithm.name=ifca ifca.clusters=2" "fedavg algorithm.name=fedavg"
         "cfl algorithm.name=cfl" "fedgroup algorithm.name=fedgroup")
case $SET in
  p2p) SPECS=("${P2P[@]}") ;;
  central) SPECS=("${CENTRAL[@]}") ;;
  all) SPECS=("${P2P[@]}" "${CENTRAL[@]}") ;;
  custom) mapfile -t SPECS <<< "${SPECS_LINES:?SET=custom needs SPECS_LINES, one 'TAG KEY=VALUE ...' per line}" ;;
  *) echo "SET must be p2p, central, all or custom, got '$SET'" >&2; exit 2 ;;
esac

run_one() {   # SEED TAG [KEY=VALUE ...]
  local s=$1 tag=$2; shift 2
  [ -f "$OUT/$tag-s$s/summary.json" ] && return 0
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=$THREADS $FEDCLUST run configs/fmnist_rotation2.yaml "$@" seed="$s" label="$tag" \
    out="$OUT/$tag-s$s" progress=false $EXTRA >> "$OUT/$tag-s$s.log" 2>&1 \
    || echo "failed: $tag seed $s (see $OUT/$tag-s$s.log)"
}
export -f run_one

mkdir -p "$OUT"
for s in $SEEDS; do for spec in "${SPECS[@]}"; do echo "$s $spec"; done; done \
  | xargs -P "$LANES" -L 1 bash -c 'run_one "$@"' _
$FEDCLUST report "$OUT"/*/ --curves "$OUT/accuracy_curves.png"
