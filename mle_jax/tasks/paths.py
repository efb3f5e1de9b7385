"""Where the repository keeps task data (no imports beyond the standard library, so configs/ can name it)."""

from __future__ import annotations

from pathlib import Path

RAW_DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "raw"  # raw Kaggle files, one folder per task id
