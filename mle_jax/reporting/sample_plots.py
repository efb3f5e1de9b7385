"""The report's plots of single samples (samples.jsonl), each with a panel per task in a mix:
duration_score.png  score and reward against Δt, a point per sample coloured by its step (the duration weights are
                    about how slow programs fare)
medal_shares.png    the share of each step's samples at each MLE-bench level (invalid included)
outcomes.png        the share of each step's samples per outcome: valid, or how it failed (no code, syntax error,
                    runtime error, timeout, OOM, killed, invalid submission)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mle_jax.executor.result import OUTCOMES
from mle_jax.reporting.report_summary import direction
from mle_jax.tasks.medals import LEVELS, medal, thresholds

MEDAL_CATEGORIES: tuple[str, ...] = (*LEVELS, "invalid")
MEDAL_COLOURS = ("#d4af37", "#a8a9ad", "#cd7f32", "#6baed6", "#d9d9d9", "#f4a582")
OUTCOME_COLOURS = ("#4daf4a", "#999999", "#984ea3", "#e41a1c", "#ff7f00", "#a65628", "#f781bf", "#377eb8")

Record = Mapping[str, Any]


def sample_outcome(rec: Record) -> str:
    """The record's outcome (executor.result.OUTCOMES); for a record written before outcomes, from its status."""
    if rec.get("outcome"):
        return rec["outcome"]
    if rec.get("valid"):
        return "valid"
    status = rec.get("status")
    if status is None:
        return "no_code"
    if status in ("timeout", "oom", "killed"):
        return status
    return "invalid_submission" if status == "ok" else "runtime_error"


def sample_medal(rec: Record) -> str | None:
    """The record's MLE-bench level, "invalid" for an invalid sample; None for a task without medal thresholds."""
    if not rec.get("valid") or rec.get("score") is None:
        return "invalid"
    if rec.get("medal"):
        return rec["medal"]
    try:
        return medal(rec.get("task") or "", rec["score"])
    except KeyError:
        return None


def shares_by_step(
    samples: Sequence[Record], category: Callable[[Record], str | None], categories: Sequence[str]
) -> tuple[list[int], dict[str, list[float]]]:
    """Steps [S] (sorted) and, per category, the share of each step's samples in it [S] (shares of a step sum to 1
    over `categories`; a sample whose category is None or not among them counts in no share, nor in the step's
    total)."""
    by_step: dict[int, list[str]] = {}
    for rec in samples:
        c = category(rec)
        if c in categories and rec.get("step") is not None:
            by_step.setdefault(int(rec["step"]), []).append(c)
    steps = sorted(by_step)
    return steps, {c: [by_step[s].count(c) / len(by_step[s]) for s in steps] for c in categories}


def by_task(samples: Sequence[Record]) -> dict[str, list[Record]]:
    """The samples of each task, in the order the tasks first appear ("" for records without a task)."""
    out: dict[str, list[Record]] = {}
    for rec in samples:
        out.setdefault(rec.get("task") or "", []).append(rec)
    return out


def write_sample_plots(samples: Sequence[Record], out_dir: str | Path) -> list[Path]:
    """The module's plots of `samples` (samples.jsonl's records) as PNGs in out_dir; returns the files written
    (none without samples)."""
    if not samples:
        return []
    from matplotlib.figure import Figure  # slow to import: only the report needs it (reporting/report.py)
    from matplotlib.ticker import MaxNLocator

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = by_task(samples)
    steps = [int(r["step"]) for r in samples if r.get("step") is not None]
    span = (min(steps), max(steps)) if steps else (0, 1)  # every panel's step axis and colours: the run's steps
    written = []
    for name, draw, cols in (
        ("duration_score", _draw_duration, 2),
        ("medal_shares", _draw_medals, 1),
        ("outcomes", _draw_outcomes, 1),
    ):
        fig = Figure(figsize=(5.5 * cols, 3.2 * len(tasks) + 0.4), dpi=110)
        axes = fig.subplots(len(tasks), cols, squeeze=False)
        drew = [draw(fig, axes[i], task, recs, span) for i, (task, recs) in enumerate(tasks.items())]
        if not any(drew):
            continue
        for ax in axes.flat:
            if name != "duration_score":
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        written.append(path)
    return written


