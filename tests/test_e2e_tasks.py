"""End to end on every other task with data: configs/<task>.py:cpu through every stage (prepare the shipped data,
warm start on its verified corpus, an RL step, evaluation, report), made as small as the stages allow. Pizza's
fuller run, its resume and the evaluate CLI are tests/test_e2e.py; the numbers of the real runs are in the README."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from mle_jax.report import read_metrics
from mle_jax.run import run
from mle_jax.tasks.registry import get_spec

pytestmark = pytest.mark.e2e

# config module -> task id
TASKS = {
    "insults": "detecting-insults-in-social-commentary",
    "leaf": "leaf-classification",
    "nomad2018": "nomad2018-predict-transparent-conductors",
    "spooky": "spooky-author-identification",
    "tweet_sentiment": "tweet-sentiment-extraction",
}
TINY = {
    "loop.steps": 1,
    "loop.batch_size": 2,
    "loop.in_flight_multiplier": 1,
    "ppo.mini_batch_size": 2,
    "ppo.micro_batch_size": 2,
    "eval.samples": 1,
    "warmstart.corpus_size": 2,
    "warmstart.steps": 4,
    "warmstart.warmup_steps": 1,
    "warmstart.batch_size": 2,
    "warmstart.instrument_examples": 4,  # the instrumentation task is taught and measured, on a few programs
    "warmstart.instrument_eval": 2,
}


def tiny_config(name: str, workdir: Path):
    cfg = importlib.import_module(f"configs.{name}").get_config("cpu")
    cfg.workdir = str(workdir)
    cfg.task.data_root = str(workdir.parent / "tasks")
    for key, value in TINY.items():
        section, field = key.split(".")
        cfg[section][field] = value
    return cfg


@pytest.mark.parametrize("name", sorted(TASKS))
def test_one_rl_step_end_to_end(name, tmp_path):
    workdir = tmp_path / "run"
    summary = run(tiny_config(name, workdir))
    assert summary["task"] == TASKS[name]
    assert summary["warmstart/corpus_verified"] == 2  # the corpus ran and graded in the sandbox on the real data
    assert summary["rl/steps"] == 1 and summary["rl/samples"] >= 2
    [row] = read_metrics(workdir / "metrics.jsonl")
    assert row["step"] == 1 and 0.0 <= row["valid_fraction"] <= 1.0
    assert row["learner/actor/pg_loss"] == row["learner/actor/pg_loss"]  # finite, not NaN
    best_key = "score/min" if get_spec(TASKS[name]).lower_is_better else "score/max"  # best in the task's direction
    assert summary["score/best_during_rl"] == row.get(best_key)
    ev = json.loads((workdir / "evaluation.json").read_text())
    assert ev["task"] == TASKS[name] and ev["scratch"]["samples"] == 1
    assert "## Evaluation" in (workdir / "report.md").read_text()
    assert (workdir / "hf_export" / "tokenizer.json").is_file()
