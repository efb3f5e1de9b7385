"""Reading an untrusted submission CSV without ever raising anything but InvalidSubmission."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from mle_jax.tasks.graders.frames import InvalidSubmission

MIN_SIZE_CAP = 64 * 1024 * 1024  # bytes; a cap of max(this, 16 x the answers file) keeps a runaway file out


def size_cap(answers_path: Path) -> int:
    try:
        return max(MIN_SIZE_CAP, 16 * answers_path.stat().st_size)
    except OSError:
        return MIN_SIZE_CAP


def read_submission(path: str | Path, max_bytes: int = MIN_SIZE_CAP) -> pd.DataFrame:
    """The submission as a frame read like MLE-bench (pandas; pandas 3 parses floats round-trip exactly),
    or InvalidSubmission.

    Rejected: missing/unreadable file, not .csv, over max_bytes, NUL bytes (binary), not UTF-8, empty,
    unparsable CSV.
    """
    path = Path(path)
    if path.suffix.lower() != ".csv":
        raise InvalidSubmission(f"submission must be a .csv file, got {path.name!r}")
    try:
        if not path.is_file():
            raise InvalidSubmission(f"no submission file at {path}")
        size = path.stat().st_size
        if size > max_bytes:
            raise InvalidSubmission(f"submission is {size} bytes, over the {max_bytes}-byte cap")
        raw = path.read_bytes()
    except OSError as e:
        raise InvalidSubmission(f"cannot read submission: {e.strerror or e}") from None
    if not raw.strip():
        raise InvalidSubmission("submission file is empty")
    if b"\x00" in raw:
        raise InvalidSubmission("submission is binary (contains NUL bytes), not a CSV")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InvalidSubmission(f"submission is not UTF-8 text (byte {e.start})") from None
    return parse_csv_text(text)


def parse_csv_text(text: str) -> pd.DataFrame:
    try:
        frame = pd.read_csv(io.StringIO(text), low_memory=False)
    except pd.errors.EmptyDataError:
        raise InvalidSubmission("submission has no header or rows") from None
    except (pd.errors.ParserError, ValueError, csv.Error, OverflowError, MemoryError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise InvalidSubmission(f"submission is not a parsable CSV: {first}") from None
    frame.columns = [str(c) for c in frame.columns]
    return frame


def read_answers(path: str | Path) -> pd.DataFrame:
    """The private answers (trusted): read the same way as submissions so ids compare alike."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"private answers not found at {path}")
    return pd.read_csv(path, low_memory=False)
