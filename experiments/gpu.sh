#!/usr/bin/env bash
# The GPU benchmark of issue 22 (and issue 20's GPU rows) in one call, writing one JSON list of records to
# $OUT/gpu.json:
#   - round records as `fedclust bench --json` writes them (model, clients, path, ms_per_round, peak_mem_mb,
#     device): vectorized engine vs the per-client loop, MLP and CNN;
#   - whole-round records of `fedclust bench-rounds` (Random, PANMGrad, PANMLoss on Fashion-MNIST, 100 clients):
#     workload fmnist_rotation2_<algorithm>_round, the median round seconds of each stage;
#   - a whole-run record: CIFAR-10-shaped generated images (an npz pool, data.name=npz), 4 rotations, PANMGrad,
#     the CNN, n = 100: workload cifar10_rotation4_panm_grad, rounds, seconds (end to end, process start included);
#     then the same run profiled by phase (experiments/profile_run.py: $OUT/profile.json, $OUT/profile.md);
#   - bench-scale records at 10,000 MLP clients (Random, PANMGrad): workload scale_<algorithm>_<clients>, with
#     PyTorch's default arithmetic and again with precision=tf32 (..._tf32), and the MLP bench rows on TF32.
# Every record carries device and torch.  Runs on a CPU too: QUICK=1 shrinks every part to seconds or minutes.
# Needs the Fashion-MNIST IDX files in data/ (data.root) for the FMNIST parts; the machine has no internet.
#
#   OUT=/tmp/gpu bash experiments/gpu.sh            # a lent GPU (about 5 minutes)
#   QUICK=1 DEVICE=cpu OUT=/tmp/q bash experiments/gpu.sh   # the same script, small, on a CPU
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-0}
FC="python3 -m fedclust"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu.log") 2>&1
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
if [[ $QUICK == 1 ]]; then
  BENCH="--quick"; ROUNDS="--rounds 3 --stage1 2"; RUN="clients=8 rounds=3 stage1_rounds=2 algorithm.l=4 algorithm.k=2 data.train_size=20 data.test_size=10"
  SCALE="--clients 200 --rounds 2"; POOL=2000; PROFILE="--skip 1 --rounds 2"
else
  BENCH=""; ROUNDS="--rounds 8 --stage1 4 --cycles 2"; RUN=""; SCALE="--clients 10000 --rounds 3"; POOL=20000
  PROFILE="rounds=110 --skip 100 --rounds 10"   # 10 rounds of stage two (T1 = 100 in configs/cifar_rotation4.yaml)
fi
nvidia-smi -L 2>/dev/null
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0), 'tf32 conv', torch.backends.cudnn.allow_tf32, 'tf32 matmul', torch.backends.cuda.matmul.allow_tf32)"

echo "== device checks ($(elapsed) s)"
# the tests that need a GPU (skipped, with the reason, elsewhere): batch orders drawn on the device
python3 -m pytest -q -p no:cacheprovider -rs tests/unit/test_engine.py -k gpu > "$OUT/checks.log" 2>&1; tail -3 "$OUT/checks.log"

echo "== bench ($(elapsed) s)"
# shellcheck disable=SC2086
$FC bench --device "$DEVICE" --json $BENCH > "$OUT/bench.json" || echo "bench failed"

echo "== bench-rounds ($(elapsed) s)"
# shellcheck disable=SC2086
$FC bench-rounds --json --algorithms random,panm_grad,panm_loss $ROUNDS device="$DEVICE" data.root=data \
  > "$OUT/rounds.json" || echo "bench-rounds failed"

