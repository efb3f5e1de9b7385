"""Shared fixtures: the real task data that ships in the repository (data/raw/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mle_jax.tasks.prepare import RAW_DATA_DIR


@pytest.fixture(scope="session")
def raw_data_dir() -> Path:
    if not RAW_DATA_DIR.is_dir():
        raise FileNotFoundError(f"real task data not found at {RAW_DATA_DIR}: the repository ships it in data/raw/")
    return RAW_DATA_DIR
