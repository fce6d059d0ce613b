#!/usr/bin/env bash
# Issue 46, part 4 (docs/results_fmnist.md, "The PANM offset"): is the 1.4-2.1-point offset of every method
# below the PANM paper's Table 2 (Local 76.24, Random 85.94, PANMGrad 86.88) an evaluation protocol?
# Local, Random and PANMGrad on configs/fmnist_rotation2.yaml (the paper's setting: n = 100, 200 images,
# 2 rotations, 300 rounds) under each input scaling (data.normalize: standard, unit = x/255, symmetric =
# (x/255 - 0.5)/0.5), each run twice:
#   v0:  no validation split: the final round and each client's best test round (read from the records);
#   v20: 20% of each client's training images held out (data.validation=0.2): each client's test accuracy at
#        its best-validation round (summary.json's best_validation_accuracy), as PENS's code keeps its checkpoint.
# Then the table (experiments/panm_offset_table.py).
#
#   SEEDS="0 1 2" OUT=runs/offset bash experiments/panm_offset.sh
#   METHODS="local" NORMS="unit" VALS="0" bash experiments/panm_offset.sh    # a part of the grid
#
# Runs one at a time (THREADS threads, default 1); a finished run is skipped and a stopped one continues from
# its checkpoint, so the same command again resumes the sweep. EXTRA adds overrides to every run.
set -euo pipefail
SEEDS=${SEEDS:-0}
OUT=${OUT:-runs/offset}
THREADS=${THREADS:-1}
METHODS=${METHODS:-local random panm_grad}
NORMS=${NORMS:-standard unit symmetric}
VALS=${VALS:-0 20}
EXTRA=${EXTRA:-}
FEDCLUST=${FEDCLUST:-fedclust}
CONFIG=configs/fmnist_rotation2.yaml
export OUT THREADS EXTRA FEDCLUST
. "$(dirname "$0")/sweep_lib.sh"

preflight "$CONFIG" data.normalize=symmetric data.validation=0.2
for s in $SEEDS; do for m in $METHODS; do for norm in $NORMS; do for v in $VALS; do
  run_dir "$OUT/$norm/v$v/$m-s$s" "$CONFIG" algorithm.name="$m" data.normalize="$norm" \
    data.validation="$(python3 -c "print($v / 100)")" seed="$s" label="$m"
done; done; done; done
python3 experiments/panm_offset_table.py "$OUT" > "$OUT/table.md"
echo "table: $OUT/table.md"
