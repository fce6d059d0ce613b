"""Launchers for many fedclust runs: ``python -m launch.submit`` (a grid of
overrides) and ``python -m launch.sweep`` (a W&B sweep file expanded here,
for clusters without internet), each as a Slurm job array through submitit
or on this machine in sequence."""
