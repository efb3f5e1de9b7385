"""Markdown tables, the one formatter every report and results table uses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def markdown_table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """A GitHub markdown table: the header, the separator, one line per row (cells by format_cell)."""
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(x) for x in row) + " |")
    return "\n".join(lines)


def format_cell(x: Any) -> str:
    """A table cell: None as a dash, a float to 4 significant digits."""
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)
