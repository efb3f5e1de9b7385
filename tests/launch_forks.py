"""Runs `python -m mle_jax.launch ARGV` for many ARGVs in one interpreter: it imports the launcher once (JAX,
flax, the run's modules: most of a launch's start-up time) and forks a child per ARGV, which runs the launcher's
entry point (`app.run(main, flags_parser=parse_flags)`, what `__main__` runs) with fresh absl flags.

    python -m tests.launch_forks < cases.json > results.json   (from the repository root)

cases: a JSON list of argument lists; results: a JSON list of {"returncode", "stdout", "stderr"}, in order.
Only for error paths that end before any work starts (tests/test_launch.py): a child that got further would run
a whole training run in a forked interpreter.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

from absl import app

from mle_jax import launch


def run_forked(argv: list[str], out_dir: Path) -> dict[str, object]:
    out, err = out_dir / "stdout", out_dir / "stderr"
    pid = os.fork()
    if pid == 0:  # the child: stdout/stderr to files, then the launcher's entry point
        code = 1
        try:
            os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
            os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
            sys.argv = ["mle_jax.launch", *argv]
            app.run(launch.main, argv=sys.argv, flags_parser=launch.parse_flags)
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
    cases = json.load(sys.stdin)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for argv in cases:
            results.append(run_forked(argv, Path(tmp)))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
