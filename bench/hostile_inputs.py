"""Hostile inputs of issue 20, measured through the real CLIs: each hostile case beside a normal peer in the same
run, as /usr/bin/time -v sees the CLI (wall time; peak RSS: the largest of its process tree's processes).

  .venv/bin/python bench/hostile_inputs.py [--executor] [--out docs/results/hostile_inputs.json]

grade: `python -m mle_jax.tasks grade` on the real pizza answers: the sample submission (peer), a header of 10^6
extra fields (7.9 MB), and 7 million rows (the 64 MB cap's worth).
--executor also runs, in the real bwrap sandbox through `python -m mle_jax.executor run`, a program that writes a
constant submission (peer), one that writes the wide header, one that makes 220,000 empty files and then
writes 800 MB under --work-mb 300 (the default cap of 200,000 work-dir entries applies), and the hostile programs of
issue 34: a tree 3,000 folders deep, a detached child rewriting submission.csv after the program exits (run 10
times: how often each grade came out), a sparse 256 MB submission.csv (what its results folder then holds on
disk), and a child that ptrace-stops the program (under --timeout 10).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mle_jax.tasks.prepare import RAW_DATA_DIR, prepare  # noqa: E402
from mle_jax.warmstart.corpus import public_dir_in_sandbox  # noqa: E402
from tests.executor.programs import (  # noqa: E402  (the tests' programs, at full size)
    DEEP_TREE,
    LATE_WRITER,
    MANY_FILES_THEN_BYTES,
    PTRACE_STOP_INIT,
    SPARSE_SUBMISSION,
)

PIZZA = "random-acts-of-pizza"
PEER_PROGRAM = """
import pandas as pd
test = pd.read_json("/data/random-acts-of-pizza/test.json")
pd.DataFrame({"request_id": test["request_id"], "requester_received_pizza": 0.3}).to_csv("submission.csv", index=False)
"""
WIDE_PROGRAM = """
n = 10**6
with open("submission.csv", "w") as f:
    f.write("request_id,requester_received_pizza," + ",".join(f"c{i}" for i in range(n)) + "\\nt3_x,0.5\\n")
"""
MANY_FILES_PROGRAM = MANY_FILES_THEN_BYTES.format(files=220_000)


def timed(args: list[str], timeout: float) -> dict:
    """The command's JSON output (its stdout), wall seconds and peak RSS in MB."""
    done = subprocess.run(["/usr/bin/time", "-v", *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", done.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    assert wall and rss, done.stderr[-2000:]
    seconds = int(wall.group(1) or 0) * 3600 + int(wall.group(2)) * 60 + float(wall.group(3))
    return {"wall_s": round(seconds, 2), "peak_rss_mb": round(int(rss.group(1)) / 1024, 1),
            "output": json.loads(done.stdout)}  # fmt: skip


def grade_cases(task, root: Path) -> dict:
    wide = root / "wide.csv"
    wide.write_text("request_id,requester_received_pizza," + ",".join(f"c{i}" for i in range(10**6)) + "\nt3_x,0.5\n")
    rows = root / "rows.csv"
    rows.write_text("request_id,requester_received_pizza\n" + "t3_x,0.5\n" * 7_000_000)
    cases = {"peer: sample submission": task.sample_submission_path, "header of 10^6 extra fields": wide,
             "7 million rows (63 MB)": rows}  # fmt: skip
    out = {}
    for name, path in cases.items():
        cmd = [sys.executable, "-m", "mle_jax.tasks", "grade", PIZZA, str(path), "--answers", str(task.answers_path)]
        out[name] = {"bytes": path.stat().st_size, **timed(cmd, 1800)}
    return out


def allocated_bytes(folder: Path) -> int:
    """What a folder holds on disk (allocated blocks, as du counts)."""
    return sum(p.lstat().st_blocks * 512 for p in folder.rglob("*"))


def executor_cases(task, root: Path) -> dict:
    data = public_dir_in_sandbox(PIZZA)
    out = {}
    for name, program, extra, runs in (
        ("peer: program writing a constant submission", PEER_PROGRAM.replace("/data/random-acts-of-pizza/", data), [],
         1),
        ("program writing the wide header", WIDE_PROGRAM, [], 1),
        ("220,000 empty files then 800 MB, --work-mb 300", MANY_FILES_PROGRAM, ["--work-mb", "300"], 1),
        ("a tree 3,000 folders deep", DEEP_TREE.format(depth=3000), [], 1),
        ("a child rewriting submission.csv after the program exits, 10 runs", LATE_WRITER, [], 10),
        ("a sparse 256 MB submission.csv", SPARSE_SUBMISSION, [], 1),
        ("a child ptrace-stopping the program, --timeout 10", PTRACE_STOP_INIT, ["--timeout", "10"], 1),
    ):  # fmt: skip
        code = root / "solution.py"
        code.write_text(program)
        grades: dict[str, int] = {}
        for i in range(runs):
            results = root / f"results_{len(out)}_{i}"
            cmd = [sys.executable, "-m", "mle_jax.executor", "run", "--task", PIZZA, "--code", str(code), "--prepared",
                   str(task.public_dir.parent), "--backend", "bwrap", "--timeout", "300", "--results", str(results),
                   *extra]  # fmt: skip
            res = timed(cmd, 900)  # the first run's time and memory are the case's
            grade = res["output"]
            key = f"{grade['status']}: {grade.get('grade_reason') or 'valid'}"
            grades[key] = grades.get(key, 0) + 1
            if i == 0:
                first = res
                first["results_bytes_on_disk"] = allocated_bytes(results)
        keep = ("status", "killed_reason", "disk_reason", "duration_s", "submission_valid", "grade_reason")
        output = first["output"]
        first["output"] = {k: output.get(k) for k in keep} | {"stdout_tail": output["stdout_tail"][-200:]}
        if runs > 1:
            first["outcomes"] = grades
        out[name] = first
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--executor", action="store_true", help="also the sandboxed programs (minutes)")
    p.add_argument("--out", default="", help="write the results as JSON here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="mle_jax_hostile_") as tmp:
        root = Path(tmp)
        task = prepare(PIZZA, RAW_DATA_DIR / PIZZA, root / "prepared")
        results = {"grade": grade_cases(task, root)}
        if args.executor:
            results["executor"] = executor_cases(task, root)
    for cases in results.values():
        peer = next(r for name, r in cases.items() if name.startswith("peer"))
        for r in cases.values():
            r["wall_vs_peer"] = round(r["wall_s"] / peer["wall_s"], 2)
            r["rss_vs_peer"] = round(r["peak_rss_mb"] / peer["peak_rss_mb"], 2)
    record = {
        "command": " ".join([".venv/bin/python", "bench/hostile_inputs.py", *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "results": results,
    }
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
