"""Plans for hardware that need not be here: the run's PPO update and decode step compiled for a GPU or TPU target,
with per-device memory, FLOPs, collectives and the projected step time. Imports no RL loop, sampler or executor.
"""
