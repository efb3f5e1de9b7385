"""Plans for hardware that need not be here: the run's PPO update and decode step compiled for a GPU or TPU target,
with per-device memory, FLOPs, collectives and the projected step time. Imports no RL loop, sampler or executor.

- targets: what a plan compiles for (CPU devices, GPU models, TPU slices) and their peaks and memory
- programs: the update and the decode step, built abstractly and compiled
- counting: matmul FLOPs, bytes per device, XLA's memory and cost figures, traffic between slices
- hlo_collectives: the collectives of a compiled program, from its HLO text
- plan: make_plan (layout checks, the JSON-able plan) and format_plan
- table: plans over several targets as rows, and their markdown table
- errors: PlanError, one line naming the numbers that clash
"""
