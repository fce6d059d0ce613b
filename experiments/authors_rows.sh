#!/usr/bin/env bash
# Issue 46, part 5: rows of the twenty-method table's setting A (configs/fmnist_rotation2.yaml, the PANM paper's
# Fashion-MNIST setting: n = 100, 2 rotations, 300 rounds) run as the methods' authors run them, beside the
# default rows of docs/results_post_panm.md; each row's keys are written here and on the page.
#   fpfc_official:       FPFC with the official code's keys (configs/fpfc_official_fmnist.yaml's fpfc section:
#                        mode=official, lam 0.4, xi 0.001, rho 1, nu 0.1 unscaled, own models evaluated, the
#                        head fused), the setting's data, training and full participation kept (so its
#                        fpfc.reset_theta=true would change nothing and is left out);
#   facade_as_reference: Facade reporting the head of lowest test loss after the final all-reduce, as the
#                        Facade benchmark (sacs-epfl/facade) reports it.
#
#   SEEDS="0" OUT=runs/authors bash experiments/authors_rows.sh
# One run at a time (THREADS threads, default 1); finished runs are skipped, stopped ones continue.
set -euo pipefail
SEEDS=${SEEDS:-0}
OUT=${OUT:-runs/authors}
THREADS=${THREADS:-1}
EXTRA=${EXTRA:-}
FEDCLUST=${FEDCLUST:-fedclust}
CONFIG=configs/fmnist_rotation2.yaml
export OUT THREADS EXTRA FEDCLUST
. "$(dirname "$0")/sweep_lib.sh"

FPFC_OFFICIAL=(algorithm.name=fpfc fpfc.mode=official fpfc.lam=0.4 fpfc.a=3.7 fpfc.xi=0.001 fpfc.rho=1.0 fpfc.nu=0.1
               fpfc.scale_to_model=false fpfc.evaluate=own fpfc.fuse=head)
FACADE_AS_REFERENCE=(algorithm.name=facade facade.heads=2 facade.report_head=lowest_test_loss
                     facade.final_allreduce=true)
preflight "$CONFIG" "${FPFC_OFFICIAL[@]}"
preflight "$CONFIG" "${FACADE_AS_REFERENCE[@]}"
for s in $SEEDS; do
  run_dir "$OUT/A/fpfc_official-s$s" "$CONFIG" "${FPFC_OFFICIAL[@]}" seed="$s" label=fpfc_official
  run_dir "$OUT/A/facade_as_reference-s$s" "$CONFIG" "${FACADE_AS_REFERENCE[@]}" seed="$s" label=facade_as_reference
done
METRICS=final_accuracy,worst_cluster_accuracy,neighbor_precision,ari
# shellcheck disable=SC2086
$FEDCLUST report "$OUT"/A/*-s*/ --metrics "$METRICS" > "$OUT/table.md"
echo "table: $OUT/table.md"
