"""The Task record: everything the prompt, the sandbox and the grader need to know of one competition."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TaskSpec:
    """Static facts of one MLE-bench competition (no paths).

    metric: name of a grader in mle_jax.tasks.graders (e.g. "auc", "log_loss").
    id_column / target_columns: the submission's columns, in order.
    data_files: the public files the agent is told about.
    """

    id: str
    metric: str
    lower_is_better: bool
    statement: str
    id_column: str
    target_columns: tuple[str, ...]
    data_files: tuple[str, ...]
    has_data_here: bool = False  # raw data ships in the repository's data/raw/
    sample_submission: str = "sample_submission.csv"  # file name in public/ (MLE-bench's name for the task)
    answers_file: str = "test.csv"  # file name in private/ the grader reads
    exact_columns: bool = False  # MLE-bench rejects any column beyond id + targets for this task
    id_first: bool = False  # MLE-bench reads the targets as every column after the first (spooky's iloc[:, 1:])
    # log loss: how MLE-bench checks that a row's probabilities sum to 1. "isclose": np.isclose(sum, 1,
    # atol=1e-6) (so |sum - 1| <= 1e-6 + 1e-5, numpy's rtol); "round6": round(sum, 6) == 1
    row_sum_rule: str = "isclose"
    # gold, silver, bronze and median, for a task MLE-bench's table (data/mlebench/medal_thresholds.csv) lacks
    medal_thresholds: tuple[float, float, float, float] | None = None
    # the paper's Table 1 row: Qwen2.5-3B prompted with AIDE, and after its RL (None: not one of the paper's tasks)
    paper: tuple[float, float] | None = None


@dataclass(frozen=True)
class Task:
    """A prepared task: the spec plus its MLE-bench `prepared/` folders.

    public_dir is what the agent sees (read-only in the sandbox); private_dir holds the answers
    and is only ever read by the grader, never mounted into a sandbox.
    """

    spec: TaskSpec
    public_dir: Path
    private_dir: Path

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def lower_is_better(self) -> bool:
        return self.spec.lower_is_better

    @property
    def answers_path(self) -> Path:
        return self.private_dir / self.spec.answers_file

    @property
    def sample_submission_path(self) -> Path:
        return self.public_dir / self.spec.sample_submission
