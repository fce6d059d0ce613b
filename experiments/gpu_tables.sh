#!/usr/bin/env bash
# The result tables of issues 34 and 35 on one lent GPU, in one call: the device checks (the tests that need a
# GPU), then experiments/network_conditions.sh (SEEDS_NET, default "0 1 2", seed-major so seed 0 ends first)
# and experiments/post_panm_table.sh (both settings) side by side, LANES runs each, every run on device=cuda,
# until DEADLINE seconds after the start.  A run still going then is stopped (SIGTERM: it checkpoints) and left
# out.  Packs the finished runs (summary.json, metrics.jsonl, config.yaml, neighbors.npz, and every run's log)
# into $OUT/runs.tar.xz; the tables are made from them afterwards, on any machine:
#   python3 experiments/network_table.py runs/network > table.md
#   fedclust report runs/post_panm/*/*-s*/ --metrics final_accuracy,worst_cluster_accuracy,neighbor_precision,ari
# Needs the four Fashion-MNIST IDX files in data/ (data.root): the machine has no internet.
#
#   OUT=/tmp/g bash experiments/gpu_tables.sh                                  # a lent GPU (about 8 minutes)
#   LIST=experiments/sets/gpu_rest.txt OUT=/tmp/g bash experiments/gpu_tables.sh   # the runs of a list only
#   DEVICE=cpu DEADLINE=60 EXTRA="rounds=2 clients=8" OUT=/tmp/g bash experiments/gpu_tables.sh   # a dry run
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu}
DEVICE=${DEVICE:-cuda}
DEADLINE=${DEADLINE:-430}
LANES=${LANES:-7}
SEEDS_NET=${SEEDS_NET:-"0 1 2"}
RUNS=${RUNS:-runs}
mkdir -p "$OUT" "$RUNS"
exec > >(tee "$OUT/session.log") 2>&1
start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
nvidia-smi -L 2>/dev/null
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"

echo "== device checks ($(elapsed) s)"
if [[ $DEVICE == cuda ]]; then
  python3 -m pytest -q -p no:cacheprovider -rs tests/unit/test_engine.py -k gpu 2>&1 | tail -3
fi

echo "== sweeps ($(elapsed) s)"
export THREADS=1 LANES FEDCLUST="python3 -m fedclust" EXTRA="device=$DEVICE figures=false ${EXTRA:-}"
if [[ -n ${LIST:-} ]]; then   # only the runs of LIST, in its order: lines "DIR CONFIG KEY=VALUE ..." (DIR under RUNS)
  one() { local dir=$1 config=$2; shift 2; mkdir -p "$(dirname "$RUNS/$dir")"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 python3 -m fedclust run "$config" "$@" out="$RUNS/$dir" progress=false $EXTRA \
      >> "$RUNS/$dir.log" 2>&1 || echo "failed: $dir (see $RUNS/$dir.log)"; }
  export -f one; export RUNS
  setsid bash -c "xargs -P $LANES -L 1 bash -c 'one \"\$@\"' _ < $LIST" > "$OUT/network.log" 2>&1 &
  net=$!
  post=$net
else
  SEEDS=$SEEDS_NET OUT=$RUNS/network setsid bash experiments/network_conditions.sh > "$OUT/network.log" 2>&1 &
  net=$!
  OUT=$RUNS/post_panm setsid bash experiments/post_panm_table.sh > "$OUT/post_panm.log" 2>&1 &
  post=$!
fi
while kill -0 $net 2>/dev/null || kill -0 $post 2>/dev/null; do
  if (( $(elapsed) >= DEADLINE )); then
    echo "deadline at $(elapsed) s: stopping what is still running"
    kill -TERM -- -$net -$post 2>/dev/null
    sleep 15
    kill -KILL -- -$net -$post 2>/dev/null
    break
  fi
  sleep 5
done
wait $net $post 2>/dev/null

echo "== pack ($(elapsed) s)"
(cd "$RUNS" && {
  for s in network/*/*-s*/summary.json post_panm/*/*-s*/summary.json; do
    [ -f "$s" ] || continue
    d=$(dirname "$s")
    for f in summary.json metrics.jsonl config.yaml neighbors.npz; do [ -f "$d/$f" ] && echo "$d/$f"; done
  done
  ls network/*/*.log post_panm/*/*.log 2>/dev/null
} | tar cf - -T - | xz -6 -T0 > "$OUT/runs.tar.xz")
echo "finished runs: network $(ls "$RUNS"/network/*/*-s*/summary.json 2>/dev/null | wc -l)," \
     "post_panm $(ls "$RUNS"/post_panm/*/*-s*/summary.json 2>/dev/null | wc -l)"
grep -h "^failed" "$OUT/network.log" "$OUT/post_panm.log" 2>/dev/null | sort -u
echo "== done ($(elapsed) s)"
