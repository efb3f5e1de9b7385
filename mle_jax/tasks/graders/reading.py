"""Reading an untrusted submission CSV without ever raising anything but InvalidSubmission.

The shape of the table is checked on the raw bytes before pandas sees them: pandas takes minutes and gigabytes
over a header (or a first row, which it reads as index columns when wider than the header) of a million fields,
so a record wider than the task's submission can be, or more rows than its answers, is refused first.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pandas as pd

from mle_jax.tasks.graders.frames import InvalidSubmission
from mle_jax.tasks.task import TaskSpec

MIN_SIZE_CAP = 64 * 1024 * 1024  # bytes; a cap of max(this, 16 x the answers file) keeps a runaway file out
EXTRA_COLUMNS = 100  # columns beyond id + targets a submission may carry where its task ignores extras
# A record with a quote is read by the csv module, which makes a string per field: its length is capped first.
MAX_QUOTED_RECORD_BYTES = 1 << 20


def size_cap(answers_path: Path) -> int:
    try:
        return max(MIN_SIZE_CAP, 16 * answers_path.stat().st_size)
    except OSError:
        return MIN_SIZE_CAP


def max_columns(spec: TaskSpec) -> int:
    """The most columns a submission of this task can have: id + targets, and EXTRA_COLUMNS more where
    MLE-bench ignores extra columns."""
    required = 1 + len(spec.target_columns)
    return required if spec.exact_columns else required + EXTRA_COLUMNS


def read_submission(
    path: str | Path,
    max_bytes: int = MIN_SIZE_CAP,
    max_fields: int | None = None,
    max_rows: int | None = None,
) -> pd.DataFrame:
    """The submission as a frame read like MLE-bench (pandas; pandas 3 parses floats round-trip exactly),
    or InvalidSubmission.

    Rejected: missing/unreadable file, not .csv, over max_bytes, NUL bytes (binary), not UTF-8, empty,
    unparsable CSV; with the caps (None: none), a header or first row of more than max_fields fields and more
    than max_rows rows, both before pandas reads the file.
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
        raw.decode("utf-8")  # checked whole here; pandas then parses the bytes (a str copy would cost 4x)
    except UnicodeDecodeError as e:
        raise InvalidSubmission(f"submission is not UTF-8 text (byte {e.start})") from None
    return parse_csv_bytes(raw, max_fields, max_rows)


_LINE_END = re.compile(rb"[\r\n]")
_BLANK_LINES = re.compile(rb"(?:[ \t]*[\r\n])*")  # pandas skips blank (whitespace-only) lines
_BOM = b"\xef\xbb\xbf"


def record_fields(raw: bytes, start: int = 0) -> tuple[int, int]:
    """(fields, end) of the CSV record pandas reads first from raw[start:], blank lines skipped: 0 fields at the
    end of the data. end: where the next record's search starts.

    An unquoted record is one physical line: its commas + 1, counted without a string per field. A record with a
    quote may span lines: the csv module (whose quoting pandas shares) reads it, within MAX_QUOTED_RECORD_BYTES.
    """
    start = _BLANK_LINES.match(raw, start).end()
    if start >= len(raw):
        return 0, start
    end_match = _LINE_END.search(raw, start)
    end = end_match.start() if end_match else len(raw)
    if raw.find(b'"', start, end) < 0:
        return raw.count(b",", start, end) + 1, end
    chunk = raw[start : start + MAX_QUOTED_RECORD_BYTES + 1].decode("utf-8", errors="replace")
    lines = io.StringIO(chunk, newline="")
    try:
        record, error = next(csv.reader(lines), []), ""
    except csv.Error as e:
        record, error = [], str(e)
    used = len(chunk[: lines.tell()].encode("utf-8", errors="replace"))
    if used > MAX_QUOTED_RECORD_BYTES:
        raise InvalidSubmission(f"submission has a quoted record over {MAX_QUOTED_RECORD_BYTES} bytes long")
    if error:
        raise InvalidSubmission(f"submission is not a parsable CSV: {error}")
    return len(record), start + used


def check_shape(raw: bytes, max_fields: int | None, max_rows: int | None) -> int | None:
    """Raises InvalidSubmission for a header or first row wider than max_fields; returns the rows pandas needs to
    read to tell whether there are more than max_rows (None: all of them)."""
    if max_fields is not None:
        header, end = record_fields(raw, len(_BOM) if raw.startswith(_BOM) else 0)
        if header > max_fields:
            raise InvalidSubmission(
                f"submission header has {header} fields, more than the {max_fields} columns this task's "
                "submission can have"
            )
        first_row, _ = record_fields(raw, end)
        if first_row > max_fields:
            raise InvalidSubmission(
                f"submission's first row has {first_row} fields, more than the {max_fields} columns this task's "
                "submission can have"
            )
    if max_rows is not None and _line_ends(raw) > max_rows + 1:
        return max_rows + 1  # pandas stops there: enough to tell that there are too many
    return None


def _line_ends(raw: bytes) -> int:
    """An upper bound on the records of a CSV (quoted fields may hold line ends; \\r\\n counts twice)."""
    return raw.count(b"\n") + raw.count(b"\r")


def parse_csv_bytes(raw: bytes, max_fields: int | None = None, max_rows: int | None = None) -> pd.DataFrame:
    """The frame of a UTF-8 CSV, or InvalidSubmission; max_fields / max_rows as in read_submission."""
    nrows = check_shape(raw, max_fields, max_rows)
    try:
        frame = pd.read_csv(io.BytesIO(raw), encoding="utf-8-sig", low_memory=False, nrows=nrows)
    except pd.errors.EmptyDataError:
        raise InvalidSubmission("submission has no header or rows") from None
    except (pd.errors.ParserError, ValueError, csv.Error, OverflowError, MemoryError) as e:
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise InvalidSubmission(f"submission is not a parsable CSV: {first}") from None
    if nrows is not None and max_rows is not None and len(frame) > max_rows:
        lines = _line_ends(raw) + (not raw.endswith((b"\n", b"\r")))
        raise InvalidSubmission(f"submission has {lines - 1} rows by its line ends, more than the {max_rows} expected")
    frame.columns = [str(c) for c in frame.columns]
    return frame


def read_answers(path: str | Path) -> pd.DataFrame:
    """The private answers (trusted): read the same way as submissions so ids compare alike."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"private answers not found at {path}")
    return pd.read_csv(path, low_memory=False)
