"""Quadratic weighted kappa (learning-agency-lab-automated-essay-scoring-2)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mle_jax.tasks.graders.frames import (
    align_by_id,
    check_columns,
    check_rows,
    numeric_values,
    whole_numbers,
)
from mle_jax.tasks.task import TaskSpec


def quadratic_weighted_kappa(a: np.ndarray, b: np.ndarray) -> float:
    """[N] ratings, [N] ratings -> Cohen's kappa with quadratic weights (sklearn's cohen_kappa_score).

    As in sklearn, the weight of a cell is the squared distance of the two labels' positions in the
    sorted union of labels (not of their values); NaN when both raters give one constant label.
    """
    labels, inverse = np.unique(np.concatenate([np.asarray(a), np.asarray(b)]), return_inverse=True)
    k, n = len(labels), len(a)
    ia, ib = inverse[:n], inverse[n:]
    observed = np.bincount(ia * k + ib, minlength=k * k).reshape(k, k).astype(np.float64)
    expected = np.outer(observed.sum(1), observed.sum(0)) / observed.sum()
    idx = np.arange(k)
    weights = (idx[:, None] - idx[None, :]).astype(np.float64) ** 2
    denom = (weights * expected).sum()
    if denom == 0:
        return float("nan")
    return float(1.0 - (weights * observed).sum() / denom)


def grade_qwk(spec: TaskSpec, sub: pd.DataFrame, answers: pd.DataFrame) -> float:
    """MLE-bench: columns present, not empty, ids match (which fixes the row count); numeric scores."""
    check_columns(spec, sub)
    check_rows(sub, answers)
    sub, answers = align_by_id(spec, sub, answers)
    target = spec.target_columns[0]
    y_pred = whole_numbers(numeric_values(sub, [target])[:, 0], target)
    return quadratic_weighted_kappa(y_pred, answers[target].to_numpy(np.float64))
