"""The seven progress prints of the paper (§3.2, appendix C.3) and how they are counted in terminal output."""

from __future__ import annotations

import ast
import re
import secrets

from mle_jax.instrument import pyast

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


# ---- trusted progress prints --------------------------------------------------------------------
# The reward counts progress prints, so a policy could print them itself for +0.1 each without doing
# the work (the paper shares this gap). Before a run: the agent's own progress prints are replaced by
# `pass`, the program is instrumented, and every progress print left (the instrumenter's) is tagged
# with a random per-run nonce the agent cannot know. Only tagged lines count; the tag is removed from
# the output before anyone (the improve prompt included) sees it.


def new_tag() -> str:
    """A per-run marker; printed first on each instrumenter line (`print(TAG, "loaded data")`)."""
    return f"@@mle{secrets.token_hex(6)}@@"


def _stmt_spans(code: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each progress print statement in `code`."""
    from mle_jax.instrument.verify import progress_print_text  # verify imports this module

    tree = pyast.parse(code)
    starts = [0]
    for line in code.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def offset(lineno: int, col: int) -> int:  # ast columns are utf-8 byte offsets
        line = code[starts[lineno - 1] : starts[lineno]]
        return starts[lineno - 1] + len(line.encode()[:col].decode(errors="ignore"))

    spans = []
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and progress_print_text(node) is not None:
            spans.append((offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)))
    return sorted(spans)


def strip_agent_progress(code: str) -> str:
    """The agent's program with each of its own progress print statements replaced by `pass`.

    Code that does not parse is returned as is (it will fail in the sandbox anyway).
    """
    try:
        spans = _stmt_spans(code)
    except SyntaxError:
        return code
    for start, end in reversed(spans):
        code = code[:start] + "pass" + code[end:]
    return code


def tag_progress(code: str, tag: str) -> str:
    """The instrumented program with `tag` as the first argument of every progress print."""
    try:
        spans = _stmt_spans(code)
    except SyntaxError:
        return code
    for start, _ in reversed(spans):
        paren = code.index("(", start) + 1  # the statement is `print(...)`: its first parenthesis
        code = code[:paren] + repr(tag) + ", " + code[paren:]
    return code


def count_tagged_progress(output_text: str, tag: str) -> tuple[str, ...]:
    """Distinct progress prints on lines that start with `tag` (the instrumenter's), in PROGRESS_PRINTS order."""
    pattern = re.compile(
        r"^" + re.escape(tag) + r" ?(" + "|".join(re.escape(p) for p in PROGRESS_PRINTS) + ")", re.MULTILINE
    )
    seen = set(pattern.findall(output_text.replace("\r", "\n")))
    return tuple(p for p in PROGRESS_PRINTS if p in seen)


def untag(output_text: str, tag: str) -> str:
    """The output as the paper shows it: tagged lines become plain progress prints."""
    return re.sub(r"^" + re.escape(tag) + r" ?", "", output_text, flags=re.MULTILINE)
