"""Slurm launching for the sparse-fraction sweep: submitit jobs that survive requeues (`jobs`), the
sweep plan and its resume/skip rules (`sweep`), submission with chained linear probes (`submit`),
and a status table (`status`). The command line is `python slurm/launch.py` (see its --help);
`slurm/*.sbatch` are plain sbatch templates."""
