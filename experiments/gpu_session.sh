#!/usr/bin/env bash
# One lent GPU session, prepared to run once: (1) every algorithm for 3
# rounds on CUDA, (2) `fedclust bench` (engine, vectorized vs per-client loop),
# (3) `fedclust bench-rounds` (Random, PANMGrad, PANMLoss whole rounds), each
# alone on the GPU, then (4) the Fashion-MNIST sweep of experiments/reproduce_fmnist.sh
# for SEEDS in LANES parallel runs until DEADLINE seconds after the start,
# after (5, step fpfc) FPFC as its official code runs FMNIST, on the code's data
# and CNN (experiments/fpfc_official_fmnist_data.py, experiments/fpfc_official_convnet.py),
# for at most FPFC_SECONDS (its checkpoints keep what it did; run again to go on).
# Everything it measured is packed into $OUT (table.md, bench.json,
# rounds.md, runs.tar.gz, session.log).  Needs the four Fashion-MNIST IDX
# files in data/ (data.root), since the machine has no internet.
#
#   OUT=/tmp/gpu bash experiments/gpu_session.sh
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu}
DEVICE=${DEVICE:-cuda}
SEEDS=${SEEDS:-"0 1 2"}
LANES=${LANES:-8}
DEADLINE=${DEADLINE:-450}            # seconds after the start when the sweep stops (unfinished runs are dropped)
SMOKE=${SMOKE:-"clients=12 rounds=3 stage1_rounds=2 algorithm.l=4 algorithm.k=2 cfl.warmup=1 ifca.restarts=2 ifca.restart_rounds=1"}
BENCH_ARGS=${BENCH_ARGS:-""}         # e.g. --quick
ROUNDS_ARGS=${ROUNDS_ARGS:-"--cycles 2"}
SWEEP_EXTRA=${SWEEP_EXTRA:-""}       # more overrides for the sweep's runs (a dry run on a CPU: rounds=3 ...)
STEPS=${STEPS:-"smoke bench rounds fpfc sweep"}   # which parts to run
FPFC_SECONDS=${FPFC_SECONDS:-150}
SET=${SET:-all}                      # the sweep's set (experiments/reproduce_fmnist.sh), SPECS_LINES for SET=custom
export SET SPECS_LINES=${SPECS_LINES:-}
FC="python3 -m fedclust"
RUNS=${RUNS:-/tmp/fmnist_runs}
start=$(date +%s)
mkdir -p "$OUT" "$RUNS"
exec > >(tee "$OUT/session.log") 2>&1
elapsed() { echo $(( $(date +%s) - start )); }

nvidia-smi -L 2>/dev/null
python3 -c "import torch, lightning_fabric as lightning, scipy, matplotlib, yaml, tqdm
print('torch', torch.__version__, 'lightning', lightning.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"

has() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
if has smoke; then
echo "== smoke ($(elapsed) s)"
smoke() {
  $FC run configs/fmnist_rotation2.yaml algorithm.name="$1" $SMOKE device="$DEVICE" data.root=data progress=false \
    figures=false out="/tmp/smoke/$1" > "/tmp/smoke_$1.log" 2>&1 && echo "smoke ok $1" \
    || { echo "smoke FAIL $1"; tail -12 "/tmp/smoke_$1.log"; }
}
export -f smoke; export FC SMOKE DEVICE
echo local random fixtopology oracle pens panm_loss panm_grad fedavg fedprox ifca cfl fedgroup fedgrouprox fpfc \
  | tr ' ' '\n' | xargs -P 14 -I{} bash -c 'smoke {}'
fi

if has bench; then
echo "== bench ($(elapsed) s)"
# shellcheck disable=SC2086
$FC bench --device "$DEVICE" --json $BENCH_ARGS > "$OUT/bench.json" || echo "bench failed"
python3 - "$OUT/bench.json" <<'PY'
import json, sys
from fedclust.bench.local import Record, format_table
try:
    print(format_table([Record(**r) for r in json.load(open(sys.argv[1]))]))
except Exception as exc:
    print("no bench table:", exc)
PY
fi

if has rounds; then
echo "== bench-rounds ($(elapsed) s)"
# shellcheck disable=SC2086
$FC bench-rounds $ROUNDS_ARGS device="$DEVICE" data.root=data > "$OUT/rounds.md" 2> /tmp/rounds.err \
  || { echo "bench-rounds failed"; tail -12 /tmp/rounds.err; }
cat "$OUT/rounds.md"
fi

if has fpfc; then
echo "== fpfc, the code's FMNIST data and CNN, for ${FPFC_SECONDS} s at most ($(elapsed) s)"
[ -f /tmp/fpfc_fmnist.npz ] || python3 experiments/fpfc_official_fmnist_data.py /tmp/fpfc_fmnist.npz
timeout -k 5 "$FPFC_SECONDS" $FC run configs/fpfc_official_fmnist.yaml data.name=npz data.path=/tmp/fpfc_fmnist.npz \
  model=experiments/fpfc_official_convnet.py:ConvNet engine=batched device="$DEVICE" checkpoint_every=10 progress=false \
  figures=false out="$OUT/fpfc_code-s0" label="fpfc official (code's data and CNN)" > "$OUT/fpfc_code-s0.log" 2>&1
tail -2 "$OUT/fpfc_code-s0.log"
fi

left=$(( DEADLINE - $(elapsed) ))
echo "== sweep for ${left} s ($(elapsed) s)"
if has sweep && [ "$left" -gt 20 ]; then
  SEEDS="$SEEDS" LANES="$LANES" THREADS=2 OUT="$RUNS" FEDCLUST="$FC" EXTRA="device=$DEVICE data.root=data $SWEEP_EXTRA" \
    timeout -k 5 "$left" bash experiments/reproduce_fmnist.sh > /tmp/sweep.log 2>&1
  pkill -f "out=$RUNS/" 2>/dev/null; sleep 1   # only this sweep's runs
  grep failed /tmp/sweep.log | head -20
fi
echo "== pack ($(elapsed) s)"
for f in "$RUNS"/*.log; do d="${f%.log}"; [ -f "$d/summary.json" ] || { echo "unfinished: $f"; tail -3 "$f"; }; done | head -40
$FC report "$RUNS"/*/ --curves "$OUT/accuracy_curves.png" > "$OUT/table.md" 2>&1
cat "$OUT/table.md"
tar czf "$OUT/runs.tar.gz" --exclude='*-s[1-9]/figures' -C "$(dirname "$RUNS")" "$(basename "$RUNS")"
ls -la "$OUT"
echo "== done ($(elapsed) s)"
