"""Submission checks shared by the graders: MLE-bench's validity rules on pandas frames.

Every failed check raises InvalidSubmission with a reason the agent could act on; the grader turns it into
GradeResult(valid=False). Answers are trusted (we wrote them), submissions are not.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from mle_jax.tasks.task import TaskSpec


class InvalidSubmission(Exception):
    """The submission cannot be graded (MLE-bench: InvalidSubmissionError -> score None)."""


def check_columns(spec: TaskSpec, sub: pd.DataFrame) -> None:
    """Id and target columns present; nothing else when the task's MLE-bench grader demands the exact set."""
    required = (spec.id_column, *spec.target_columns)
    missing = [c for c in required if c not in sub.columns]
    if missing:
        shown = ", ".join(map(repr, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise InvalidSubmission(f"missing column(s) {shown}; expected {spec.id_column!r} and the targets")
    if spec.exact_columns and set(map(str, sub.columns)) != set(required):
        extra = sorted(set(map(str, sub.columns)) - set(required))[:5]
        raise InvalidSubmission(f"unexpected column(s) {extra}: this task needs exactly id + target columns")
    if sub.columns.duplicated().any():
        raise InvalidSubmission("duplicated column names")
    if spec.id_first and str(sub.columns[0]) != spec.id_column:
        raise InvalidSubmission(
            f"the first column must be {spec.id_column!r} (the targets are read as the columns after it)"
        )


def check_rows(sub: pd.DataFrame, answers: pd.DataFrame) -> None:
    if len(sub) == 0:
        raise InvalidSubmission("submission has no rows")
    if len(sub) != len(answers):
        raise InvalidSubmission(f"submission has {len(sub)} rows, expected {len(answers)}")


def _id_keys(sub_ids: pd.Series, ans_ids: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Comparable id arrays: numbers when both sides are numeric (1 == 1.0), else strings."""
    numeric = pd.api.types.is_numeric_dtype(sub_ids) and pd.api.types.is_numeric_dtype(ans_ids)
    if numeric and not (pd.api.types.is_bool_dtype(sub_ids) or pd.api.types.is_bool_dtype(ans_ids)):
        return sub_ids.to_numpy(np.float64), ans_ids.to_numpy(np.float64)
    return sub_ids.astype(str).to_numpy(), ans_ids.astype(str).to_numpy()


def align_by_id(spec: TaskSpec, sub: pd.DataFrame, answers: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both frames sorted by id (stable); the ids must be the same multiset (MLE-bench: sort, then compare).

    Duplicated ids are only accepted where the answers repeat them the same number of times
    (detecting-insults' id is the comment text, which repeats).
    """
    s_keys, a_keys = _id_keys(sub[spec.id_column], answers[spec.id_column])
    s_order = np.argsort(s_keys, kind="stable")
    a_order = np.argsort(a_keys, kind="stable")
    s_sorted, a_sorted = s_keys[s_order], a_keys[a_order]
    if len(s_sorted) != len(a_sorted) or not np.array_equal(s_sorted, a_sorted):
        s_set, a_set = set(s_sorted.tolist()), set(a_sorted.tolist())
        n_dup = len(s_sorted) - len(s_set)
        raise InvalidSubmission(
            f"{spec.id_column!r} values do not match the test set: {len(a_set - s_set)} missing, "
            f"{len(s_set - a_set)} unknown, {n_dup} duplicated"
        )
    return sub.iloc[s_order].reset_index(drop=True), answers.iloc[a_order].reset_index(drop=True)


def whole_numbers(values: np.ndarray, column: str) -> np.ndarray:
    """[N] predictions of class labels or ratings: whole numbers only (2.0 is fine, 2.5 is not), as sklearn's
    accuracy and kappa, which MLE-bench calls, refuse a continuous target beside discrete answers."""
    if not np.array_equal(values, np.round(values)):
        raise InvalidSubmission(f"column {column!r} must hold whole-number labels, not continuous values")
    return values


def numeric_values(sub: pd.DataFrame, columns: tuple[str, ...] | list[str]) -> np.ndarray:
    """[N, len(columns)] float64 of the submission's columns; non-numbers, NaN and inf are invalid."""
    out = np.empty((len(sub), len(columns)), dtype=np.float64)
    for j, col in enumerate(columns):
        series = sub[col]
        if pd.api.types.is_bool_dtype(series):
            values = series.to_numpy(np.float64)
        else:
            try:
                values = pd.to_numeric(series, errors="raise").to_numpy(np.float64)
            except (ValueError, TypeError):
                raise InvalidSubmission(f"column {col!r} must be numeric") from None
        if not np.isfinite(values).all():
            raise InvalidSubmission(f"column {col!r} contains NaN, inf or empty values")
        out[:, j] = values
    return out


def check_probabilities(values: np.ndarray, columns: tuple[str, ...] | list[str]) -> None:
    """Values in [0, 1] (MLE-bench's AUC and log-loss rule)."""
    if (values < 0).any() or (values > 1).any():
        raise InvalidSubmission(
            f"{'/'.join(columns[:3])}{'...' if len(columns) > 3 else ''} must be probabilities in [0, 1]"
        )
