# Shared by the sweep scripts of experiments/ (sourced, not run): one fedclust run per output folder.
#   OUT THREADS EXTRA FEDCLUST   read from the environment (the calling script sets and exports them)
#
# run_dir DIR CONFIG [KEY=VALUE ...]: runs CONFIG with the overrides into DIR (log: DIR.log) with THREADS
# threads, unless DIR/summary.json exists; a stopped run continues from its newest checkpoint (fedclust run's
# own resume), so the same sweep again finishes what is left. A failed run is said in one line and the sweep
# goes on.
# preflight CONFIG [KEY=VALUE ...]: stops the sweep before its first run when fedclust cannot start or refuses
# the config (else every run would fail in turn).

run_dir() {
  local dir=$1 config=$2; shift 2
  [ -f "$dir/summary.json" ] && return 0
  mkdir -p "$(dirname "$dir")"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=$THREADS $FEDCLUST run "$config" "$@" out="$dir" progress=false $EXTRA >> "$dir.log" 2>&1 \
    || echo "failed: $dir (see $dir.log)"
}

preflight() {
  # shellcheck disable=SC2086
  $FEDCLUST check "$@" $EXTRA > /dev/null || { echo "preflight: '$FEDCLUST check $*' failed; nothing run" >&2; exit 2; }
}
export -f run_dir
