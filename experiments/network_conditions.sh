#!/usr/bin/env bash
# Issue 34's results: PANMGrad, PANMLoss, PENS, Random and Local on Fashion-MNIST with 4 rotations
# (configs/fmnist_rotation2.yaml with data.num_clusters=4: n = 100, 200 images, 300 rounds, T1 = 100) under
# (i) communication graphs, (ii) clients offline, (iii) sign-flip attackers; then the tables and figures into OUT
# (OUT/table.md; the page's figures: python3 experiments/network_table.py OUT, which writes docs/network_*.png).
#
#   SEEDS="0" OUT=runs/network bash experiments/network_conditions.sh
#   SET=graphs bash experiments/network_conditions.sh      # only (i); SET=offline, SET=attack likewise
#   SET=offline ONLY="offline10 offline30 offline50" METHODS="panm_grad panm_loss" \
#     EXTRA=panm.silent_neighbours=keep OUT=runs/network_keep bash experiments/network_conditions.sh
#                                      # some conditions (ONLY) and methods (METHODS) only, a key on every run
#
# Conditions (the k a method averages with must fit a client's neighbours: the ring has 2, 4-regular 4):
#   complete (k = 5) | ring (k = 2) | regular, degree 4 (k = 4) | regular, degree 8 | small_world, degree 8, rewire 0.1
#   p_offline 0.1, 0.3, 0.5 | sign_flip attackers 10%, 20% (complete, k = 5)
# LANES runs at once (default 1; THREADS threads each, default 2 on a CPU); a run whose summary.json exists is
# skipped, so an interrupted sweep resumes. EXTRA adds overrides to every run (e.g. EXTRA="device=cuda").
set -euo pipefail
SEEDS=${SEEDS:-0}
OUT=${OUT:-runs/network}
THREADS=${THREADS:-2}
LANES=${LANES:-1}
SET=${SET:-all}
EXTRA=${EXTRA:-}
FEDCLUST=${FEDCLUST:-fedclust}
export OUT THREADS EXTRA FEDCLUST
. "$(dirname "$0")/sweep_lib.sh"

read -r -a METHODS <<< "${METHODS:-panm_grad panm_loss pens random local}"
GRAPHS=("complete" "ring algorithm.k=2 network.graph=ring"
        "regular4 algorithm.k=4 network.graph=regular network.degree=4"
        "regular8 network.graph=regular network.degree=8"
        "small_world8 network.graph=small_world network.degree=8 network.rewire=0.1")
OFFLINE=("offline10 network.p_offline=0.1" "offline30 network.p_offline=0.3" "offline50 network.p_offline=0.5")
ATTACK=("signflip10 attack.fraction=0.1 attack.kind=sign_flip" "signflip20 attack.fraction=0.2 attack.kind=sign_flip")
case $SET in
  graphs) CONDS=("${GRAPHS[@]}") ;;
  offline) CONDS=("complete" "${OFFLINE[@]}") ;;
  attack) CONDS=("complete" "${ATTACK[@]}") ;;
  all) CONDS=("${GRAPHS[@]}" "${OFFLINE[@]}" "${ATTACK[@]}") ;;
  *) echo "SET must be graphs, offline, attack or all, got '$SET'" >&2; exit 2 ;;
esac
if [ -n "${ONLY:-}" ]; then   # ONLY="offline10 offline30": those conditions of the SET alone
  kept=(); for c in "${CONDS[@]}"; do [[ " $ONLY " == *" ${c%% *} "* ]] && kept+=("$c"); done; CONDS=("${kept[@]}")
fi

run_one() {   # SEED METHOD CONDITION [KEY=VALUE ...]
  local s=$1 method=$2 cond=$3; shift 3
  run_dir "$OUT/$cond/$method-s$s" configs/fmnist_rotation2.yaml data.num_clusters=4 algorithm.name="$method" "$@" \
    seed="$s" label="$method"
}
export -f run_one

mkdir -p "$OUT"
for s in $SEEDS; do for cond in "${CONDS[@]}"; do for m in "${METHODS[@]}"; do echo "$s $m $cond"; done; done; done \
  | xargs -P "$LANES" -L 1 bash -c 'run_one "$@"' _
# figures beside the table; the page's: --docs docs
python3 experiments/network_table.py "$OUT" --docs "$OUT" > "$OUT/table.md"
