"""Pearson correlation (us-patent-phrase-to-phrase-matching)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mle_jax.tasks.graders.frames import align_by_id, check_columns, check_rows, numeric_values
from mle_jax.tasks.task import TaskSpec


def pearson_r(x: np.ndarray, y: np.ndarray) -> float:
    """[N], [N] -> Pearson r (scipy.stats.pearsonr's statistic); NaN when either side is constant."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    xc, yc = x - x.mean(), y - y.mean()
    nx, ny = np.linalg.norm(xc), np.linalg.norm(yc)
    if nx == 0 or ny == 0:
        return float("nan")
    return float(np.clip(np.dot(xc / nx, yc / ny), -1.0, 1.0))


def grade_pearson(spec: TaskSpec, sub: pd.DataFrame, answers: pd.DataFrame) -> float:
    """MLE-bench: rows, columns, ids match; numeric predictions."""
    check_rows(sub, answers)
    check_columns(spec, sub)
    sub, answers = align_by_id(spec, sub, answers)
    target = spec.target_columns[0]
    return pearson_r(answers[target].to_numpy(np.float64), numeric_values(sub, [target])[:, 0])
