"""The results files the tables are rendered from: where they are and how they are read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
RESULTS = "docs/results"


def load(path: str | Path, root: Path = ROOT) -> Any:
    """A results file: a JSON object, or a JSONL file's records as a list."""
    p = root / path
    if p.suffix == ".jsonl":
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return json.loads(p.read_text())


def records(path: str | Path, root: Path = ROOT) -> list[dict]:
    """Every record of a results file (a JSON file is one)."""
    data = load(path, root)
    return data if isinstance(data, list) else [data]


def summary_path(run: str) -> str:
    """A learning experiment's summary (mle_jax.experiments.learning's `--out`, copied to docs/results/RUN)."""
    return f"{RESULTS}/{run}/summary.json"
