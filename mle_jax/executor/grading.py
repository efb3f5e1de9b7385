"""Grading a finished run, outside the sandbox: the paper grades programs that run without error."""

from __future__ import annotations

from pathlib import Path

from mle_jax.executor.result import ExecResult, Status
from mle_jax.tasks.graders import GradeResult, grade
from mle_jax.tasks.task import Task


def grade_run(task: Task, result: ExecResult) -> GradeResult:
    """The run's submission graded against the task's private answers, or invalid with the reason.

    A program that exits non-zero, times out, runs out of memory or is killed is invalid even when it wrote a
    submission.csv first: only a run without error is graded (its reward is then partial credit, never a score).
    """
    if result.status is not Status.OK:
        why = f"exit code {result.exit_code}" if result.status is Status.ERROR else str(result.status)
        return GradeResult(False, None, f"the program did not run without error ({why}); its submission is not graded")
    if result.submission_path is None or not Path(result.submission_path).is_file():
        # why the executor copied none out (not written, not a regular file, over the cap), when it says
        return GradeResult(False, None, result.extra.get("submission_reason") or "no submission.csv was written")
    return grade(task, Path(result.submission_path))
