"""Infrastructure leaves that know nothing of RL: meshes and shardings, orbax checkpoints, the optimizer, the
metrics writer (JSONL + TensorBoard event files)."""
