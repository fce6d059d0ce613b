#!/usr/bin/env bash
# papers/001 Table 2, Fashion-MNIST column (SPEC §7), plus the centralized
# rivals of issue 4, on configs/fmnist_rotation2.yaml (n = 100, 200 images,
# rotations {0°, 180°}, l = 10, k = 5, 300 rounds), then the results table.
#
#   SEEDS="0 1 2" OUT=runs/fmnist bash bench/reproduce_fmnist.sh           # everything
#   SET=p2p bash bench/reproduce_fmnist.sh                                 # the seven of Table 2 (+ PENS variant)
#   SET=central bash bench/reproduce_fmnist.sh                             # FedAvg, IFCA, CFL, FedGroup, FPFC
#
# A run whose summary.json exists is skipped, so an interrupted sweep resumes.
# On a CPU the runs go in two lanes of one thread each (THREADS to change).
set -euo pipefail
SEEDS=${SEEDS:-0}
OUT=${OUT:-runs/fmnist}
THREADS=${THREADS:-1}
SET=${SET:-all}

# one run: TAG [KEY=VALUE ...]; TAG names the run directory and its label in the table
one() {
  local tag=$1; shift
  for s in $SEEDS; do
    [ -f "$OUT/$tag-s$s/summary.json" ] && continue
    OMP_NUM_THREADS=$THREADS fedclust run configs/fmnist_rotation2.yaml "$@" seed="$s" label="$tag" \
      out="$OUT/$tag-s$s" progress=false > "$OUT/$tag-s$s.log" 2>&1 || echo "failed: $tag seed $s (see $OUT/$tag-s$s.log)"
  done
}
p2p_a() { one panm_loss algorithm.name=panm_loss; one local algorithm.name=local
          one fixtopology algorithm.name=fixtopology
          one "pens[drawn_and_selected]" algorithm.name=pens pens.count=drawn_and_selected; }
p2p_b() { one pens algorithm.name=pens; one panm_grad algorithm.name=panm_grad
          one random algorithm.name=random; one oracle algorithm.name=oracle; }
central_a() { one fedavg algorithm.name=fedavg; one cfl algorithm.name=cfl; one fpfc algorithm.name=fpfc; }
central_b() { one ifca algorithm.name=ifca ifca.clusters=2; one fedgroup algorithm.name=fedgroup; }

mkdir -p "$OUT"
case $SET in
  p2p) p2p_a & p2p_b & wait ;;
  central) central_a & central_b & wait ;;
  all) { p2p_a; central_a; } & { p2p_b; central_b; } & wait ;;
  *) echo "SET must be p2p, central or all, got '$SET'" >&2; exit 2 ;;
esac
fedclust report "$OUT"/*/ --curves "$OUT/accuracy_curves.png"
