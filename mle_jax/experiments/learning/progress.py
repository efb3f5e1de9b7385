"""How far a learning experiment got (`python -m mle_jax.experiments.learning ... --progress`): read from its
folder while it runs or after it stopped, nothing trained or evaluated. For runs longer than a session: what each
arm and repeat has done of the planned steps, from its last whole checkpoint (the loop's own counters, kept across
resumes) and its metrics, and which evaluations are cached."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mle_jax.experiments.learning.arms import Arm
from mle_jax.experiments.learning.running import before_path, run_dir
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.infra.metrics import read_metrics


def run_progress(arm_dir: Path, steps: int) -> dict[str, Any]:
    """One arm's repeat: RL steps logged and checkpointed of `steps` planned, the loop's clocks at its last checkpoint
    (RL wall, update, sampling: seconds, summed over the processes that ran it), the valid fraction and trained
    improve share of each logged step, and whether its after-RL evaluation is cached. A run not started yet: zeros."""
    rows = read_metrics(arm_dir / "metrics.jsonl")
    ckpt_dir = arm_dir / "checkpoints"
    ckpt = Checkpointer(ckpt_dir, read_only=True) if ckpt_dir.is_dir() else None  # the run may be writing it
    saved = ckpt.all_steps() if ckpt is not None else []
    counters = ckpt.json_item(saved[-1], "loop")["counters"] if saved else {}
    shares = [r["prompt/improve_share_trained"] for r in rows if r.get("prompt/improve_share_trained") is not None]
    return {
        "steps_planned": steps,
        "steps_logged": max((int(r["step"]) for r in rows), default=0),
        "last_checkpoint": saved[-1] if saved else None,
        "rl_wall_s": round(counters.get("wall_s", 0.0), 1),
        "update_s": round(counters.get("update_s", 0.0), 1),
        "sample_s": round(counters.get("sample_s", 0.0), 1),
        "valid_fraction_by_step": [r.get("valid_fraction") for r in rows],
        "improve_share_trained": float(np.mean(shares)) if shares else None,
        "evaluated_after": (arm_dir / "after.json").is_file(),
    }


def experiment_progress(out: Path, arms: Sequence[Arm], seeds: int, steps: int, turns: Sequence[int] = ()) -> dict:
    """The experiment in `out` as the same command plans it (its arms, seeds and steps): which before-RL evaluations
    are cached, and `run_progress` of every arm and repeat, keyed by its folder under out/arms."""
    befores = [before_path(out, k) for k in turns] or [before_path(out, None)]
    runs = {}
    for arm in arms:
        for r in range(seeds):
            d = run_dir(out, arm.name, r)
            runs[d.name] = {"arm": arm.name, "seed_offset": r, **run_progress(d, steps)}
    done = sum(x["steps_logged"] for x in runs.values())
    return {
        "out": str(out),
        "before_evaluated": {p.name: p.is_file() for p in befores},
        "runs": runs,
        "steps_done": done,
        "steps_planned": steps * len(runs),
        "evaluations_after_done": sum(x["evaluated_after"] for x in runs.values()),
    }
