"""Slurm pools: a Trainyard job as one Slurm job (batch), the console's pass over its pools
(slurm_pass), what Slurm's states mean (slurm_states), and the Redis user of a Slurm job's
instances (slurm_access)."""
