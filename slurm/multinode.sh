#!/bin/bash
# CIFAR-10 4 rotations over several nodes: one process per GPU on every node
# (2 nodes x 4 GPUs = 8 ranks, NCCL).  Clients are split over all ranks; each
# round every rank receives every client's weights (one all-gather, n x P x 4
# bytes: see "Several nodes" in the README for what limits this).
#
#   sbatch slurm/multinode.sh                                # 2 nodes x 4 GPUs
#   sbatch --nodes=4 slurm/multinode.sh clients=1000 data.share_images=true
#
# Lightning Fabric reads the node list, node rank and world size from Slurm's
# variables and rendezvous on the first node.  Checkpoints, signal and requeue
# as in cifar_rotation4.sh (run directory: runs/slurm/<job name>-<job id>).
#SBATCH --job-name=fedclust-multinode
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --gres=gpu:4
#SBATCH --cpus-per-task=8
#SBATCH --time=04:00:00
#SBATCH --signal=USR1@180
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# Your cluster's settings: delete one '#' of a line to use it ('##SBATCH' is a comment; sbatch reads
# the '#SBATCH' lines before the first command).  Options given to sbatch win over these lines:
#   sbatch -p PARTITION -A ACCOUNT --mem=64G slurm/multinode.sh
##SBATCH --partition=PARTITION
##SBATCH --account=ACCOUNT
##SBATCH --mem=64G

# The Python environment that has fedclust.  sbatch passes on the environment of the shell it is
# run from (its default, --export=ALL), so an environment active there is active here; if it is not
# (or your cluster sets --export=NONE), activate it here, before set -u (activation scripts read
# unset variables), with one of:
# module load python/3.11
# source "$HOME/venvs/fedclust/bin/activate"
# eval "$(conda shell.bash hook)" && conda activate fedclust
# FEDCLUST_PYTHON names the interpreter srun starts on every task (default: python, the first on PATH
# after the lines above); it needs no activation, e.g.
#   FEDCLUST_PYTHON=$HOME/venvs/fedclust/bin/python sbatch slurm/multinode.sh
set -euo pipefail
source "${SLURM_SUBMIT_DIR:-.}/slurm/fedclust_srun.sh"
fedclust_srun "${CONFIG:-configs/cifar_rotation4.yaml}" device=cuda "$@"