def _title(ax: Any, text: str, task: str) -> None:
    ax.set_title(f"{text} ({task})" if task else text, fontsize=9)


def _draw_duration(fig: Any, axes: Sequence[Any], task: str, recs: Sequence[Record], span: tuple[int, int]) -> bool:
    """Score (valid samples) and reward (every sample that ran) against Δt, coloured by step."""
    from matplotlib.ticker import MaxNLocator

    ran = [r for r in recs if r.get("duration_s") and r.get("reward") is not None and r.get("step") is not None]
    if not ran:
        return False
    lo, hi = span
    for ax, key, label in zip(axes, ("score", "reward"), ("score (valid samples)", "reward"), strict=True):
        pts = [r for r in ran if r.get(key) is not None and (key != "score" or r.get("valid"))]
        if pts:
            dots = ax.scatter([r["duration_s"] for r in pts], [r[key] for r in pts], c=[r["step"] for r in pts],
                              cmap="viridis", vmin=lo, vmax=max(hi, lo + 1), s=14, alpha=0.8)  # fmt: skip
            fig.colorbar(dots, ax=ax, label="RL step", ticks=MaxNLocator(integer=True))
            durations = [r["duration_s"] for r in pts]
            if max(durations) > 20 * min(durations):
                ax.set_xscale("log")
        else:
            ax.text(0.5, 0.5, f"no sample with a {key}", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("Δt (s), the program's run time")
        ax.set_ylabel(f"score ({direction(task)})" if key == "score" and task else key)
        ax.grid(alpha=0.3)
        _title(ax, f"{label} against Δt", task)
    return True


def _stack(
    ax: Any, steps: list[int], shares: dict[str, list[float]], colours: Sequence[str], span: tuple[int, int]
) -> None:
    bottom = [0.0] * len(steps)
    for (category, ys), colour in zip(shares.items(), colours, strict=True):
        if any(ys):
            ax.bar(steps, ys, bottom=bottom, color=colour, label=category.replace("_", " "), width=0.85)
        bottom = [b + y for b, y in zip(bottom, ys, strict=True)]
    ax.set_xlabel("RL step")
    ax.set_ylabel("share of the step's samples")
    ax.set_ylim(0, 1)
    ax.set_xlim(span[0] - 0.6, span[1] + 0.6)
    handles, labels = ax.get_legend_handles_labels()  # top to bottom, as the bars stack
    ax.legend(handles[::-1], labels[::-1], fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))


def _draw_shares(axes: Sequence[Any], task: str, recs: Sequence[Record], span: tuple[int, int], classify: Any,
                 categories: Sequence[str], colours: Any, title: str) -> bool:  # fmt: skip
    """Per step, the shares of the samples in each of `categories` (by `classify`), stacked; False when no step has
    any."""
    steps, shares = shares_by_step(recs, classify, categories)
    if not steps:
        return False
    _stack(axes[0], steps, shares, colours, span)
    _title(axes[0], title, task)
    return True


def _draw_medals(fig: Any, axes: Sequence[Any], task: str, recs: Sequence[Record], span: tuple[int, int]) -> bool:
    try:
        thresholds(task)
    except KeyError:  # a task without medal thresholds
        return False
    return _draw_shares(axes, task, recs, span, sample_medal, MEDAL_CATEGORIES, MEDAL_COLOURS, "MLE-bench medal shares")


def _draw_outcomes(fig: Any, axes: Sequence[Any], task: str, recs: Sequence[Record], span: tuple[int, int]) -> bool:
    title = "outcomes: valid, or how the sample failed"
    return _draw_shares(axes, task, recs, span, sample_outcome, OUTCOMES, OUTCOME_COLOURS, title)
