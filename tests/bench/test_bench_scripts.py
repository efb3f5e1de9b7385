"""`make bench` runs every bench/*.py with no arguments (`PYTHONPATH=. .venv/bin/python bench/X.py`): each must
import in that environment and accept no arguments. One subprocess imports and parses them all, stopping each at
the end of its argument parsing (argparse or absl), so that no benchmark runs here."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (REPO / "bench").glob("*.py") if p.name != "__init__.py")

PARSE_ONLY = r"""
import argparse, runpy, sys
from absl import app, flags

class Parsed(Exception):
    pass

parse_args = argparse.ArgumentParser.parse_args
def stop_after_parsing(self, args=None, namespace=None):
    parse_args(self, args, namespace)
    raise Parsed

def stop_after_flags(main, argv=None, flags_parser=None, **kw):
    flags.FLAGS(sys.argv)
    raise Parsed

argparse.ArgumentParser.parse_args = stop_after_parsing
app.run = stop_after_flags
sys.path.insert(0, "bench")  # as when a script runs: its own folder first
absl_flags = set(flags.FLAGS)
for name in sys.argv[1:]:
    sys.argv = [f"bench/{name}"]
    try:
        runpy.run_path(f"bench/{name}", run_name="__main__")
        print(f"{name}: ran without parsing arguments")
    except Parsed:
        print(f"{name}: ok")
    except SystemExit as e:
        print(f"{name}: exit {e.code}")
    except Exception as e:
        print(f"{name}: {type(e).__name__}: {e}")
    flags.FLAGS.unparse_flags()
    for f in set(flags.FLAGS) - absl_flags:  # each absl script defines its own flags; the next may reuse a name
        delattr(flags.FLAGS, f)
"""


def test_every_bench_script_runs_as_make_bench_runs_it():
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"PYTHONPATH=\. \$\(VPY\) \$\$b", makefile), "make bench no longer runs PYTHONPATH=. bench/X.py"
    env = {**os.environ, "PYTHONPATH": "."}
    done = subprocess.run([sys.executable, "-c", PARSE_ONLY, *SCRIPTS], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    results = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line)
    assert results == dict.fromkeys(SCRIPTS, "ok"), done.stdout + done.stderr[-3000:]
