#!/bin/bash
# CIFAR-10 with 4 rotations (configs/cifar_rotation4.yaml: PANMGrad, 100
# clients, 300 rounds) on the GPUs of one node, one process per GPU.
#
#   sbatch slurm/cifar_rotation4.sh                                  # 4 GPUs
#   sbatch slurm/cifar_rotation4.sh seed=3 algorithm.name=ifca       # KEY=VALUE pass through
#   sbatch --gres=gpu:2 --ntasks-per-node=2 slurm/cifar_rotation4.sh # 2 GPUs: change both together
#   sbatch -p PARTITION -A ACCOUNT slurm/cifar_rotation4.sh          # your cluster's partition/account
#
# - --ntasks-per-node equals the GPUs of --gres=gpu:N: srun starts one process
#   per GPU and Lightning Fabric takes rank and world size from Slurm
#   (--gpus-per-task is not used: Lightning does not handle it).
# - 3 minutes before the time limit Slurm sends USR1: the run finishes its
#   round, writes a checkpoint, `scontrol requeue`s the job and exits; the
#   requeued job (same id, --requeue) continues from that checkpoint in the
#   same directory, runs/slurm/<job name>-<job id> (or $OUT), and appends to
#   the same log (--open-mode=append).  A preemption (SIGTERM) does the same.
# - data.root (data/ by default) must hold CIFAR-10 in torchvision's layout;
#   compute nodes often have no internet: download it once on a login node
#   (python -c "import torchvision; torchvision.datasets.CIFAR10('data', download=True)").
# Submit from the repository root (config and data paths are relative to it).
#SBATCH --job-name=fedclust-cifar4
#SBATCH --nodes=1
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
#   sbatch -p PARTITION -A ACCOUNT --mem=64G slurm/cifar_rotation4.sh
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
#   FEDCLUST_PYTHON=$HOME/venvs/fedclust/bin/python sbatch slurm/cifar_rotation4.sh
set -euo pipefail
source "${SLURM_SUBMIT_DIR:-.}/slurm/fedclust_srun.sh"
fedclust_srun "${CONFIG:-configs/cifar_rotation4.yaml}" device=cuda "$@"
