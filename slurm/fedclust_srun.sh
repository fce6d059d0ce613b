# Sourced by the job scripts in slurm/ (not submitted itself): starts one
# fedclust process per Slurm task with srun and lays out the run directory.
#
#   fedclust_srun CONFIG [KEY=VALUE ...]
#
# - out: $OUT if set, else runs/slurm/<job name>-<job id> (an array task:
#   <array job id>_<task id>).  A requeued job keeps its id, so it finds its
#   run directory and continues from the newest checkpoint (resume=auto).
#   An out=... among the arguments wins over both.
# - srun --kill-on-bad-exit=1: a task that fails takes the whole step down,
#   instead of leaving the other ranks waiting in a collective.
# - OMP_NUM_THREADS is the task's CPUs (--cpus-per-task), 1 if unset; srun gets the
#   same --cpus-per-task (SRUN_CPUS_PER_TASK).
# - Exit status 75 means the run stopped on a signal (--signal=USR1@...,
#   preemption) after writing its checkpoint (or during start-up, before
#   writing anything) and asked Slurm to requeue the job; fedclust's last line
#   says whether `scontrol requeue` succeeded.  The requeued job continues it.
# FEDCLUST_PYTHON picks the interpreter (default: python on PATH).

fedclust_job_id() {
  if [[ -n "${SLURM_ARRAY_JOB_ID:-}" && -n "${SLURM_ARRAY_TASK_ID:-}" ]]; then
    echo "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
  else
    echo "${SLURM_JOB_ID:?not inside a Slurm job: submit with sbatch}"
  fi
}

fedclust_srun() {
  local config=$1; shift
  local job; job=$(fedclust_job_id)
  local out=${OUT:-runs/slurm/${SLURM_JOB_NAME:-fedclust}-$job}
  export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
  export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}   # srun no longer inherits --cpus-per-task (Slurm >= 22.05)
  echo "fedclust: $(date -u +%FT%TZ) job $job (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}," \
       "${SLURM_NTASKS:-1} tasks: $config -> $out $*"
  local rc=0
  srun --kill-on-bad-exit=1 "${FEDCLUST_PYTHON:-python}" -m fedclust run "$config" "out=$out" "$@" || rc=$?
  if (( rc == 75 )); then
    echo "fedclust: $(date -u +%FT%TZ) job $job stopped on a signal (exit 75; fedclust's line above says whether it was requeued); the next start continues $out"
  fi
  return $rc
}
