#!/usr/bin/env bash
# Your own problem end to end (docs/own-model-and-data.md): a label-skewed split, your own model, a validation
# split for model selection, then the models taken away and evaluated, on the run's data and on new data.
# About a minute on a 2-core CPU; run from the repository root:
#
#   bash examples/take_away/run.sh            # OUT=runs/take_away by default
set -euo pipefail
OUT=${OUT:-runs/take_away}
FEDCLUST=${FEDCLUST:-fedclust}
mkdir -p "$OUT"

# 1. Fashion-MNIST in 4 rotation clusters, each client's labels drawn from Dirichlet(0.3) within its cluster,
#    clients of power-law sizes (mean 200), your own model, 20% of each client's images held out for validation.
$FEDCLUST run configs/fmnist_rotation2.yaml model=examples/own_model/model.py:TabularMLP \
  data.num_clusters=4 data.partition=dirichlet data.alpha=0.3 data.quantity_skew=2 data.validation=0.2 \
  clients=20 rounds=12 stage1_rounds=4 algorithm.name=panm_loss algorithm.l=4 algorithm.k=2 train.batch_size=32 \
  progress=false figures=false overwrite=true out="$OUT/fmnist"
python3 -c "import json, sys; s = json.load(open(sys.argv[1])); print('final', round(s['final_accuracy'], 2), \
'weighted', round(s['final_weighted_accuracy'], 2), 'best-validation', round(s['best_validation_accuracy'], 2), \
s['data_partition'])" "$OUT/fmnist/summary.json"

# 2. The models taken away: safetensors + manifest, and one client's model as a ready nn.Module.
$FEDCLUST export --trust-code "$OUT/fmnist" "$OUT/fmnist_export"   # the run names your model file
python3 - "$OUT/fmnist_export" <<'PY'
import sys

import torch

import fedclust

# trust_code: you wrote the model file this export names (fedclust never imports it otherwise)
model = fedclust.load_client_model(sys.argv[1], client=3, trust_code=True)   # your TabularMLP, eval mode
print(type(model).__name__, "for client 3:", model(torch.zeros(1, 1, 28, 28)).argmax(1).tolist())
PY

# 3. Your own clients (a file in the natural form), evaluated on the run's test data and on new test data.
python3 examples/own_data/make_clients.py --out "$OUT/own.npz" --fresh-test "$OUT/own_new.npz"
$FEDCLUST run examples/own_data/own_clients.yaml data.path="$OUT/own.npz" data.validation=0.2 rounds=12 \
  stage1_rounds=4 progress=false figures=false overwrite=true out="$OUT/own"
$FEDCLUST evaluate "$OUT/own" --json | cut -c1-120
$FEDCLUST evaluate "$OUT/own" --data "$OUT/own_new.npz"
