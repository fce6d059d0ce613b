#!/usr/bin/env bash
# Issue 46, part 3: PANMGrad's stage one (CNI) under 30% of clients offline, a silent previous neighbour dropped
# (panm.silent_neighbours=drop, the default) or kept (keep): docs/results_network.md's setting (Fashion-MNIST,
# 4 rotations, 100 clients, k = 5, l = 10), the first 100 rounds (T1 = 100: all of stage one), seed 0; the
# neighbour precision of the lists every 10 rounds.
#
#   OUT=runs/silent bash experiments/silent_neighbours.sh
set -euo pipefail
OUT=${OUT:-runs/silent}
THREADS=${THREADS:-1}
mkdir -p "$OUT"
for rule in drop keep; do
  [ -f "$OUT/$rule/summary.json" ] && continue
  OMP_NUM_THREADS=$THREADS fedclust run configs/fmnist_rotation2.yaml data.num_clusters=4 algorithm.name=panm_grad \
    network.p_offline=0.3 panm.silent_neighbours=$rule rounds=100 stage1_rounds=100 seed=0 eval_every=10 \
    out="$OUT/$rule" progress=false figures=false > "$OUT/$rule.log" 2>&1
done
python3 - "$OUT" <<'PY'
import json, sys
for rule in ("drop", "keep"):
    rows = [json.loads(x) for x in open(f"{sys.argv[1]}/{rule}/metrics.jsonl")]
    print(rule, "precision (%):", [(r["round"], round(100 * r["neighbor_precision"], 1)) for r in rows],
          "accuracy at 100:", round(rows[-1]["accuracy"], 2))
PY
