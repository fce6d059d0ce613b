#!/usr/bin/env bash
# Issue 46, part 3: why DAC, at neighbour precision 1, ends below Oracle and Random in setting A (PANM's Table 2
# setting: configs/fmnist_rotation2.yaml, 100 clients, 2 rotations). DAC at its tau = 30 and at tau = 3, and Oracle,
# 100 rounds, seed 0; every round counted in neighbors.npz's stage-one count lists (stage1_rounds=100), then
# experiments/dac_mixing.py prints whom each client averaged with and how well the mean round mixes each cluster.
#
#   OUT=runs/dac_mixing bash experiments/dac_mixing.sh
set -euo pipefail
OUT=${OUT:-runs/dac_mixing}
THREADS=${THREADS:-1}
EXTRA=${EXTRA:-}
mkdir -p "$OUT"
for spec in "dac-tau30 algorithm.name=dac" "dac-tau3 algorithm.name=dac dac.tau=3" "oracle algorithm.name=oracle"; do
  set -- $spec; name=$1; shift
  [ -f "$OUT/$name/summary.json" ] && continue
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=$THREADS fedclust run configs/fmnist_rotation2.yaml rounds=100 stage1_rounds=100 "$@" seed=0 \
    out="$OUT/$name" progress=false figures=false eval_every=10 $EXTRA > "$OUT/$name.log" 2>&1
done
python3 experiments/dac_mixing.py "$OUT" dac-tau30 dac-tau3 oracle