echo "== CIFAR-shaped run ($(elapsed) s)"
python3 - "$OUT/cifar_pool.npz" "$POOL" <<'PY'
import sys
import numpy as np
path, n = sys.argv[1], int(sys.argv[2])
r = np.random.default_rng(0)
np.savez(path, x_train=r.integers(0, 256, (n, 3, 32, 32), dtype=np.uint8), y_train=np.arange(n) % 10,
         x_test=r.integers(0, 256, (n // 2, 3, 32, 32), dtype=np.uint8), y_test=np.arange(n // 2) % 10)
PY
t0=$(date +%s.%N)
# shellcheck disable=SC2086
$FC run configs/cifar_rotation4.yaml data.name=npz data.path="$OUT/cifar_pool.npz" model=cnn algorithm.name=panm_grad \
  device="$DEVICE" progress=false figures=false overwrite=true out="$OUT/cifar_run" $RUN > "$OUT/cifar_run.log" 2>&1 \
  || { echo "CIFAR-shaped run failed"; tail -5 "$OUT/cifar_run.log"; }
t1=$(date +%s.%N)
echo "{\"seconds\": $(python3 -c "print($t1 - $t0)")}" > "$OUT/cifar_time.json"

echo "== the CIFAR-shaped run profiled by phase ($(elapsed) s)"
# issue 47 part 2: training, gather, similarity, aggregation, evaluation, records, host work; top kernels
# shellcheck disable=SC2086
python3 experiments/profile_run.py configs/cifar_rotation4.yaml data.name=npz data.path="$OUT/cifar_pool.npz" \
  model=cnn algorithm.name=panm_grad device="$DEVICE" progress=false figures=false overwrite=true \
  out="$OUT/cifar_profile" $RUN $PROFILE --json "$OUT/profile.json" > "$OUT/profile.md" 2>&1 \
  || { echo "profile failed"; tail -5 "$OUT/profile.md"; }

echo "== bench-scale ($(elapsed) s)"
for a in random panm_grad; do
  # shellcheck disable=SC2086
  $FC bench-scale --json --algorithm "$a" $SCALE device="$DEVICE" data.root=data > "$OUT/scale_$a.json" \
    || echo "bench-scale $a failed"
done

echo "== bench-scale, precision=tf32 ($(elapsed) s)"
# the same rows on TF32 tensor cores (the precision key): issue 20's 10,000-client targets count the training
for a in random panm_grad; do
  # shellcheck disable=SC2086
  $FC bench-scale --json --algorithm "$a" $SCALE device="$DEVICE" data.root=data precision=tf32 \
    > "$OUT/scale_tf32_$a.json" || echo "bench-scale tf32 $a failed"
done
# shellcheck disable=SC2086
$FC bench --device "$DEVICE" --json --models mlp --precision tf32 $BENCH > "$OUT/bench_tf32.json" \
  || echo "bench tf32 failed"

echo "== records ($(elapsed) s)"
python3 - "$OUT" "$DEVICE" <<'PY'
import json, statistics, sys
from pathlib import Path
import torch
out, device = Path(sys.argv[1]), sys.argv[2]
name = torch.cuda.get_device_name(0) if device == "cuda" and torch.cuda.is_available() else device
common = {"device": name, "torch": torch.__version__}
def load(f):
    try:
        return json.loads((out / f).read_text())
    except Exception as exc:
        print(f"no {f}: {exc}")
        return None
records = [dict(r, **common) for r in (load("bench.json") or [])]
records += [dict(r, precision="tf32", **common) for r in (load("bench_tf32.json") or [])]
for algo, stages in (load("rounds.json") or {}).items():
    for stage, secs in stages.items():
        if secs:
            records.append(dict(workload=f"fmnist_rotation2_{algo}_round_{stage}", rounds=len(secs),
                                seconds=statistics.median(secs), **common))
summary = out / "cifar_run" / "summary.json"
if summary.exists():
    s = json.loads(summary.read_text())
    records.append(dict(workload="cifar10_rotation4_panm_grad", rounds=s["rounds_completed"], clients=s["clients"],
                        seconds=load("cifar_time.json")["seconds"], mean_round_seconds=s["mean_round_seconds"],
                        final_accuracy=s["final_accuracy"], data="generated CIFAR-shaped npz pool", **common))
for algo in ("random", "panm_grad"):
    for r in (load(f"scale_{algo}.json") or []):
        records.append(dict(r, workload=f"scale_{algo}_{r.get('clients')}", precision="default", **common))
    for r in (load(f"scale_tf32_{algo}.json") or []):
        records.append(dict(r, workload=f"scale_{algo}_{r.get('clients')}_tf32", precision="tf32", **common))
(out / "gpu.json").write_text(json.dumps(records, indent=1))
print(f"{len(records)} records in {out / 'gpu.json'}")
PY
echo "== done ($(elapsed) s)"
