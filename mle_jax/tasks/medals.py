"""Where a score stands on MLE-bench's scale: gold, silver, bronze, above the median, or none.

The thresholds are MLE-bench's for the twelve tasks (data/mlebench/medal_thresholds.csv; provenance in
data/mlebench/README.md). The rule is MLE-bench's `Grader.rank_score` (openai/mle-bench,
mlebench/grade_helpers.py): a medal when the score is at least as good as its threshold in the metric's
direction (>=, or <= when lower is better); "above median" strictly better than the median (>, or <).
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mle_jax.tasks.registry import get_spec

THRESHOLDS_CSV = Path(__file__).resolve().parents[2] / "data" / "mlebench" / "medal_thresholds.csv"

# best first; "none" is a valid submission below every level
LEVELS: tuple[str, ...] = ("gold", "silver", "bronze", "above_median", "none")
MEDALS: tuple[str, ...] = ("gold", "silver", "bronze")


@dataclass(frozen=True)
class Thresholds:
    """One competition's row of medal_thresholds.csv."""

    gold: float
    silver: float
    bronze: float
    median: float
    lower_is_better: bool


@functools.cache
def _table() -> dict[str, Thresholds]:
    with THRESHOLDS_CSV.open(newline="") as f:
        rows = list(csv.DictReader(f))
    out = {}
    for r in rows:
        if r["is_lower_better"] not in ("True", "False"):
            raise ValueError(f"{THRESHOLDS_CSV}: {r['competition_id']}: is_lower_better is {r['is_lower_better']!r}")
        out[r["competition_id"]] = Thresholds(
            float(r["gold"]),
            float(r["silver"]),
            float(r["bronze"]),
            float(r["median"]),
            r["is_lower_better"] == "True",
        )
    return out


def task_ids() -> tuple[str, ...]:
    """The tasks that have thresholds, in the file's order."""
    return tuple(_table())


def thresholds(task_id: str) -> Thresholds:
    """The task's thresholds: MLE-bench's row, else its spec's own (`TaskSpec.medal_thresholds`, a task defined
    outside MLE-bench); KeyError (one line) for a task with neither."""
    table = _table()
    if task_id in table:
        return table[task_id]
    try:
        spec = get_spec(task_id)
    except KeyError:
        spec = None
    if spec is None or spec.medal_thresholds is None:
        raise KeyError(f"no medal thresholds for task {task_id!r}; known: {', '.join(sorted(table))}") from None
    return Thresholds(*spec.medal_thresholds, spec.lower_is_better)


def medal(task_id: str, score: float) -> str:
    """The level `score` earns on the task: one of LEVELS."""
    t = thresholds(task_id)
    sign = -1.0 if t.lower_is_better else 1.0  # compare sign * score: higher is then better for every task
    s = sign * float(score)
    for name, threshold in (("gold", t.gold), ("silver", t.silver), ("bronze", t.bronze)):
        if s >= sign * threshold:  # a score exactly at a threshold earns it
            return name
    return "above_median" if s > sign * t.median else "none"


def medal_summary(task_id: str, scores: Sequence[float | None]) -> dict:
    """The medals of one task's samples. scores: [n], None for an invalid sample.

    Returns {"best": the level of the best valid score (None when none is valid), "shares": {level: share of
    the n samples} over LEVELS and "invalid" (summing to 1), "any_medal": share of the n samples at gold, silver
    or bronze (MLE-bench's headline figure)}."""
    t = thresholds(task_id)
    levels = [None if s is None else medal(task_id, s) for s in scores]
    valid = [s for s in scores if s is not None]
    best = (min if t.lower_is_better else max)(valid) if valid else None
    n = max(len(levels), 1)
    shares = {lv: levels.count(lv) / n for lv in LEVELS}
    shares["invalid"] = levels.count(None) / n
    return {
        "best": None if best is None else medal(task_id, best),
        "shares": shares,
        "any_medal": sum(shares[m] for m in MEDALS),
    }


def any_medal_over_seeds(levels_by_task: Mapping[str, Sequence[str | None]]) -> dict:
    """MLE-bench's aggregate over tasks (openai/mle-bench README, "Benchmarking": at least 3 seeds, the Any Medal
    rate as the mean ± one standard error of the mean): per seed, the share of the tasks whose submission earned any
    medal; their mean and standard error over the seeds.

    levels_by_task: task -> [S] levels (None: an invalid submission), seed i at index i for every task. Returns
    {"tasks": [...], "per_seed": [S], "any_medal": mean or None, "any_medal_se": SE or None (fewer than 2 seeds)}."""
    tasks = list(levels_by_task)
    if not tasks:
        return {"tasks": [], "per_seed": [], "any_medal": None, "any_medal_se": None}
    seeds = {len(v) for v in levels_by_task.values()}
    if len(seeds) != 1:
        raise ValueError(f"every task needs the same seeds; got {dict((t, len(v)) for t, v in levels_by_task.items())}")
    per_seed = [sum(levels_by_task[t][i] in MEDALS for t in tasks) / len(tasks) for i in range(seeds.pop())]
    x = np.asarray(per_seed, np.float64)
    se = float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else None
    return {"tasks": tasks, "per_seed": per_seed, "any_medal": float(x.mean()) if x.size else None, "any_medal_se": se}
