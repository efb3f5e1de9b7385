"""The paper's reward (§3.2, §4.1): the grader's score for a valid submission, partial credit otherwise."""

from __future__ import annotations

from dataclasses import dataclass

from mle_jax.tasks.graders import GradeResult
from mle_jax.tasks.progress import count_progress, count_tagged_progress


@dataclass(frozen=True)
class RewardSettings:
    """The `reward` section of the run config (paper §4.1)."""

    failure: float = -10.0  # a program that does not produce a valid submission
    per_print: float = 0.1  # partial credit per distinct progress print seen


@dataclass(frozen=True)
class Reward:
    total: float  # what RL optimises
    valid: bool  # the submission was graded
    score: float | None  # the grader's score (raw sign), None when invalid
    prints: tuple[str, ...]  # distinct progress prints seen at line start
    n_prints: int


def compute_reward(
    grade: GradeResult | None,
    output_text: str,
    lower_is_better: bool,
    failure: float = -10.0,
    per_print: float = 0.1,
    tag: str | None = None,
) -> Reward:
    """valid -> score (negated when lower is better); else failure + per_print x distinct progress prints.

    grade=None means nothing was graded (no code, crash before a submission existed): a failure.
    tag: count only progress lines carrying this per-run tag (instrument.tagging.tag_progress), so prints
    the agent wrote itself earn nothing.
    """
    prints = count_tagged_progress(output_text or "", tag) if tag else count_progress(output_text or "")
    if grade is not None and grade.valid and grade.score is not None:
        score = float(grade.score)
        return Reward(-score if lower_is_better else score, True, score, prints, len(prints))
    return Reward(failure + per_print * len(prints), False, None, prints, len(prints))
