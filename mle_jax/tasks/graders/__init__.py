"""Graders for the 12 tasks: MLE-bench's validity rules and metrics, hardened against garbage submissions.

grade(task, submission_csv) -> GradeResult(valid, score, reason). Never raises for a bad submission: an
invalid one gets valid=False, score=None and the reason. Scores are rounded to 5 decimals (as MLE-bench).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mle_jax.tasks.graders.accuracy import grade_accuracy
from mle_jax.tasks.graders.auc import grade_auc, grade_mean_column_auc
from mle_jax.tasks.graders.correlation import grade_pearson
from mle_jax.tasks.graders.frames import InvalidSubmission
from mle_jax.tasks.graders.jaccard import grade_jaccard
from mle_jax.tasks.graders.kappa import grade_qwk
from mle_jax.tasks.graders.log_loss import grade_log_loss
from mle_jax.tasks.graders.reading import max_columns, read_answers, read_submission, size_cap
from mle_jax.tasks.graders.rmsle import grade_mean_column_rmsle
from mle_jax.tasks.task import Task, TaskSpec

GradeFn = Callable[[TaskSpec, pd.DataFrame, pd.DataFrame], float]

METRIC_GRADERS: dict[str, GradeFn] = {
    "auc": grade_auc,
    "mean_column_auc": grade_mean_column_auc,
    "qwk": grade_qwk,
    "jaccard": grade_jaccard,
    "accuracy": grade_accuracy,
    "pearson": grade_pearson,
    "log_loss": grade_log_loss,
    "mean_column_rmsle": grade_mean_column_rmsle,
}


@dataclass(frozen=True)
class GradeResult:
    valid: bool
    score: float | None  # None when invalid
    reason: str = ""  # why it is invalid ("" when valid)

    def to_json(self) -> dict:
        return {"valid": self.valid, "score": self.score, "reason": self.reason}


def grade_frames(spec: TaskSpec, submission: pd.DataFrame, answers: pd.DataFrame) -> GradeResult:
    """Grade an already-read submission frame against the answers frame."""
    try:
        fn = METRIC_GRADERS[spec.metric]
    except KeyError:
        known = sorted(METRIC_GRADERS)
        raise KeyError(f"{spec.id}: no grader for metric {spec.metric!r}; known: {known}") from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            score = fn(spec, submission, answers)
    except InvalidSubmission as e:
        return GradeResult(False, None, str(e))
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, ZeroDivisionError, MemoryError) as e:
        # MLE-bench turns any grader error into "invalid"; keep the reason short.
        return GradeResult(False, None, f"cannot grade submission: {type(e).__name__}: {str(e)[:200]}")
    if score is None or not math.isfinite(score):
        reason = f"{spec.metric} is undefined for this submission (e.g. constant predictions)"
        return GradeResult(False, None, reason)
    return GradeResult(True, round(float(score), 5), "")


def grade_csv(spec: TaskSpec, submission_csv: str | Path, answers_path: str | Path) -> GradeResult:
    """Grade a submission file against an answers file of the task."""
    answers_path = Path(answers_path)
    answers = read_answers(answers_path)
    try:
        submission = read_submission(
            submission_csv, max_bytes=size_cap(answers_path), max_fields=max_columns(spec), max_rows=len(answers)
        )
    except InvalidSubmission as e:
        return GradeResult(False, None, str(e))
    return grade_frames(spec, submission, answers)


def grade(task: Task, submission_csv: str | Path | None) -> GradeResult:
    """Grade the agent's ./submission.csv (None: none was written) against the task's private answers."""
    if submission_csv is None:
        return GradeResult(False, None, "no submission.csv was written")
    return grade_csv(task.spec, submission_csv, task.answers_path)


__all__ = ["GradeResult", "InvalidSubmission", "METRIC_GRADERS", "grade", "grade_csv", "grade_frames"]
