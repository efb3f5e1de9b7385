"""The one episode driver (mle_jax/env/driver.py): the only wait on executor futures outside executor/."""

from __future__ import annotations

import ast
from pathlib import Path

import mle_jax

ROOT = Path(mle_jax.__file__).parent
WAITS = {"wait", "as_completed"}  # concurrent.futures' ways to wait on many futures


def _waits(path: Path) -> list[str]:
    """The calls in `path` that wait on futures: concurrent.futures.wait/as_completed, and `.result()` of a future
    (a call `x.result()` or `x.future.result()` with no arguments)."""
    tree = ast.parse(path.read_text())
    imported = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "concurrent.futures"
        for a in n.names
        if a.name in WAITS
    }
    out = []
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if isinstance(f, ast.Name) and f.id in imported:
            out.append(f"{f.id}()")
        elif isinstance(f, ast.Attribute) and f.attr in WAITS and ast.unparse(f.value) == "concurrent.futures":
            out.append(f"{f.attr}()")
    return out


def test_exactly_one_wait_on_executor_futures_outside_the_executor():
    """RL, evaluation, search, the PPO-epochs experiment and the warm start's corpus verification wait on runs through
    env/driver.py's `wait_for_runs`: one call of concurrent.futures.wait in mle_jax/ outside executor/."""
    found = {
        str(p.relative_to(ROOT)): w
        for p in sorted(ROOT.rglob("*.py"))
        if "executor" not in p.relative_to(ROOT).parts[:1] and (w := _waits(p))
    }
    assert found == {"env/driver.py": ["wait()"]}
    # the loops that used to hold their own waits import it
    for module in ("rl/loop.py", "env/evaluation.py", "env/search.py", "warmstart/corpus.py"):
        assert "mle_jax.env.driver" in (ROOT / module).read_text(), module
