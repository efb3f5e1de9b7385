"""MLE-bench's format check of a submission, from public files only: what an agent may learn about its submission.

MLE-bench gives agents a validation endpoint that says whether a submission has the right format, never its score.
Ours compares the submission with the task's public sample submission (its columns, its number of rows and its ids),
so nothing in the answer it gives is derived from the private answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from mle_jax.tasks.graders.frames import InvalidSubmission
from mle_jax.tasks.graders.reading import max_columns, read_submission, size_cap
from mle_jax.tasks.task import Task


@dataclass(frozen=True)
class FormatCheck:
    ok: bool
    reason: str  # "" when ok; else one line an agent may read


def check_format(task: Task, submission: str | Path | None, absent: str | None = None) -> FormatCheck:
    """Whether `submission` (a CSV, or None when none was written) has the format of the task's public sample
    submission: its id and target columns, as many rows, the same ids. absent: why there is none, as the executor
    said (e.g. "submission.csv is not a regular file" for a symlink); default: none was written."""
    if submission is None or not Path(submission).is_file():
        return FormatCheck(False, absent or "no submission.csv was written")
    sample_path = task.sample_submission_path
    try:
        sample = pd.read_csv(sample_path)
    except (OSError, ValueError) as e:  # the task's own file: a broken task, said plainly
        raise FileNotFoundError(f"{task.id}: cannot read the public sample submission {sample_path}: {e}") from None
    spec = task.spec
    try:
        frame = read_submission(
            submission, size_cap(sample_path), max_fields=max_columns(spec), max_rows=len(sample) + 1
        )
    except InvalidSubmission as e:
        return FormatCheck(False, str(e))
    missing = [c for c in (spec.id_column, *spec.target_columns) if c not in frame.columns]
    if missing:
        return FormatCheck(False, f"submission.csv lacks the column(s) {', '.join(missing)}")
    if len(frame) != len(sample):
        return FormatCheck(False, f"submission.csv has {len(frame)} rows; the sample submission has {len(sample)}")
    if spec.id_column in sample.columns:
        ids, expected = frame[spec.id_column].astype(str), sample[spec.id_column].astype(str)
        if set(ids) != set(expected) or ids.duplicated().any():
            return FormatCheck(False, f"the {spec.id_column} values of submission.csv are not the sample submission's")
    return FormatCheck(True, "")
