"""MLE-bench's medal levels: the rule at its thresholds in both directions, the thresholds' directions against
the graders', and the grade CLI's "medal" on hand-made submissions to real tasks."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from mle_jax.tasks.__main__ import main as tasks_cli
from mle_jax.tasks.medals import LEVELS, medal, medal_summary, task_ids, thresholds
from mle_jax.tasks.registry import all_specs

PIZZA = "random-acts-of-pizza"  # AUC: higher is better; gold 0.97908, silver 0.76482, bronze 0.6921, median 0.5996
SPOOKY = "spooky-author-identification"  # log loss: lower; gold 0.16506, silver 0.26996, bronze 0.29381, median 0.41879


def test_every_task_has_thresholds_in_its_graders_direction():
    specs = {s.id: s for s in all_specs()}
    assert set(task_ids()) == set(specs)  # the twelve tasks, no more
    for task_id, spec in specs.items():
        t = thresholds(task_id)
        assert t.lower_is_better == spec.lower_is_better, task_id
        ranked = [t.gold, t.silver, t.bronze, t.median]
        assert ranked == sorted(ranked, reverse=not t.lower_is_better), task_id  # gold best, median worst


@pytest.mark.parametrize(
    "task_id, score, level",
    [
        (PIZZA, 1.0, "gold"),
        (PIZZA, 0.97908, "gold"),  # exactly at a threshold earns it
        (PIZZA, 0.97907, "silver"),
        (PIZZA, 0.76482, "silver"),
        (PIZZA, 0.6921, "bronze"),
        (PIZZA, 0.69209, "above_median"),
        (PIZZA, 0.59961, "above_median"),
        (PIZZA, 0.5996, "none"),  # at the median is not above it (MLE-bench: strict)
        (PIZZA, 0.5, "none"),
        (SPOOKY, 0.0, "gold"),
        (SPOOKY, 0.16506, "gold"),
        (SPOOKY, 0.16507, "silver"),
        (SPOOKY, 0.29381, "bronze"),
        (SPOOKY, 0.29382, "above_median"),
        (SPOOKY, 0.41879, "none"),
        (SPOOKY, 1.0986, "none"),
        ("leaf-classification", 0.0, "gold"),  # gold is a perfect log loss there
        ("leaf-classification", 0.00001, "silver"),
    ],
)
def test_medal_follows_the_metrics_direction_and_earns_a_threshold_it_meets(task_id, score, level):
    assert medal(task_id, score) == level


def test_an_unknown_task_is_a_one_line_error():
    with pytest.raises(KeyError, match="no medal thresholds for task 'pizza'; known: detecting-insults"):
        medal("pizza", 0.7)


def test_medal_summary_of_a_tasks_samples():
    out = medal_summary(SPOOKY, [0.2, 0.1, None, 0.3, 0.5])  # silver, gold, invalid, above median, none
    assert out["best"] == "gold" and out["any_medal"] == pytest.approx(0.4)
    assert out["shares"] == {"gold": 0.2, "silver": 0.2, "bronze": 0.0, "above_median": 0.2, "none": 0.2,
                             "invalid": 0.2}  # fmt: skip
    empty = medal_summary(PIZZA, [None, None])
    assert empty["best"] is None and empty["shares"]["invalid"] == 1.0 and empty["any_medal"] == 0.0
    assert set(LEVELS) < set(empty["shares"])


def _cli_grade(capsys, task, frame: pd.DataFrame, path) -> dict:
    frame.to_csv(path, index=False)
    assert tasks_cli(["grade", task.id, str(path), "--answers", str(task.private_dir.parent)]) == 0
    return json.loads(capsys.readouterr().out)


def _perfect_and_uninformative(task) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The answers' own targets, and a constant prediction (no information about any row)."""
    spec = task.spec
    answers = pd.read_csv(task.answers_path)
    perfect = answers[[spec.id_column, *spec.target_columns]]
    constant = perfect.copy()
    if spec.metric == "log_loss":  # a uniform distribution over the classes
        constant[list(spec.target_columns)] = 1.0 / len(spec.target_columns)
    elif spec.metric == "mean_column_rmsle":  # the training set's means
        train = pd.read_csv(task.public_dir / "train.csv")
        for c in spec.target_columns:
            constant[c] = float(train[c].mean())
    else:
        constant[list(spec.target_columns)] = 0.5
    return perfect, constant


@pytest.mark.parametrize(
    "task_id",
    [PIZZA, "detecting-insults-in-social-commentary", SPOOKY, "nomad2018-predict-transparent-conductors"],
)
def test_grade_cli_medal_perfect_is_gold_constant_is_none_invalid_is_null(prepared, capsys, tmp_path, task_id):
    task = prepared[task_id]
    perfect, constant = _perfect_and_uninformative(task)
    out = _cli_grade(capsys, task, perfect, tmp_path / "perfect.csv")
    assert out["valid"] and out["medal"] == "gold", out
    out = _cli_grade(capsys, task, constant, tmp_path / "constant.csv")
    assert out["valid"] and out["medal"] == "none", out
    out = _cli_grade(capsys, task, perfect.iloc[: len(perfect) // 2], tmp_path / "half.csv")  # rows missing
    assert out == {**out, "valid": False, "score": None, "medal": None}, out
