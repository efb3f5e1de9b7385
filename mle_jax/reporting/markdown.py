"""Markdown tables and the numbers in them: the one formatter every report and results table uses."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MINUS = "−"  # the typographic minus the documents' figures are written with


def markdown_table(header: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """A GitHub markdown table: the header, the separator, one line per row (cells by format_cell)."""
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(format_cell(x) for x in row) + " |")
    return "\n".join(lines)


def format_cell(x: Any) -> str:
    """A table cell: None as a dash, a float to 4 significant digits, anything else as str() writes it."""
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def number(x: float | None, digits: int = 2, minus: str = MINUS) -> str:
    """`x` to `digits` decimals with `minus` as its sign (the typographic minus unless told), a negative zero
    ("-0.00") without its sign; None as a dash."""
    if x is None:
        return "—"
    s = f"{x:.{digits}f}"
    return s[1:] if re.fullmatch(r"-0\.0*", s) else s.replace("-", minus)


def signed(x: float, digits: int = 2) -> str:
    """`x` with its sign always written: +0.03, −0.20."""
    return number(x, digits) if x < 0 else f"+{number(x, digits)}"


def plus_minus(mean: float | None, se: float | None, digits: int = 2, minus: str = MINUS) -> str:
    """ "mean ± se", both to `digits` decimals; the mean alone when `se` is None."""
    if se is None:
        return number(mean, digits, minus)
    return f"{number(mean, digits, minus)} ± {number(se, digits, minus)}"


def minutes(seconds: float) -> str:
    """A wall time in minutes to one decimal: "4.1 min"."""
    return f"{seconds / 60:.1f} min"
