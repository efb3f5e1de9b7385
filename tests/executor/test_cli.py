"""The executor CLI end to end (bwrap), and the runtime's package report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mle_jax.executor.runtime import REPO_ROOT, sandbox_packages
from tests.executor import programs

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
