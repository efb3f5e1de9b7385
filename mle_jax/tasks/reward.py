"""The paper's reward (§3.2, §4.1): the grader's score for a valid submission, partial credit otherwise.

One addition, for valid submissions with terrible scores: the paper rewards a valid submission with its
score (sign flipped when lower is better), so a valid multi-class log loss of 12 would earn -12, less than a
crash (-10). A policy would then learn that writing a bad submission is worse than writing none. Here a
valid submission's reward is its signed score while that is above `valid_floor` (-8 by default, far below
any sensible score of the 12 tasks), and below it is squashed softly into (valid_floor - 1, valid_floor):
still monotone in the score (a better bad submission earns more), and always above the best invalid
reward (failure + per_print x 7 = -9.3). Every score a reasonable program gets is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mle_jax.tasks.graders import GradeResult
from mle_jax.tasks.progress import PROGRESS_PRINTS, count_progress, count_tagged_progress


@dataclass(frozen=True)
class RewardSettings:
    """The `reward` section of the run config (paper §4.1, plus the floor of valid scores above)."""

    failure: float = -10.0  # a program that does not produce a valid submission
    per_print: float = 0.1  # partial credit per distinct progress print seen
    valid_floor: float = -8.0  # valid signed scores below this are squashed into (valid_floor - 1, valid_floor)

    def __post_init__(self) -> None:
        best_invalid = self.failure + self.per_print * len(PROGRESS_PRINTS)
        if self.valid_floor - 1.0 < best_invalid:
            raise ValueError(
                f"reward.valid_floor={self.valid_floor} lets a valid submission earn less than an invalid one "
                f"({best_invalid:g}); it must be at least {best_invalid + 1.0:g}"
            )


@dataclass(frozen=True)
class Reward:
    total: float  # what RL optimises
    valid: bool  # the submission was graded
    score: float | None  # the grader's score (raw sign), None when invalid
    prints: tuple[str, ...]  # distinct progress prints seen at line start
    n_prints: int


def floored(signed_score: float, floor: float) -> float:
    """A valid submission's reward from its signed score (higher is better): the score itself at or above
    `floor`; below it floor - gap / (1 + gap) with gap = floor - score, in (floor - 1, floor), monotone."""
    if signed_score >= floor:
        return signed_score
    gap = floor - signed_score
    return floor - gap / (1.0 + gap)


def compute_reward(
    grade: GradeResult | None,
    output_text: str,
    lower_is_better: bool,
    settings: RewardSettings = RewardSettings(),
    tag: str | None = None,
) -> Reward:
    """valid -> score (negated when lower is better, softly floored); else failure + per_print x distinct
    progress prints.

    grade=None means nothing was graded (no code, crash before a submission existed): a failure.
    tag: count only progress lines carrying this per-run tag (instrument.tagging.tag_progress), so prints
    the agent wrote itself earn nothing.
    """
    prints = count_tagged_progress(output_text or "", tag) if tag else count_progress(output_text or "")
    if grade is not None and grade.valid and grade.score is not None:
        score = float(grade.score)
        total = floored(-score if lower_is_better else score, settings.valid_floor)
        return Reward(total, True, score, prints, len(prints))
    return Reward(settings.failure + settings.per_print * len(prints), False, None, prints, len(prints))


def task_scores(
    valid: np.ndarray, scores: np.ndarray, lower_is_better: np.ndarray | bool, failure: float = -10.0
) -> np.ndarray:
    """The task score the paper plots (Fig. 9, 10) and tabulates (Table 4), per sample: `failure` (-10) for an
    invalid solution, else the grader's score in the task's direction (negated when lower is better, as the
    reward signs it, but never floored). The instrumentation's partial credit is left out: it is in the reward,
    not in this number.

    valid: [B] bool; scores: [B] float, the grader's raw-sign score (any value, None or nan, where invalid);
    lower_is_better: [B] bool (a mix of tasks) or one bool. Returns [B] float64."""
    ok = np.asarray(valid, dtype=bool)
    raw = np.asarray(scores, dtype=np.float64)  # None -> nan
    signed = np.where(np.asarray(lower_is_better, dtype=bool), -raw, raw)
    return np.where(ok, signed, float(failure))
