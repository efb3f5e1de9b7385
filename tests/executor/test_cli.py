"""The executor CLI end to end (bwrap), and the runtime's package report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mle_jax.executor.__main__ import main
from mle_jax.executor.bwrap import ROOTS_PREFIX
from mle_jax.executor.runtime import REPO_ROOT, sandbox_packages
from tests.executor import programs
from tests.executor.conftest import deep_tree

pytestmark = pytest.mark.integration


def test_cli_runs_grades_and_rewards_the_pizza_solution(pizza_task, tmp_path):
    code = tmp_path / "solution.py"
    code.write_text(programs.PIZZA_SKLEARN)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mle_jax.executor",
            "run",
            "--task",
            pizza_task.id,
            "--code",
            str(code),
            "--prepared",
            str(pizza_task.public_dir.parent),
            "--timeout",
            "120",
            "--instrument",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        check=True,
    )
    res = json.loads(out.stdout)
    assert res["status"] == "ok" and res["exit_code"] == 0, res
    assert res["submission_valid"] is True and 0.6 < res["score"] < 1.0
    assert res["reward"] == pytest.approx(res["score"])  # higher is better for AUC
    assert res["instrumented"] == "ast" and "trained model" in res["progress_prints"]
    assert res["duration_s"] > 0.5


def test_cli_reports_a_crash_with_the_failure_reward(pizza_task, tmp_path):
    code = tmp_path / "solution.py"
    code.write_text("import pandas\nprint('imported packages')\nraise SystemExit(2)\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mle_jax.executor",
            "run",
            "--task",
            pizza_task.id,
            "--code",
            str(code),
            "--prepared",
            str(pizza_task.public_dir.parent),
            "--timeout",
            "60",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
        check=True,
    )
    res = json.loads(out.stdout)
    assert res["status"] == "error" and res["exit_code"] == 2
    assert res["submission_valid"] is False
    assert res["reward"] == pytest.approx(-10.0 + 0.1)  # one progress print seen


def test_a_submission_written_before_an_error_is_not_graded(pizza_task, tmp_path):
    """The paper grades programs that run without error: a valid submission.csv written before the program
    exits non-zero earns the failure reward plus partial credit, not its score."""
    code = tmp_path / "solution.py"
    code.write_text(programs.PIZZA_SKLEARN + "\nraise SystemExit(3)\n")
    out = subprocess.run(
        [sys.executable, "-m", "mle_jax.executor", "run", "--task", pizza_task.id, "--code", str(code),
         "--prepared", str(pizza_task.public_dir.parent), "--timeout", "120", "--instrument"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, check=True,
    )  # fmt: skip
    res = json.loads(out.stdout)
    assert res["status"] == "error" and res["exit_code"] == 3
    assert res["submission_valid"] is False and res["score"] is None
    assert "did not run without error" in res["grade_reason"]
    n = len(res["progress_prints"])
    assert n >= 5 and res["reward"] == pytest.approx(-10.0 + 0.1 * n)


def test_sandbox_packages_reports_what_imports():
    pkgs = sandbox_packages()
    for name in (
        "pandas",
        "numpy",
        "scikit-learn",
        "xgboost",
        "lightgbm",
        "statsmodels",
        "scipy",
        "torch",
        "bayesian-optimization",
    ):
        assert name in pkgs
    assert "timm" not in pkgs  # torchvision has no CPU build here, so timm is not installed


def _cli_run(task, code_path, *extra: str, timeout: int = 300) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "mle_jax.executor", "run", "--task", task.id, "--code", str(code_path),
         "--prepared", str(task.public_dir.parent), *extra],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=timeout, check=True,
    )  # fmt: skip
    return json.loads(out.stdout)


@pytest.mark.timeout(120)  # before the fix, grading alone took minutes and gigabytes
def test_a_million_column_header_from_a_sandboxed_program_is_refused(pizza_task, tmp_path):
    code = tmp_path / "solution.py"
    code.write_text(programs.WIDE_HEADER)
    res = _cli_run(pizza_task, code, "--timeout", "60")
    assert res["status"] == "ok", res
    assert res["submission_valid"] is False and "header has 1000002 fields" in res["grade_reason"], res


def test_many_files_then_a_big_write_is_killed_for_disk(pizza_task, tmp_path):
    """The walk that measures the work dir is bounded; past its bound the entries themselves are over the cap
    (they used to stop the count, and the bytes written after them went unseen)."""
    code = tmp_path / "solution.py"
    code.write_text(programs.MANY_FILES_THEN_BYTES.format(files=2200))
    res = _cli_run(pizza_task, code, "--timeout", "120", "--work-mb", "300", "--work-files", "2000")
    assert res["status"] == "killed" and res["killed_reason"] == "disk", res
    assert "more than 2000 files" in res["disk_reason"], res
    assert "wrote 800 MB" not in res["stdout_tail"]


def test_bad_work_cap_is_one_line(pizza_task, tmp_path):
    code = tmp_path / "solution.py"
    code.write_text("print(1)\n")
    out = subprocess.run(
        [sys.executable, "-m", "mle_jax.executor", "run", "--task", pizza_task.id, "--code", str(code),
         "--work-mb", "0"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
    )  # fmt: skip
    assert (
        out.returncode == 2
        and out.stderr.strip() == "error: executor.max_work_mb=0 is too small: it must be at least 1"
    )


def test_a_deep_tree_is_the_programs_result_and_later_runs_tidy_up(pizza_task, tmp_path, monkeypatch, capsys):
    """A tree 1,200 folders deep crashed the CLI (RecursionError removing the work dir, the tree left behind), and
    every later executor with the same temporary root crashed tidying it up. Now: the program's own result (-10:
    no submission), nothing left in $TMPDIR, and a later run reaps a dead executor's roots (a deep tree, unread
    results) and scores."""
    code = tmp_path / "deep.py"
    code.write_text(programs.DEEP_TREE.format(depth=1200))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "mle_jax.executor", "run", "--task", pizza_task.id, "--code", str(code),
         "--prepared", str(pizza_task.public_dir.parent), "--timeout", "60"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, env={**os.environ, "TMPDIR": str(tmp)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    assert res["status"] == "ok" and res["reward"] == -10.0 and "made a tree 1200" in res["stdout_tail"], res
    assert list(tmp.iterdir()) == []  # the CLI's sandbox removed its roots when it closed
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names a dead executor, which left a deep tree in its work root
    dead_root = tmp / f"{ROOTS_PREFIX}_{gone.pid}"
    deep_tree(dead_root / "work" / "0123456789ab", 1200)
    (dead_root / "results" / "0123456789ab").mkdir(parents=True)  # and the results of a run in flight
    (dead_root / "results" / "0123456789ab" / "stdout.txt").write_text("unread\n")
    monkeypatch.setenv("TMPDIR", str(tmp))
    normal = tmp_path / "normal.py"
    normal.write_text(programs.NORMAL)
    argv = ["run", "--task", pizza_task.id, "--code", str(normal), "--prepared", str(pizza_task.public_dir.parent)]
    assert main([*argv, "--timeout", "60"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["status"] == "ok" and res["submission_valid"] is True, res
    assert list(tmp.iterdir()) == []  # the dead executor's roots reaped, this run's removed


def test_a_missing_code_or_task_folder_is_one_line(pizza_task, tmp_path, capsys):
    code = tmp_path / "solution.py"
    code.write_text("print(1)\n")
    cases = {
        ("--code", str(tmp_path / "absent.py"), "--prepared", str(pizza_task.public_dir.parent)): (
            f"error: --code {tmp_path / 'absent.py'}: No such file or directory"
        ),
        ("--code", str(code), "--prepared", str(tmp_path / "absent")): (
            f"error: random-acts-of-pizza: no public/ folder in {tmp_path / 'absent'}; prepare it with "
            f"`python -m mle_jax.tasks prepare random-acts-of-pizza --raw RAW --out {tmp_path / 'absent'}`"
        ),
    }
    for args, line in cases.items():
        assert main(["run", "--task", pizza_task.id, *args]) == 2
        captured = capsys.readouterr()
        assert captured.err == line + "\n" and captured.out == ""
    assert main(["run", "--task", "no-such-task", "--code", str(code), "--prepared", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown task id 'no-such-task'; known: ") and err.count("\n") == 1
