"""The command and date a results file records, so that every figure in README.md, BUILD.md and docs/*.md can
be traced to the run that measured it (`mle_jax.reporting.results_tables` renders the tables from such files).

    stamp()                        {"command": "python -m mle_jax.experiments.duration_bias --steps 300", "date": ...}
    write_json(path, payload)      payload with the stamp first, as indented JSON
    append_jsonl(path, payload)    one stamped JSON line appended (a results file that collects several runs)

The date is the UTC time the producing process wrote the record (ISO 8601, seconds). The command is the one the
process was started with, as a reader would type it from the repository root.
"""

from __future__ import annotations

import datetime
import json
import shlex
import sys
from pathlib import Path
from typing import Any

FIELDS: tuple[str, ...] = ("command", "date")


def command_line(argv: list[str] | None = None) -> str:
    """This process's command line: `python -m MODULE ARGS` for a module, `python PATH ARGS` for a script."""
    argv = list(sys.argv if argv is None else argv)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        head = f"python -m {spec.name.removesuffix('.__main__')}"
    else:
        script = Path(argv[0]) if argv else Path("?")
        try:
            script = script.resolve().relative_to(Path.cwd())
        except ValueError:
            pass
        head = f"python {script}"
    return " ".join([head, *(shlex.quote(a) for a in argv[1:])])


def now_iso(now: datetime.datetime | None = None) -> str:
    """UTC date and time, ISO 8601 to the second: '2026-11-26T10:00:00+00:00'."""
    now = now or datetime.datetime.now(datetime.UTC)
    return now.astimezone(datetime.UTC).isoformat(timespec="seconds")


def stamp(argv: list[str] | None = None) -> dict[str, str]:
    """{"command": ..., "date": ...} of this process, now."""
    return {"command": command_line(argv), "date": now_iso()}


def missing(record: dict[str, Any]) -> list[str]:
    """The provenance fields a results record lacks (empty when it has both)."""
    return [f for f in FIELDS if not isinstance(record.get(f), str) or not record[f]]


def write_json(path: str | Path, payload: dict[str, Any]) -> Path:
    """Writes `payload` with this process's stamp first (a payload's own command/date win) as indented JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**stamp(), **payload}, indent=1) + "\n")
    return path


def append_jsonl(path: str | Path, payload: dict[str, Any]) -> Path:
    """Appends `payload` with this process's stamp first as one JSON line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({**stamp(), **payload}) + "\n")
    return path
