"""The seven progress prints of the paper (§3.2, appendix C.3) and how they are counted in terminal output."""

from __future__ import annotations

import re

PROGRESS_PRINTS: tuple[str, ...] = (
    "imported packages",
    "loaded data",
    "defined model",
    "training loss:",
    "trained model",
    "testing loss:",
    "predicted test labels",
)
LOSS_PRINTS: tuple[str, ...] = ("training loss:", "testing loss:")  # may be followed by a value

_LINE_START = re.compile(r"^(" + "|".join(re.escape(p) for p in PROGRESS_PRINTS) + ")", re.MULTILINE)


def count_progress(output_text: str) -> tuple[str, ...]:
    """Distinct progress prints that start a line of the output, in PROGRESS_PRINTS order.

    A print repeated (e.g. inside a loop) counts once. Carriage returns (progress bars) end lines too.
    """
    seen = set(_LINE_START.findall(output_text.replace("\r", "\n")))
    return tuple(p for p in PROGRESS_PRINTS if p in seen)
