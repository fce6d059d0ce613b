#!/usr/bin/env bash
# papers/001 Table 2, Fashion-MNIST column (SPEC §7): the seven peer-to-peer
# methods on configs/fmnist_rotation2.yaml (n = 100, 200 images, rotations
# {0°, 180°}, l = 10, k = 5, 300 rounds), then the results table.
#
#   SEEDS="0 1 2" OUT=runs/fmnist bash bench/reproduce_fmnist.sh
#
# On a CPU the methods run in two lanes of one thread each.
set -euo pipefail
SEEDS=${SEEDS:-0}
OUT=${OUT:-runs/fmnist}
THREADS=${THREADS:-1}
lane() {
  for alg in "$@"; do
    for s in $SEEDS; do
      [ -f "$OUT/$alg-s$s/summary.json" ] && continue
      OMP_NUM_THREADS=$THREADS fedclust run configs/fmnist_rotation2.yaml algorithm.name="$alg" seed="$s" \
        out="$OUT/$alg-s$s" progress=false > "$OUT/$alg-s$s.log" 2>&1 || echo "failed: $alg seed $s (see $OUT/$alg-s$s.log)"
    done
  done
}
mkdir -p "$OUT"
lane panm_loss local fixtopology &
lane pens panm_grad random oracle &
wait
fedclust report "$OUT"/*/ --curves "$OUT/accuracy_curves.png"
