"""The opening of a run's report.md, what a person reads first: the tasks, the steps and the wall time, the reward and
the valid fraction from the first RL step to the last, the best score in each task's direction with its medal, the
evaluation's medals, and where the plots are. The tables below it in report.md hold every figure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mle_jax.reporting.markdown import minutes, number, plus_minus
from mle_jax.reporting.search_report import search_medal_line
from mle_jax.tasks.medals import medal
from mle_jax.tasks.registry import get_spec


def run_tasks(
    summary: Mapping[str, Any], evaluation: Mapping[str, Any] | None, samples: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Every task of the run, its first task first: the summary's mix, else the evaluation's, else the samples'."""
    first = summary.get("task") or (evaluation or {}).get("task")
    mix = str(summary.get("tasks") or "").split(",")
    found = [*mix, *((evaluation or {}).get("tasks") or {}), *(r.get("task") for r in samples)]
    return list(dict.fromkeys(t for t in [first, *found] if t))


def direction(task: str) -> str:
    return "lower is better" if get_spec(task).lower_is_better else "higher is better"


def best_score(task: str, scores: Sequence[float | None]) -> float | None:
    """The best valid score in the task's direction (scores: None for an invalid sample); None when none is valid."""
    valid = [s for s in scores if s is not None]
    return ((min if get_spec(task).lower_is_better else max)(valid)) if valid else None


def _with_medal(task: str, score: float | None) -> str:
    return "—" if score is None else f"{number(score, 3)} ({medal(task, score)})"


def _mean_se(values: Sequence[float]) -> str:
    x = np.asarray(values, np.float64)
    se = float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else None
    return plus_minus(float(x.mean()), se)


def _steps_line(summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]]) -> str:
    steps = summary.get("rl/steps", len(rows))
    line = f"**Steps**: {steps} RL steps"
    if summary.get("rl/samples") is not None:
        line += f" ({summary['rl/samples']} samples)"
    if summary.get("rl/wall_s") is not None:
        line += f" in {minutes(summary['rl/wall_s'])}"
    if summary.get("wall_s") is not None:
        line += f"; the whole run {minutes(summary['wall_s'])} (warm start and evaluation included)"
    return line


def _reward_lines(samples: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Reward and valid fraction of the RL samples, first step -> last step (samples.jsonl; else metrics.jsonl)."""
    steps = sorted({r["step"] for r in samples if r.get("step") is not None and r.get("reward") is not None})
    lines = []
    if steps:
        first, last = ([r for r in samples if r.get("step") == s and r.get("reward") is not None] for s in
                       (steps[0], steps[-1]))  # fmt: skip
        lines.append(
            f"**Reward** (mean ± SE of the RL samples, step {steps[0]} → step {steps[-1]}): "
            f"{_mean_se([r['reward'] for r in first])} → {_mean_se([r['reward'] for r in last])} "
            f"({len(first)} → {len(last)} samples)"
        )
        valid = [sum(bool(r.get("valid")) for r in rs) / len(rs) for rs in (first, last)]
        lines.append(
            f"**Valid fraction** (step {steps[0]} → step {steps[-1]}): {number(valid[0])} → {number(valid[1])}"
        )
    elif rows:
        a, b = rows[0], rows[-1]
        lines.append(
            f"**Reward** (mean of the RL samples, step {a['step']} → step {b['step']}): "
            f"{number(a.get('reward/mean'))} → {number(b.get('reward/mean'))}"
        )
        lines.append(
            f"**Valid fraction** (step {a['step']} → step {b['step']}): {number(a.get('valid_fraction'))} → "
            f"{number(b.get('valid_fraction'))}"
        )
    return lines


def _per_task(evaluation: Mapping[str, Any] | None, task: str) -> Mapping[str, Any]:
    """One task's evaluation, of a run of one task or of a mix ({"tasks": {id: evaluation}})."""
    if not evaluation:
        return {}
    if evaluation.get("tasks"):
        return evaluation["tasks"].get(task) or {}
    return evaluation if evaluation.get("task", task) == task else {}


def medal_line(task: str, evaluation: Mapping[str, Any]) -> str:
    """The evaluation of one task in a sentence: each kind of sample's best score with its medal and the share of
    the samples with a medal, and the paper's figure after RL with its."""
    if "summary" in evaluation and "searches" in evaluation:  # a search's (evaluate --budget)
        return search_medal_line(evaluation)
    parts = []
    for kind in ("scratch", "improved", "best_of_both"):
        e = evaluation.get(kind)
        if not isinstance(e, Mapping):
            continue
        text = f"best of {e.get('samples')} {kind.replace('_', ' ')} samples {_with_medal(task, e.get('max'))}"
        if isinstance(e.get("medals"), Mapping) and e["medals"].get("any_medal") is not None:
            text += f", {e['medals']['any_medal']:.0%} of them with a medal"
        parts.append(text)
    paper = (evaluation.get("paper") or {}).get("qwen2.5-3b-rl")
    if paper is not None:
        parts.append(f"the paper after RL (best of 128) {_with_medal(task, paper)}")
    return "; ".join(parts)


def summary_lines(
    summary: Mapping[str, Any],
    evaluation: Mapping[str, Any] | None,
    samples: Sequence[Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    plots: Sequence[Path],
    evaluation_file: str = "evaluation.json",
) -> list[str]:
    """The summary's bullet lines (markdown). samples: samples.jsonl's records; rows: metrics.jsonl's."""
    tasks = run_tasks(summary, evaluation, samples)
    lines = [
        "**Task" + ("s" if len(tasks) > 1 else "") + "**: " + ", ".join(f"{t} ({direction(t)})" for t in tasks),
        _steps_line(summary, rows),
        *_reward_lines(samples, rows),
    ]
    which = {t: f" ({t})" if len(tasks) > 1 else "" for t in tasks}  # a mix names the task of each line
    for t in tasks:
        scores = [r.get("score") if r.get("valid") else None for r in samples if (r.get("task") or t) == t]
        best = best_score(t, scores) if samples else summary.get("score/best_during_rl") if t == tasks[0] else None
        if best is not None:
            lines.append(f"**Best score during RL**{which[t]}: {_with_medal(t, best)}, with its MLE-bench medal")
    for t in tasks:
        ev = _per_task(evaluation, t)
        if ev:
            lines.append(f"**Evaluation**{which[t]} ({evaluation_file}): {medal_line(t, ev)}")
    if evaluation is None:
        lines.append("**Evaluation**: none (eval.samples = 0; `python -m mle_jax.evaluate --workdir W` runs one)")
    if plots:
        lines.append("**Plots**: " + ", ".join(f"[{p.stem}](plots/{p.name})" for p in plots) + " (under Plots below)")
    return [f"- {line}" for line in lines]
