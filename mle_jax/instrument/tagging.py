"""Trusted progress prints in a program (see `mle_jax.tasks.progress` for why): the agent's own progress
prints become `pass` before instrumenting, and the instrumenter's get the run's tag as first argument."""

from __future__ import annotations

import ast

from mle_jax.instrument import pyast
from mle_jax.instrument.verify import progress_print_text


def _stmt_spans(code: str) -> list[tuple[int, int]]:
    """(start, end) character offsets of each progress print statement in `code`."""
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
