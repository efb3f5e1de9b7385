"""Real task data prepared once per test session (all six tasks that ship raw data)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mle_jax.tasks.prepare import PREPARERS, prepare
from mle_jax.tasks.task import Task


@pytest.fixture(scope="session")
def prepared(raw_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Task]:
    root = tmp_path_factory.mktemp("prepared-tasks")
    return {tid: prepare(tid, raw_data_dir / tid, root / tid / "prepared") for tid in PREPARERS}
