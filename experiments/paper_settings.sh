#!/usr/bin/env bash
# Each method published since PANM in its own paper's setting, on the Fashion-MNIST analogue
# (docs/results_paper_settings.md): the client files of experiments/paper_settings_data.py, then every run of
# experiments/sets/paper_settings.txt (lines "DIR CONFIG KEY=VALUE ...", DIR under OUT), one at a time, then the
# page's tables (experiments/paper_settings_table.py).  A run whose summary.json exists is skipped, so an
# interrupted sweep resumes.
#
#   OUT=runs bash experiments/paper_settings.sh                  # about 2 hours on 2 CPU cores
#   EXTRA="device=cuda" OUT=runs bash experiments/paper_settings.sh
set -uo pipefail
OUT=${OUT:-runs}
LIST=${LIST:-experiments/sets/paper_settings.txt}
FEDCLUST=${FEDCLUST:-fedclust}
EXTRA=${EXTRA:-}
[ -f data/el_dirichlet.npz ] && [ -f data/fedspd_even_odd.npz ] || python3 experiments/paper_settings_data.py --out data
while read -r dir config rest; do
  [ -z "$dir" ] || [ -f "$OUT/$dir/summary.json" ] && continue
  mkdir -p "$(dirname "$OUT/$dir")"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=${THREADS:-2} $FEDCLUST run "$config" $rest out="$OUT/$dir" progress=false figures=false $EXTRA \
    >> "$OUT/$dir.log" 2>&1 || echo "failed: $dir (see $OUT/$dir.log)"
done < "$LIST"
python3 experiments/paper_settings_table.py "$OUT" > "$OUT/paper_settings.md" && echo "tables: $OUT/paper_settings.md"
