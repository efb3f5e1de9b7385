"""Area under the ROC curve: binary (pizza, insults, tabular-may-2022), mean column-wise (plant pathology)."""

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


def roc_auc(y_true: np.ndarray, y_score: np.ndarray) -> float:
    """[N] labels with exactly two classes (the larger is positive), [N] scores -> AUC.

    Mann-Whitney form with average ranks for ties: equal to sklearn's roc_auc_score (trapezoids).
    """
    y_true = np.asarray(y_true)
    classes = np.unique(y_true)
    if len(classes) != 2:
        raise InvalidSubmission(f"AUC is undefined: the answers hold {len(classes)} class(es), need 2")
    pos = y_true == classes[1]
    n_pos = int(pos.sum())
    n_neg = len(y_true) - n_pos
    from scipy.stats import rankdata  # here: scipy.stats takes ~1 s to import, and most processes never grade

    ranks = rankdata(np.asarray(y_score, dtype=np.float64))
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def grade_auc(spec: TaskSpec, sub: pd.DataFrame, answers: pd.DataFrame) -> float:
    """MLE-bench prepare_for_auroc_metric: columns, rows, numeric, in [0, 1], ids match."""
    check_columns(spec, sub)
    check_rows(sub, answers)
    target = spec.target_columns[0]
    check_probabilities(numeric_values(sub, [target]), [target])
    sub, answers = align_by_id(spec, sub, answers)
    y_score = numeric_values(sub, [target])[:, 0]
    return roc_auc(answers[target].to_numpy(), y_score)


def grade_mean_column_auc(spec: TaskSpec, sub: pd.DataFrame, answers: pd.DataFrame) -> float:
    """MLE-bench plant-pathology: rows, exact columns, ids match; mean of per-class AUCs."""
    check_rows(sub, answers)
    check_columns(spec, sub)
    sub, answers = align_by_id(spec, sub, answers)
    scores = numeric_values(sub, list(spec.target_columns))
    per_class = [roc_auc(answers[c].to_numpy(), scores[:, j]) for j, c in enumerate(spec.target_columns)]
    return float(np.mean(per_class))
