from __future__ import annotations

from pathlib import Path

import pytest

from mle_jax.tasks.prepare import prepare
from mle_jax.tasks.task import Task


@pytest.fixture(scope="session")
def pizza_task(raw_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Task:
    root = tmp_path_factory.mktemp("instrument-pizza")
    return prepare("random-acts-of-pizza", raw_data_dir / "random-acts-of-pizza", root / "prepared")
