"""End to end on every other task with data, in one run over their mix: `python -m mle_jax.launch
--config=configs/multitask.py:cpu --config.loop.steps=1` through every stage (prepare each task's shipped data,
warm start on the union of their verified corpora, an RL step with a sample of each task, an evaluation of each,
the report with a row per task), made as small as the stages allow. Pizza's single-task run, its resume and the
evaluate CLI are tests/test_e2e.py; the numbers of the real runs are in docs/results.md.

One run instead of one per task: the process, the tokenizer, the warm start's SFT and the update are set up once,
and every task's prompts, sandbox runs, graders and evaluation are still exercised. The mix also holds a task that
mle_jax does not know, defined as a user defines one (docs/architecture.md "A new task"): a module with its spec
(metric, medal thresholds, no paper row) and preparer, and a module of warm-start programs, imported by
`--config.task.modules`. It is a copy of pizza's data under another id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mle_jax.infra.metrics import read_metrics
from mle_jax.tasks.registry import get_spec

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[1]

# config module -> task id (pizza is tests/test_e2e.py's)
TASKS = {
    "insults": "detecting-insults-in-social-commentary",
    "leaf": "leaf-classification",
    "nomad2018": "nomad2018-predict-transparent-conductors",
    "spooky": "spooky-author-identification",
    "tweet_sentiment": "tweet-sentiment-extraction",
}
NEW = "throwaway-pizza-copy"  # the task defined outside mle_jax
MIX = (*TASKS.values(), NEW)
NEW_TASK = f"""
from mle_jax.tasks.prepare import PREPARERS, define_task
from mle_jax.tasks.task import TaskSpec
from mle_jax.warmstart import programs

import throwaway_programs

SPEC = TaskSpec(
    id={NEW!r},
    metric="auc",
    lower_is_better=False,
    statement="Predict the probability that a Reddit request got a free pizza (`requester_received_pizza`); AUC.",
    id_column="request_id",
    target_columns=("requester_received_pizza",),
    data_files=("train.json", "test.json"),
    sample_submission="sampleSubmission.csv",
    medal_thresholds=(0.99, 0.98, 0.97, 0.5),  # gold, silver, bronze, median: no MLE-bench row for it
)
files, prepare_pizza = PREPARERS["random-acts-of-pizza"]  # a throwaway: pizza's own preparer, on pizza's data
define_task(SPEC, files, prepare_pizza)
programs.register(throwaway_programs)
"""
NEW_PROGRAMS = f"""
import dataclasses

from mle_jax.warmstart.corpus import public_dir_in_sandbox
from mle_jax.warmstart.programs import pizza

TASK_ID = {NEW!r}


def programs(packages):
    old, new = public_dir_in_sandbox(pizza.TASK_ID), public_dir_in_sandbox(TASK_ID)
    return [
        dataclasses.replace(i, code=i.code.replace(old, new), meta={{**i.meta, "task": TASK_ID}})
        for i in pizza.programs(packages)
    ]
"""
TINY = {
    # seed 6 draws corpus programs that each run in seconds; seed 0's spooky linear SVM on word+char n-grams took
    # 28 s alone and 39 s in the suite, and its warm start (the corpus's verification) was 95 s of the run's 134
    "seed": 6,
    "loop.steps": 1,
    "loop.batch_size": len(MIX),  # equal weights: the mix's stream draws each task once in len(MIX) draws
    "loop.in_flight_multiplier": 1,
    "ppo.mini_batch_size": len(MIX),
    "ppo.micro_batch_size": len(MIX),
    "eval.samples": 1,
    "warmstart.corpus_size": 2,  # per task
    "warmstart.steps": 4,
    "warmstart.warmup_steps": 1,
    "warmstart.batch_size": 2,
    "warmstart.instrument_examples": 5,  # the instrumentation task is taught and measured, on a few programs
    "warmstart.instrument_eval": 2,
    "report.plots": False,
    "prompt.improve_seed": "corpus",  # the improve buffer starts with each task's verified corpus (run once, above)
}


@pytest.fixture(scope="module")
def mix_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("e2e-tasks")
    workdir = root / "run"
    (root / "throwaway_task.py").write_text(NEW_TASK)  # the two files of the new task
    (root / "throwaway_programs.py").write_text(NEW_PROGRAMS)
    raw = root / "raw"  # the shipped raw data, and pizza's again under the new task's id
    raw.mkdir()
    for task in TASKS.values():
        (raw / task).symlink_to(REPO / "data" / "raw" / task)
    (raw / NEW).symlink_to(REPO / "data" / "raw" / "random-acts-of-pizza")
    cmd = [sys.executable, "-m", "mle_jax.launch", "--config=configs/multitask.py:cpu", f"--config.tasks={MIX!r}",
           f"--config.workdir={workdir}", f"--config.task.data_root={root / 'tasks'}", f"--config.task.raw_dir={raw}",
           "--config.task.modules=('throwaway_task',)"]  # fmt: skip
    cmd += [f"--config.{k}={v}" for k, v in TINY.items()]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(root), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"improve buffer: {2 * len(MIX)} corpus programs" in done.stdout  # two per task
    return workdir


def test_the_mix_runs_every_stage_on_every_task(mix_run):
    workdir = mix_run
    for task in MIX:  # each corpus ran and graded in the sandbox on the task's real data
        verified = (workdir / "warmstart" / task / "verified.jsonl").read_text().splitlines()
        assert len(verified) == 2, (task, verified)
    samples = read_metrics(workdir / "samples.jsonl")
    assert sorted(s["task"] for s in samples) == sorted(MIX)  # one RL sample of each task, on its own data
    [row] = read_metrics(workdir / "metrics.jsonl")
    assert row["step"] == 1 and 0.0 <= row["valid_fraction"] <= 1.0
    assert row["learner/actor/pg_loss"] == row["learner/actor/pg_loss"]  # finite, not NaN
    for task in MIX:
        mine = [s for s in samples if s["task"] == task]
        assert row[f"reward/mean/{task}"] == pytest.approx(sum(s["reward"] for s in mine) / len(mine))
        scores = [s["score"] for s in mine if s.get("valid")]
        lower = task != NEW and get_spec(task).lower_is_better  # the new task is defined in the run's process only
        best = (min if lower else max)(scores) if scores else None
        assert row[f"score/best/{task}"] == best  # best in the task's own direction
    ev = json.loads((workdir / "evaluation.json").read_text())
    assert sorted(ev["tasks"]) == sorted(MIX)
    assert all(ev["tasks"][t]["task"] == t and ev["tasks"][t]["scratch"]["samples"] == 1 for t in MIX)
    report = (workdir / "report.md").read_text()
    assert "## Evaluation" in report and "## Per task" in report
    for task in MIX:  # a row of its evaluation per task of the mix
        assert f"| {task} | evaluation | 1 |" in report, report
    # the new task: graded by its spec's metric, its medals on its own thresholds, no paper row to compare with
    new = ev["tasks"][NEW]
    assert "paper" not in new and sum(new["scratch"]["medals"]["shares"].values()) == pytest.approx(1.0)
    assert "paper" in ev["tasks"][TASKS["spooky"]]
    assert (workdir / "hf_export" / "tokenizer.json").is_file()
