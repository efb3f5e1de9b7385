"""The paper's own figures per task (Yang, He-Yueya and Liang, arXiv 2509.01684): what our results are read beside.

Each task's row is its spec's `paper` field (tasks/registry.py; a task defined elsewhere may have one too)."""

from __future__ import annotations

from mle_jax.tasks.registry import all_specs, get_spec

MODELS = ("qwen2.5-3b", "qwen2.5-3b-rl")  # Qwen2.5-3B prompted with AIDE, and after RL (best of 128 samples)


def paper_row(task_id: str) -> dict[str, float] | None:
    """The paper's Table 1 figures of a task, {model: score}; None for a task the paper does not report."""
    row = get_spec(task_id).paper
    return None if row is None else dict(zip(MODELS, row, strict=True))


# Paper Table 1: its twelve tasks, in its order
PAPER_TABLE1: dict[str, dict[str, float]] = {s.id: paper_row(s.id) for s in all_specs() if s.paper is not None}
