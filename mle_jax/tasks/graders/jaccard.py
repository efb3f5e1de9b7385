"""Word-level Jaccard (tweet-sentiment-extraction), as defined on the competition page."""

from __future__ import annotations

import numpy as np
import pandas as pd

from mle_jax.tasks.graders.frames import align_by_id, check_columns, check_rows
from mle_jax.tasks.task import TaskSpec


def word_jaccard(a: str, b: str) -> float:
    """|A ∩ B| / |A ∪ B| of the lower-cased whitespace-split word sets.

    Both empty: 1.0 (identical). MLE-bench divides by zero there and voids the whole submission; we
    score the row as a match instead (documented deviation: an empty answer row exists in the raw data).
    """
    wa, wb = set(a.lower().split()), set(b.lower().split())
    union = len(wa | wb)
    return 1.0 if union == 0 else len(wa & wb) / union


def mean_word_jaccard(preds: list[str], truths: list[str]) -> float:
    """Two [N] lists of strings -> mean word_jaccard."""
    return float(np.mean([word_jaccard(p, t) for p, t in zip(preds, truths, strict=True)]))


def grade_jaccard(spec: TaskSpec, sub: pd.DataFrame, answers: pd.DataFrame) -> float:
    """MLE-bench: columns, rows, ids match; empty cells read as NaN count as empty strings."""
    check_columns(spec, sub)
    check_rows(sub, answers)
    sub, answers = align_by_id(spec, sub, answers)
    target = spec.target_columns[0]
    preds = sub[target].fillna("").astype(str).tolist()
    truths = answers[target].fillna("").astype(str).tolist()
    return mean_word_jaccard(preds, truths)
