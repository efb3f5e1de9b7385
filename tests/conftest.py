"""Shared fixtures. Paths to the real data that ships beside the repo."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("MLE_JAX_SHARED", REPO.parent / "shared"))
RAW_DATA = SHARED / "data" / "raw"


@pytest.fixture(scope="session")
def raw_data_dir() -> Path:
    if not RAW_DATA.is_dir():
        raise FileNotFoundError(f"real task data not found at {RAW_DATA}; set MLE_JAX_SHARED to shared/")
    return RAW_DATA
