"""Verification of an instrumented program: the original plus progress prints, nothing else.

Both programs are parsed; every statement `print("<progress text>")` (loss prints may carry extra
harmless arguments, e.g. `print("training loss:", loss)` or an f-string starting with the text) is removed
from both, and the remaining syntax trees must be identical (ast.dump: comments and layout do not count).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from mle_jax.instrument import pyast
from mle_jax.tasks.progress import LOSS_PRINTS, PROGRESS_PRINTS

# Calls allowed inside the extra arguments of a loss print: they cannot change the program's state.
# Anything else (a call to fit, a walrus, a lambda...) makes the print "not a pure print".
_MUTATING_CALLS = {
    "fit",
    "fit_transform",
    "partial_fit",
    "train",
    "step",
    "backward",
    "zero_grad",
    "append",
    "extend",
    "pop",
    "popitem",
    "insert",
    "remove",
    "clear",
    "update",
    "setdefault",
    "write",
    "writelines",
    "to_csv",
    "to_json",
    "to_parquet",
    "save",
    "savetxt",
    "dump",
    "exec",
    "eval",
    "system",
    "open",
    "unlink",
    "rmtree",
    "mkdir",
    "makedirs",
    "seed",
    "manual_seed",
    "set_params",
    "sort",
    "reverse",
    "add_",
    "mul_",
    "copy_",
    "fill_",
    "zero_",
    "next",
    "send",
    "input",
    "exit",
    "quit",
    "__import__",
    "setattr",
    "delattr",
    "globals",
    "locals",
    "vars",
    "compile",
    "run",
    "call",
}
_FORBIDDEN_NODES = (ast.NamedExpr, ast.Lambda, ast.Yield, ast.YieldFrom, ast.Await)


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str = ""
    n_inserted: int = 0  # progress prints the instrumented program has beyond the original's


def _harmless(expr: ast.expr) -> bool:
    for node in ast.walk(expr):
        if isinstance(node, _FORBIDDEN_NODES):
            return False
        if isinstance(node, ast.Call) and pyast.call_name(node.func) in _MUTATING_CALLS:
            return False
        if isinstance(node, ast.Call) and not pyast.call_name(node.func):
            return False  # calling the result of a call/subscript: cannot tell what it is
    return True


def _leading_text(arg: ast.expr) -> str | None:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        head = arg.values[0]
        if isinstance(head, ast.Constant) and isinstance(head.value, str):
            return head.value
    return None


def progress_print_text(stmt: ast.stmt) -> str | None:
    """The progress text when `stmt` is a pure progress print statement, else None."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    if not (isinstance(call.func, ast.Name) and call.func.id == "print") or not call.args:
        return None
    plain_keywords = all(
        kw.arg in ("flush", "sep", "end") and isinstance(kw.value, ast.Constant) for kw in call.keywords
    )
    if not plain_keywords:
        return None
    if any(isinstance(a, ast.Starred) for a in call.args):
        return None
    text = _leading_text(call.args[0])
    if text is None:
        return None
    if isinstance(call.args[0], ast.Constant) and text in PROGRESS_PRINTS and len(call.args) == 1:
        return text
    for loss in LOSS_PRINTS:  # "training loss:" / "testing loss:" may carry values
        if text.startswith(loss) and all(_harmless(a) for a in call.args):
            return loss
    return None


class _StripProgressPrints(ast.NodeTransformer):
    def __init__(self) -> None:
        self.removed = 0

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field, value in ast.iter_fields(node):
            if isinstance(value, list) and value and all(isinstance(v, ast.stmt) for v in value):
                kept = []
                for stmt in value:
                    if progress_print_text(stmt) is not None:
                        self.removed += 1
                    else:
                        kept.append(self.visit(stmt))
                setattr(node, field, kept)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)
        return node


def strip_progress_prints(tree: ast.AST) -> tuple[ast.AST, int]:
    stripper = _StripProgressPrints()
    return stripper.visit(tree), stripper.removed


def verify(original: str, instrumented: str) -> Verdict:
    """Accept `instrumented` only when it is `original` with progress print statements inserted."""
    try:
        orig_tree = pyast.parse(original)
    except SyntaxError as e:
        return Verdict(False, f"original does not parse: {e.msg} (line {e.lineno})")
    try:
        inst_tree = pyast.parse(instrumented)
    except SyntaxError as e:
        return Verdict(False, f"instrumented program does not parse: {e.msg} (line {e.lineno})")
    orig_stripped, n_orig = strip_progress_prints(orig_tree)
    inst_stripped, n_inst = strip_progress_prints(inst_tree)
    if ast.dump(orig_stripped) != ast.dump(inst_stripped):
        return Verdict(False, "program changed beyond inserted progress prints", n_inst - n_orig)
    return Verdict(True, "", n_inst - n_orig)
