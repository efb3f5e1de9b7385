"""Mean column-wise root mean squared logarithmic error (nomad2018-predict-transparent-conductors)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mle_jax.tasks.graders.frames import (
    InvalidSubmission,
    align_by_id,
    check_columns,
    check_rows,
    numeric_values,
)
from mle_jax.tasks.task import TaskSpec


def rmsle(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """[N], [N] -> sqrt(mean((log1p(y_pred) - log1p(y_true))^2)); values must be > -1 (as sklearn)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    y_pred = np.asarray(y_pred, dtype=np.float64)
    if (y_true <= -1).any() or (y_pred <= -1).any():
        raise InvalidSubmission("RMSLE is undefined for values <= -1")
    return float(np.sqrt(np.mean((np.log1p(y_pred) - np.log1p(y_true)) ** 2)))


def grade_mean_column_rmsle(spec: TaskSpec, sub: pd.DataFrame, answers: pd.DataFrame) -> float:
    """MLE-bench: target columns present, rows. MLE-bench compares rows by position; we also require the ids
    to match and align by id (identical for a submission in the test file's order)."""
    check_columns(spec, sub)
    check_rows(sub, answers)
    sub, answers = align_by_id(spec, sub, answers)
    cols = list(spec.target_columns)
    preds = numeric_values(sub, cols)
    truth = answers[cols].to_numpy(np.float64)
    return float(np.mean([rmsle(truth[:, j], preds[:, j]) for j in range(len(cols))]))
