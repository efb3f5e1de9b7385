"""Syntax-tree helpers shared by the instrumenters and the verifier: a thread-safe `ast.parse`, a call's name.

`ast.parse` is not safe to call from several threads at once: CPython 3.11 keeps the AST constructor's recursion
depth in state shared by the whole interpreter. When a garbage collection during one thread's parse runs a finaliser
and the GIL passes to another thread that is parsing too, the first parse fails with "SystemError: AST constructor
recursion depth mismatch" (cpython gh-106905). The warm-start verifier and the executor pool instrument programs
from threads, so every parse in mle_jax goes through one lock. Parsing is fast, so the lock costs nothing that
matters.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str) -> ast.Module:
    """ast.parse(source) under a process-wide lock."""
    with _LOCK:
        return ast.parse(source)


def call_name(func: ast.expr) -> str:
    """The name a call's function is called by: `f` for f(...), `fit` for model.fit(...); "" for anything else
    (a call of a call's result or of a subscript), whose target the syntax alone cannot tell."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""
