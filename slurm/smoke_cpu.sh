#!/bin/bash
# A short CPU run through Slurm: 2 tasks on one node, gloo, no GPU.  The tests
# submit it to a one-node Slurm cluster (tests/slurm/start_cluster.sh); it is
# also the quickest check that a new cluster or environment works:
#
#   sbatch --wait slurm/smoke_cpu.sh                        # Synthetic, 16 clients, 10 rounds
#   sbatch slurm/smoke_cpu.sh rounds=40 algorithm.name=ifca # any KEY=VALUE passes through
#   CONFIG=configs/fmnist_rotation2.yaml sbatch slurm/smoke_cpu.sh clients=8 rounds=4
#
# Same signal/requeue settings as the GPU scripts: USR1 60 s before the time
# limit, or `scancel --signal=USR1 JOBID`, makes the run checkpoint, requeue
# the job and exit; the requeued job continues the run in the same directory
# (runs/slurm/<job name>-<job id>, or $OUT).  Submit from the repository root.
#SBATCH --job-name=fedclust-smoke
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:15:00
#SBATCH --signal=USR1@60
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# Your cluster's settings: delete one '#' of a line to use it ('##SBATCH' is a comment; sbatch reads
# the '#SBATCH' lines before the first command).  Options given to sbatch win over these lines:
#   sbatch -p PARTITION -A ACCOUNT --mem=4G slurm/smoke_cpu.sh
##SBATCH --partition=PARTITION
##SBATCH --account=ACCOUNT
##SBATCH --mem=4G

# The Python environment that has fedclust.  sbatch passes on the environment of the shell it is
# run from (its default, --export=ALL), so an environment active there is active here; if it is not
# (or your cluster sets --export=NONE), activate it here, before set -u (activation scripts read
# unset variables), with one of:
# module load python/3.11
# source "$HOME/venvs/fedclust/bin/activate"
# eval "$(conda shell.bash hook)" && conda activate fedclust
# FEDCLUST_PYTHON names the interpreter srun starts on every task (default: python, the first on PATH
# after the lines above); it needs no activation, e.g.
#   FEDCLUST_PYTHON=$HOME/venvs/fedclust/bin/python sbatch slurm/smoke_cpu.sh
set -euo pipefail
source "${SLURM_SUBMIT_DIR:-.}/slurm/fedclust_srun.sh"
fedclust_srun "${CONFIG:-configs/synthetic_cluster4.yaml}" \
  algorithm.name=panm_grad clients=16 rounds=10 stage1_rounds=5 train.local_epochs=2 figures=false device=cpu "$@"
