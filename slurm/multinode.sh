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
set -euo pipefail
source "${SLURM_SUBMIT_DIR:-.}/slurm/fedclust_srun.sh"
fedclust_srun "${CONFIG:-configs/cifar_rotation4.yaml}" device=cuda "$@"
