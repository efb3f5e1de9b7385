"""Generated answers and submissions shaped like each task's (the graders' tests and the MLE-bench cross-check)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mle_jax.tasks.task import TaskSpec

N = 60


def make_answers(spec: TaskSpec, rng: np.random.Generator, n: int = N) -> pd.DataFrame:
    ids = [f"row_{i:04d}" for i in range(n)] if spec.id_column != "id" else list(range(1000, 1000 + n))
    frame = pd.DataFrame({spec.id_column: ids})
    cols = spec.target_columns
    if spec.metric in ("log_loss", "mean_column_auc"):
        labels = np.arange(n) % len(cols)  # every class present
        rng.shuffle(labels)
        onehot = np.eye(len(cols), dtype=int)[labels]
        if spec.metric == "mean_column_auc":
            onehot[0] = 1  # a multi-label row keeps every column two-class
        for j, c in enumerate(cols):
            frame[c] = onehot[:, j]
    elif spec.metric == "auc":
        frame[cols[0]] = np.arange(n) % 2
    elif spec.metric == "qwk":
        frame[cols[0]] = rng.integers(1, 7, n)
    elif spec.metric == "accuracy":
        frame[cols[0]] = rng.integers(1, 8, n)
    elif spec.metric == "pearson":
        frame[cols[0]] = rng.integers(0, 5, n) * 0.25
    elif spec.metric == "jaccard":
        words = np.array(["so", "happy", "sad", "today", "bad", "great"])
        frame[cols[0]] = [" ".join(rng.choice(words, 2)) for _ in range(n)]
    elif spec.metric == "mean_column_rmsle":
        for c in cols:
            frame[c] = rng.random(n) * 3
    return frame


def make_submission(spec: TaskSpec, answers: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    sub = answers[[spec.id_column]].copy()
    cols = list(spec.target_columns)
    if spec.metric == "log_loss":
        sub[cols] = rng.dirichlet(np.ones(len(cols)), len(sub))
    elif spec.metric in ("auc", "mean_column_auc"):
        sub[cols] = rng.random((len(sub), len(cols)))
    elif spec.metric == "qwk":
        sub[cols[0]] = np.clip(answers[cols[0]] + rng.integers(-1, 2, len(sub)), 1, 6)
    elif spec.metric == "accuracy":
        sub[cols[0]] = np.where(rng.random(len(sub)) < 0.7, answers[cols[0]], 1)
    elif spec.metric == "pearson":
        sub[cols[0]] = answers[cols[0]] + rng.normal(0, 0.2, len(sub))
    elif spec.metric == "jaccard":
        sub[cols[0]] = [" ".join(str(t).split()[: rng.integers(1, 4)]) for t in answers[cols[0]].fillna("")]
    elif spec.metric == "mean_column_rmsle":
        sub[cols] = answers[cols].to_numpy() * rng.uniform(0.8, 1.2, (len(sub), len(cols)))
    return sub.sample(frac=1.0, random_state=1).reset_index(drop=True)  # order must not matter
