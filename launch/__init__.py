"""Launchers for grids of fedclust runs: ``python -m launch.submit`` (Slurm
job arrays through submitit, or this machine in sequence)."""
