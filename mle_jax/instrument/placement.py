"""Where an instrumented program's progress prints are, against where the AST instrumenter puts them.

Verification accepts any pure progress print anywhere it keeps the program intact; this measures whether the
LM's prints also sit where they mean what they say ("trained model" after the fit, not before the imports).
A print's place is the program line before it (the last non-blank, non-print line) and its text.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from mle_jax.instrument import pyast
from mle_jax.instrument.copying import is_progress_print_line
from mle_jax.instrument.verify import progress_print_text


def print_text(line: str) -> str | None:
    """The progress text of `line` when it is one progress print statement, else None."""
    if not is_progress_print_line(line):
        return None
    return progress_print_text(pyast.parse(line.strip()).body[0])


def print_places(code: str) -> Counter[tuple[str | None, str]]:
    """Counter of (previous program line, progress text) over the progress prints of `code`."""
    places: Counter[tuple[str | None, str]] = Counter()
    previous = None
    for line in code.split("\n"):
        text = print_text(line)
        if text is not None:
            places[(previous, text)] += 1
        elif line.strip():
            previous = line.strip()
    return places


@dataclass(frozen=True)
class Agreement:
    """Prints in the same place as the reference's (`same`), only in the program (`extra`), only in the
    reference (`missing`)."""

    same: int
    extra: int
    missing: int

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(self.same + other.same, self.extra + other.extra, self.missing + other.missing)

    @property
    def precision(self) -> float:
        return self.same / (self.same + self.extra) if self.same + self.extra else float("nan")

    @property
    def recall(self) -> float:
        return self.same / (self.same + self.missing) if self.same + self.missing else float("nan")


def agreement(reference: str, code: str) -> Agreement:
    """How the progress prints of `code` agree in place with those of `reference` (both instrumented)."""
    ref, got = print_places(reference), print_places(code)
    return Agreement(sum((ref & got).values()), sum((got - ref).values()), sum((ref - got).values()))
