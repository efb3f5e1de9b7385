"""Fixtures of the executor tests: the real pizza task prepared from the repository's data/raw, sandboxes."""

from __future__ import annotations

from pathlib import Path

import pytest

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
