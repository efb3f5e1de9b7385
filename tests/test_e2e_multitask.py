"""End to end: `python -m mle_jax.launch --config=configs/multitask.py:cpu --config.loop.steps=1` over two tasks of
the mix (the whole mix's warm start would take minutes), small as tests/test_e2e.py keeps its run; its report.md
has a row per task."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mle_jax.report import read_metrics
from tests.test_e2e import SMALL

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]
MIX = ("random-acts-of-pizza", "spooky-author-identification")


def test_a_mix_of_two_tasks_runs_end_to_end_with_a_report_row_per_task(tmp_path):
    workdir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "mle_jax.launch",
        "--config=configs/multitask.py:cpu",
        f"--config.tasks={MIX!r}",
        "--config.loop.steps=1",
        f"--config.workdir={workdir}",
        f"--config.task.data_root={tmp_path / 'tasks'}",
    ]
    cmd += [f"--config.{k}={v}" for k, v in SMALL.items() if k != "loop.steps"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    samples = read_metrics(workdir / "samples.jsonl")
    assert {s["task"] for s in samples} <= set(MIX) and samples
    rows = read_metrics(workdir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1] and all(f"reward/mean/{t}" in rows[0] for t in MIX)
    ev = json.loads((workdir / "evaluation.json").read_text())
    assert sorted(ev["tasks"]) == sorted(MIX) and all(ev["tasks"][t]["scratch"]["samples"] == 4 for t in MIX)
    report = (workdir / "report.md").read_text()
    assert "## Per task" in report
    for t in MIX:  # a row of its evaluation per task of the mix
        assert f"| {t} | evaluation | 4 |" in report, report
    # both tasks' corpora were verified and trained on
    assert all((workdir / "warmstart" / t / "verified.jsonl").is_file() for t in MIX)
