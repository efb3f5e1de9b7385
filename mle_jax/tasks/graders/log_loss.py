"""Multi-class log loss (leaf-classification, spooky-author-identification, lmsys-chatbot-arena)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mle_jax.tasks.graders.frames import (
    InvalidSubmission,
    align_by_id,
    check_columns,
    check_probabilities,
    check_rows,
    numeric_values,
)
from mle_jax.tasks.task import TaskSpec

ROW_SUM_ATOL = 1e-6  # MLE-bench's np.isclose(sum, 1, atol=1e-6), with numpy's default rtol=1e-5
ROW_SUM_RTOL = 1e-5


def multiclass_log_loss(y_onehot: np.ndarray, probs: np.ndarray) -> float:
    """[N, K] one-hot truth, [N, K] probabilities -> mean over rows of -sum_k y log p.

    Probabilities are clipped to [eps, 1 - eps] (float64 eps), never renormalised nor softmaxed: what
    sklearn's log_loss does with MLE-bench's one-hot answers.
    """
    eps = np.finfo(np.float64).eps
    p = np.clip(np.asarray(probs, dtype=np.float64), eps, 1.0 - eps)
    y = np.asarray(y_onehot, dtype=np.float64)
    return float(np.mean(-(y * np.log(p)).sum(axis=1)))


def rows_sum_to_one(probs: np.ndarray, rule: str) -> bool:
    """[N, K] probabilities -> whether every row sums to 1 by MLE-bench's check for the task.

    "isclose": |sum - 1| <= 1e-6 + 1e-5 (np.isclose with atol=1e-6: leaf, spooky); "round6": the sum rounded
    to 6 decimals is 1 (lmsys)."""
    sums = probs.sum(axis=1)
    if rule == "isclose":
        return bool(np.isclose(sums, 1.0, atol=ROW_SUM_ATOL, rtol=ROW_SUM_RTOL).all())
    if rule == "round6":
        return bool((np.round(sums, 6) == 1.0).all())
    raise ValueError(f"unknown row_sum_rule {rule!r}; known: 'isclose', 'round6'")


def grade_log_loss(spec: TaskSpec, sub: pd.DataFrame, answers: pd.DataFrame) -> float:
    """MLE-bench: class columns present (exactly, for leaf/spooky; spooky also wants `id` first), rows, each
    row sums to 1 (`rows_sum_to_one`), values in [0, 1], ids match. No softmax is applied to a submission."""
    check_columns(spec, sub)
    check_rows(sub, answers)
    classes = list(spec.target_columns)
    probs = numeric_values(sub, classes)
    if not rows_sum_to_one(probs, spec.row_sum_rule):
        raise InvalidSubmission("each row's class probabilities must sum to 1 (within 1e-6)")
    check_probabilities(probs, classes)
    sub, answers = align_by_id(spec, sub, answers)
    return multiclass_log_loss(answers[classes].to_numpy(np.float64), numeric_values(sub, classes))
