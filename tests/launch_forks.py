"""Runs `python -m MODULE ARGV` for many ARGVs in one interpreter: it imports the entry point once (JAX, flax, the
run's modules: most of its start-up time) and forks a child per ARGV, which runs the entry point's own
`app.run(main, flags_parser=parse_flags)` (what its `__main__` runs) with fresh absl flags.

    python -m tests.launch_forks [MODULE] < cases.json > results.json   (from the repository root)

MODULE: mle_jax.launch (the default), mle_jax.evaluate or mle_jax.experiments.learning. cases: a JSON list of argument
lists; results: a JSON list of {"returncode", "stdout", "stderr"}, in order. Only for error paths that end before any
work starts or that only print (tests/test_launch.py, tests/test_readme.py's dry runs, tests/test_e2e.py,
tests/experiments/test_learning.py): a child that got further would run a whole run in a forked interpreter.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from absl import app

ENTRY_POINTS = ("mle_jax.launch", "mle_jax.evaluate", "mle_jax.experiments.learning")
REPO = Path(__file__).resolve().parents[1]


def forked_runs(
    cases: list[list[str]], module: str = "mle_jax.launch", timeout: float = 600
) -> list[subprocess.CompletedProcess]:
    """`python -m MODULE ARGS` for each ARGS, as one interpreter that imports the entry point once and forks a child
    per ARGS (this module run as a program): the same entry point, without a JAX import per case."""
    done = subprocess.run([sys.executable, "-m", "tests.launch_forks", module], input=json.dumps(cases), cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=True)  # fmt: skip
    return [subprocess.CompletedProcess([module, *args], r["returncode"], r["stdout"], r["stderr"])
            for args, r in zip(cases, json.loads(done.stdout), strict=True)]  # fmt: skip


def entry_point(module: str) -> tuple[Callable, Callable]:
    """(main, flags_parser) of one of ENTRY_POINTS, its flags defined as its `__main__` defines them."""
    if module not in ENTRY_POINTS:
        raise SystemExit(f"launch_forks: {module!r} is not one of {ENTRY_POINTS}")
    mod = importlib.import_module(module if module != "mle_jax.experiments.learning" else f"{module}.__main__")
    if hasattr(mod, "_define_flags"):  # the learning experiment defines its flags only when run as a program
        mod._FLAGS.update(mod._define_flags())
    return mod.main, mod.parse_flags


def run_forked(module: str, main: Callable, parse_flags: Callable, argv: list[str], out_dir: Path) -> dict[str, object]:
    out, err = out_dir / "stdout", out_dir / "stderr"
    pid = os.fork()
    if pid == 0:  # the child: stdout/stderr to files, then the entry point
        code = 1
        try:
            os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            sys.argv = [module, *argv]
            app.run(main, argv=sys.argv, flags_parser=parse_flags)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
        except BaseException:  # a traceback is what the tests look for: print it as the interpreter would
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {"returncode": os.waitstatus_to_exitcode(status), "stdout": out.read_text(), "stderr": err.read_text()}


def main() -> None:
    module = sys.argv[1] if len(sys.argv) > 1 else "mle_jax.launch"
    entry, parse_flags = entry_point(module)
    cases = json.load(sys.stdin)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for argv in cases:
            results.append(run_forked(module, entry, parse_flags, argv, Path(tmp)))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
