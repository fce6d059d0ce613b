#!/bin/bash
# A grid of seeds x algorithms as one job array, one run per task, one GPU each.
#
#   sbatch slurm/array.sh                                   # 3 seeds x 2 PANM variants = tasks 0-5
#   SEEDS="0 1 2 3 4" ALGORITHMS="panm_grad ifca fedavg" sbatch --array=0-14 slurm/array.sh
#   CONFIG=configs/fmnist_rotation2.yaml sbatch slurm/array.sh rounds=100   # KEY=VALUE apply to every run
#   sbatch --array=0-5%2 slurm/array.sh                      # at most 2 tasks at a time
#
# Task i runs algorithm ALGORITHMS[i / #SEEDS] with seed SEEDS[i % #SEEDS]
# into runs/slurm/<job name>-<array job id>/<algorithm>-s<seed> (or
# $OUT/<algorithm>-s<seed>); --array must cover exactly #SEEDS x #ALGORITHMS
# tasks (checked).  Each task is requeued and resumed on its own (USR1 before
# the time limit, preemption).  Afterwards:
#   fedclust report runs/slurm/fedclust-array-<array job id>/*
# (python -m launch.submit does the same from Python, and skips finished runs
# when a grid is submitted again.)
#SBATCH --job-name=fedclust-array
#SBATCH --array=0-5
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=02:00:00
#SBATCH --signal=USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%A_%a.out
# Your cluster's settings: delete one '#' of a line to use it ('##SBATCH' is a comment; sbatch reads
# the '#SBATCH' lines before the first command).  Options given to sbatch win over these lines:
#   sbatch -p PARTITION -A ACCOUNT --mem=32G slurm/array.sh
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
# FEDCLUST_PYTHON names the interpreter srun starts on every task (default: python, the first on PATH
# after the lines above); it needs no activation, e.g.
#   FEDCLUST_PYTHON=$HOME/venvs/fedclust/bin/python sbatch slurm/array.sh
set -euo pipefail
source "${SLURM_SUBMIT_DIR:-.}/slurm/fedclust_srun.sh"
read -r -a seeds <<< "${SEEDS:-0 1 2}"
read -r -a algorithms <<< "${ALGORITHMS:-panm_grad panm_loss}"
tasks=$(( ${#seeds[@]} * ${#algorithms[@]} ))
if [[ "${SLURM_ARRAY_TASK_COUNT:-}" != "$tasks" || "${SLURM_ARRAY_TASK_MIN:-0}" != 0 ]]; then
  echo "fedclust: error: --array must be 0-$((tasks - 1)) for ${#seeds[@]} seeds x ${#algorithms[@]} algorithms" \
       "(SEEDS='${seeds[*]}', ALGORITHMS='${algorithms[*]}'); this job has ${SLURM_ARRAY_TASK_COUNT:-no array}" \
       "tasks from ${SLURM_ARRAY_TASK_MIN:-?}: submit with sbatch --array=0-$((tasks - 1)) slurm/array.sh" >&2
  exit 2
fi
i=${SLURM_ARRAY_TASK_ID:?array.sh runs as a job array}
seed=${seeds[i % ${#seeds[@]}]}
algorithm=${algorithms[i / ${#seeds[@]}]}
OUT=${OUT:-runs/slurm/${SLURM_JOB_NAME}-${SLURM_ARRAY_JOB_ID}}/$algorithm-s$seed
fedclust_srun "${CONFIG:-configs/cifar_rotation4.yaml}" device=cuda "seed=$seed" "algorithm.name=$algorithm" "$@"
