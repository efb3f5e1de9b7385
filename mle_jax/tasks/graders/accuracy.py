"""Classification accuracy (tabular-playground-series-dec-2021)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mle_jax.tasks.graders.frames import (
    InvalidSubmission,
    align_by_id,
    check_columns,
    check_rows,
    numeric_values,
    whole_numbers,
)
from mle_jax.tasks.task import TaskSpec


def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """[N] labels, [N] predicted labels -> share equal."""
    return float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))


def grade_accuracy(spec: TaskSpec, sub: pd.DataFrame, answers: pd.DataFrame) -> float:
    """MLE-bench prepare_for_accuracy_metric: rows, columns, ids match. Labels compare as numbers when the
    answers are numeric (2 == 2.0; text there is invalid, as sklearn's mixed-type error), else as text."""
    check_rows(sub, answers)
    check_columns(spec, sub)
    sub, answers = align_by_id(spec, sub, answers)
    target = spec.target_columns[0]
    if pd.api.types.is_numeric_dtype(answers[target]):
        y_pred = whole_numbers(numeric_values(sub, [target])[:, 0], target)
        return accuracy(answers[target].to_numpy(np.float64), y_pred)
    if sub[target].isna().any():
        raise InvalidSubmission(f"column {target!r} has empty values")
    return accuracy(answers[target].astype(str).to_numpy(), sub[target].astype(str).to_numpy())
