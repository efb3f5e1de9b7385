"""Fixtures of the executor tests: the real pizza task prepared from the repository's data/raw, sandboxes."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from mle_jax.executor.grading import grade_run
from mle_jax.executor.result import Limits
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.tasks.prepare import prepare
from mle_jax.tasks.task import Task

# Short limits for hostile programs: the machine is shared.
HOSTILE = Limits(timeout_s=6.0, memory_mb=768, cpus=1, max_procs=64, max_file_mb=64, max_output_bytes=16384)
# Programs only the clock stops (a sleep, a loop, a fork bomb under the process cap): the test waits out the whole
# timeout, so a shorter one (a loop or a bomb burns a core for all of it)
CLOCK = Limits(timeout_s=3.0, memory_mb=768, cpus=1, max_procs=64, max_file_mb=64, max_output_bytes=16384)
NORMAL = Limits(timeout_s=60.0, memory_mb=2048, cpus=1, max_procs=64, max_file_mb=64, max_output_bytes=16384)
BWRAP = ExecutorSettings(backend="bwrap")


@pytest.fixture(scope="session")
def pizza_task(raw_data_dir: Path, tmp_path_factory) -> Task:
    out = tmp_path_factory.mktemp("pizza") / "prepared"
    return prepare("random-acts-of-pizza", raw_data_dir / "random-acts-of-pizza", out)


def graded_outcomes(sandbox, task: Task, code: str, limits: Limits, runs: int) -> Counter:
    """How often each (status, submission bytes, grade) came out of `runs` runs of `code`: one key means the grade
    never depended on timing."""
    outcomes: Counter = Counter()
    for _ in range(runs):
        r = sandbox.run(code, task, limits)
        g = grade_run(task, r)
        outcomes[(r.status, r.submission_path.read_bytes() if r.submission_path else None, g.valid, g.reason)] += 1
    return outcomes


def deep_tree(root: Path, depth: int, file_bytes: int = 0) -> None:
    """Makes root/d/d/.../d, `depth` folders below root, through fds (its paths grow past PATH_MAX), with a file of
    file_bytes in the deepest folder when file_bytes > 0."""
    root.mkdir(parents=True)
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = below
        if file_bytes:
            f = os.open("bottom.bin", os.O_WRONLY | os.O_CREAT, dir_fd=fd)
            os.write(f, b"x" * file_bytes)
            os.close(f)
    finally:
        os.close(fd)
