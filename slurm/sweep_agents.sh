#!/bin/bash
# W&B sweep agents as a job array: each array task runs one agent that takes
# one run from the sweep (wandb agent --count 1) and runs it on the task's GPU.
#
#   wandb sweep configs/sweeps/cifar_panm_k_l_srun.yaml                  # login node: prints the sweep id
#   sbatch --array=0-8 slurm/sweep_agents.sh ENTITY/PROJECT/SWEEP_ID      # 9 runs, one GPU each
#   sbatch --array=0-35%8 slurm/sweep_agents.sh ENTITY/PROJECT/SWEEP_ID   # at most 8 at a time
#   sbatch --array=0-8 --gres=gpu:4 --ntasks-per-node=4 slurm/sweep_agents.sh ENTITY/PROJECT/SWEEP_ID  # 4 ranks a run
#
# - Create the sweep from a configs/sweeps/*_srun.yaml file.  Its command
#   starts fedclust with `srun --kill-on-bad-exit=1 python -m fedclust run
#   ...`, so every run is a job step of this job, one rank per task.
# - USR1 reaches fedclust directly: --signal=USR1@180 (without B:) signals
#   the job steps, not the batch shell, and the agent runs in the batch shell
#   (checked on the tests' one-node Slurm with a stand-in agent: the step got
#   USR1, the agent did not).  3 minutes before the time limit fedclust
#   finishes its round, writes a checkpoint, marks its W&B run preempting and
#   `scontrol requeue`s this array task, which ends the job at once, agent
#   included ("CANCELLED ... DUE TO JOB REQUEUE").  W&B hands a preempted run
#   to the next agent that asks (this task's after the requeue, or
#   another's), and fedclust resumes it from its checkpoint in
#   runs/sweeps/<sweep id>/<run id>: the run directories must be on a file
#   system every node sees.  A preemption (SIGTERM) does the same.
# - Not chosen: --signal=B:USR1 with the agent relaying it.  The agent starts
#   its run in a process group of its own and passes signals on only with
#   --forward-signals, and then only to its own child (under torchrun the
#   ranks would not get it: torchrun dies of USR1, and its workers then stop
#   as on SIGTERM, after a checkpoint, but torchrun reports a failure).  A job
#   step needs no relay.
# - A sweep whose command does not start fedclust with srun gets no USR1; at
#   the time limit Slurm sends SIGTERM to everything and SIGKILL KillWait
#   (often 30 s) later, usually too soon for a checkpoint.
# - One agent per array task and --count 1: each task runs one run, so
#   --array should have as many tasks as the sweep has runs (grid: its points).
# - The agents talk to W&B's server: compute nodes need internet.  Without it:
#   python -m launch.sweep configs/sweeps/X.yaml ... (runs offline, then wandb sync).
# - OMP_NUM_THREADS is the task's CPUs (--cpus-per-task).  FEDCLUST_WANDB=...
#   picks the wandb executable (default: wandb on PATH).
# Submit from the repository root (configs and data paths are relative to it).
#SBATCH --job-name=fedclust-sweep
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --signal=USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%A_%a.out
# Your cluster's settings: delete one '#' of a line to use it ('##SBATCH' is a comment; sbatch reads
# the '#SBATCH' lines before the first command).  Options given to sbatch win over these lines:
#   sbatch -p PARTITION -A ACCOUNT --mem=32G slurm/sweep_agents.sh
##SBATCH --partition=PARTITION
##SBATCH --account=ACCOUNT
##SBATCH --mem=32G

# The Python environment that has fedclust.  sbatch passes on the environment of the shell it is
# run from (its default, --export=ALL), so an environment active there is active here; if it is not
# (or your cluster sets --export=NONE), activate it here, before set -u (activation scripts read
# unset variables), with one of:
# module load python/3.11
# source "$HOME/venvs/fedclust/bin/activate"
# eval "$(conda shell.bash hook)" && conda activate fedclust
# FEDCLUST_PYTHON is not read here: the sweep's command starts its own interpreter (python, the first
# on PATH after the lines above), and wandb is the first on PATH unless FEDCLUST_WANDB names one.
set -euo pipefail
sweep=${1:-}
if [[ -z "$sweep" || "$sweep" == -* ]]; then
  echo "fedclust: error: give the sweep as the first argument: sbatch --array=0-N slurm/sweep_agents.sh" \
       "ENTITY/PROJECT/SWEEP_ID (wandb sweep configs/sweeps/X_srun.yaml prints it)" >&2
  exit 2
fi
export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}   # srun in the sweep's command: since Slurm 22.05 not inherited
job=${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID:-?}}${SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID}
echo "fedclust: $(date -u +%FT%TZ) job $job (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}," \
     "${SLURM_NTASKS:-1} tasks: wandb agent --count 1 $sweep"
rc=0
"${FEDCLUST_WANDB:-wandb}" agent --count 1 "$sweep" || rc=$?
echo "fedclust: $(date -u +%FT%TZ) job $job: the agent exited with status $rc"
exit $rc
