"""Stand-in for `mlebench.grade_helpers`: InvalidSubmissionError, and what `Grader.__call__` and
`mlebench.grade.grade_csv` do around a competition's grade function."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from mlebench.utils import read_csv


class InvalidSubmissionError(Exception):
    """
    A custom exception for when the agent submission cannot be graded.
    """


def call_grader(grade_fn: Callable[[pd.DataFrame, pd.DataFrame], float], submission, answers) -> float | None:
    """Grader.__call__: any exception of the grade function makes the submission invalid (None); a score is
    rounded to 5 decimals."""
    try:
        score = grade_fn(submission, answers)
    except Exception:  # MLE-bench: InvalidSubmissionError and any other error alike give None
        return None
    return round(score, 5)


def grade_csv(
    grade_fn: Callable[[pd.DataFrame, pd.DataFrame], float], submission_csv: Path, answers_csv: Path
) -> float | None:
    """mlebench.grade.grade_csv's score: None when the file is not a .csv (or cannot be read as one: MLE-bench
    would raise there, outside the grader), else the grader's. A NaN score stays NaN (MLE-bench counts it as a
    valid submission)."""
    if not (submission_csv.is_file() and submission_csv.suffix.lower() == ".csv"):
        return None
    try:
        submission = read_csv(submission_csv)
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError):
        return None
    score = call_grader(grade_fn, submission, read_csv(answers_csv))
    return None if score is None else float(score) if not math.isnan(score) else math.nan
