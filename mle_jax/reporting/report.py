"""A run's report: PNG plots and report.md, from the metrics the run wrote (mle_jax.infra.metrics).

Everything lives in the run's workdir:
  metrics.jsonl     one JSON object per RL step (appended; survives a crash and a resume)
  tb/               TensorBoard event files (a resume drops the points past its checkpoint from them too)
  samples.jsonl     one JSON object per trained sample: figures, outcome, medal, plan, program, output (capped)
  plots/*.png       score mean/best, valid fraction, mean Δt, reward components, memory per step (a mix: per task
                    too); of the samples: score against Δt, medal shares and outcomes per step
                    (reporting/sample_plots.py)
  run_summary.json  the run's figures (report.md's "Run" table), kept for `mle_jax.evaluate`'s report
  report.md         a summary to read first (reporting/report_summary.py), then the run's tables: the run's
                    figures, the evaluation, per task, per step, the plots
  samples.html      the samples to browse in a browser, written with report.md (reporting/samples_page.py)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mle_jax.infra.metrics import read_metrics
from mle_jax.reporting.markdown import markdown_table
from mle_jax.reporting.report_summary import run_tasks, summary_lines
from mle_jax.reporting.sample_plots import write_sample_plots
from mle_jax.reporting.samples_page import PAGE, write_samples_page
from mle_jax.reporting.search_report import is_search, search_tables, write_search_plots
from mle_jax.tasks.medals import LEVELS, medal, medal_summary
from mle_jax.tasks.registry import get_spec

RUN_SUMMARY = "run_summary.json"


def jsonable(value: Any) -> Any:
    """A summary value JSON cannot write as it is (a NumPy scalar) as a plain number, or else as text."""
    return value.item() if hasattr(value, "item") else str(value)


@dataclass(frozen=True)
class ReportSettings:
    """The `report` section of the run config."""

    tensorboard: bool = True
    plots: bool = True
    samples_mb: float = 64.0  # samples.jsonl's size with its samples' texts (infra.metrics.MetricsWriter)
    sample_output_chars: int = 2000  # of each sample's stdout and of its stderr (their ends) in samples.jsonl

    def __post_init__(self) -> None:
        if not self.samples_mb >= 0:
            raise ValueError(f"report.samples_mb must be >= 0 (0: no texts in samples.jsonl), got {self.samples_mb}")
        if self.sample_output_chars < 1:
            raise ValueError(f"report.sample_output_chars must be >= 1, got {self.sample_output_chars}")


# score/best is the best sample in the task's direction (rl/loop.py): score/max would be the worst log loss
PLOTS: dict[str, tuple[str, ...]] = {
    "score": ("score/mean", "score/best"),
    "valid_fraction": ("valid_fraction", "valid_fraction/scratch", "valid_fraction/improve"),
    "duration": ("duration_s/mean",),
    "reward_components": ("reward/mean", "reward/score_part", "reward/progress_part"),
    "instrumentation": ("instrument/lm_fraction", "instrument/fallback_fraction", "instrument/unparsed_fraction"),
    # whether staleness silences the slow programs: slow = Δt above the batch mean (rl/objectives.py)
    "stale_version_lag": ("learner/stale/version_lag_slow", "learner/stale/version_lag_fast"),
    "stale_clipfrac": ("learner/stale/clipfrac_slow", "learner/stale/clipfrac_fast"),
    "stale_behaviour_weight": ("learner/stale/behaviour_weight_slow", "learner/stale/behaviour_weight_fast"),
    # the process's memory after each step (infra/metrics.process_metrics): flat once its shapes have been seen
    "memory_gib": ("process/rss_gib", "process/live_arrays_gib", "process/malloc_free_gib"),
    # what holds it (infra/metrics.memory_breakdown): each buffer once, for the first part that holds it
    "memory_parts_gib": tuple(
        f"memory/{p}_gib"
        for p in (
            "policy",
            "policy_opt",
            "critic",
            "critic_opt",
            "reference",
            "sampler",
            "instrumenter",
            "other_arrays",
        )
    ),  # fmt: skip
    # XLA compiles so far: they stop once every shape bucket (prompt, response, batch) has been seen
    "compiles": ("process/compiles",),
}


# a run over a mix of tasks: one line per task (its metrics `<prefix><task id>`, rl/loop.py)
TASK_PLOTS: dict[str, str] = {
    "task_reward": "reward/mean/",
    "task_valid_fraction": "valid_fraction/",
    "task_score_mean": "score/mean/",
    "task_score_best": "score/best/",
    "task_duration": "duration_s/mean/",
}


# a run of episodes (agent.turns > 1): one line per turn (`<metric>/turn<k>`, rl/loop.py)
TURN_PLOTS: dict[str, str] = {"valid_fraction_by_turn": "valid_fraction/turn", "reward_by_turn": "reward/mean/turn",
                              "duration_by_turn": "duration_s/mean/turn"}  # fmt: skip


def plot_keys(rows: list[dict]) -> dict[str, tuple[str, ...]]:
    """PLOTS, and for a run over a mix of tasks each TASK_PLOTS entry with its tasks' metric keys, in place of the
    score plot: the tasks' scores have different scales and directions, so they are never pooled into one line. A
    run of episodes adds TURN_PLOTS, a line per turn."""
    keys = {k for r in rows for k in r}
    tasks = sorted({k.removeprefix("reward/mean/") for k in keys if k.startswith("reward/mean/") and "/turn" not in k})
    turns = sorted({int(k.removeprefix("valid_fraction/turn")) for k in keys if k.startswith("valid_fraction/turn")})
    by_turn = {name: tuple(f"{prefix}{t}" for t in turns) for name, prefix in TURN_PLOTS.items()} if turns else {}
    if not tasks:
        return {**PLOTS, **by_turn}
    per_task = {name: tuple(prefix + t for t in tasks) for name, prefix in TASK_PLOTS.items()}
    return {**{k: v for k, v in PLOTS.items() if k != "score"}, **per_task, **by_turn}


def submitted_rows(samples: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The samples.jsonl rows of what the updates trained on as samples: every row of a run of one-turn episodes, the
    submitted turn of each episode of several (its reward, validity and score are the episode's), every turn with
    "turn" credit (each turn its own sample, `trained_as`)."""
    return [r for r in samples if r.get("trained_as") == "turn" or r.get("submitted", True)]


def turn_table(samples: Sequence[Mapping[str, Any]]) -> str:
    """A run of episodes: per turn, the turns run, their valid fraction, mean reward and Δt, and the share of episodes
    that submitted that turn (samples.jsonl rows with `turn`; "" for a run of one-turn episodes)."""
    by_turn: dict[int, list[Mapping[str, Any]]] = {}
    for r in samples:
        by_turn.setdefault(int(r.get("turn") or 1), []).append(r)
    if len(by_turn) < 2:
        return ""
    episodes = len({r.get("episode") for r in samples})
    rows = []
    for turn, rs in sorted(by_turn.items()):
        rewards = [r["reward"] for r in rs if r.get("reward") is not None]
        rows.append([
            turn, len(rs), sum(bool(r.get("valid")) for r in rs) / len(rs), sum(rewards) / max(len(rewards), 1),
            sum(r.get("duration_s") or 0.0 for r in rs) / len(rs), sum(bool(r.get("submitted")) for r in rs) / episodes,
        ])  # fmt: skip
    header = ["turn", "turns run", "valid fraction", "mean reward", "mean Δt (s)", "submitted share"]
    return markdown_table(header, rows)


def write_plots(rows: list[dict], out_dir: str | Path) -> list[Path]:
    """One PNG per entry of PLOTS (and of TASK_PLOTS, a line per task, in a run over a mix), x = RL step. Returns
    the files written."""
    # matplotlib is imported here, not with this module: about 1 s that the processes which only log never need
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, keys in plot_keys(rows).items():
        fig = Figure(figsize=(6, 3.5), dpi=110)  # no pyplot: no global backend state, nothing to close
        ax = fig.subplots()
        drew = False
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="o", ms=3, label=key)
                drew = True
        if not drew:
            continue
        ax.set_xlabel("RL step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(name.replace("_", " "))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        written.append(path)
    return written


# what medal_row gives, after its labels
MEDAL_HEADER: tuple[str, ...] = ("best's medal", *(lv.replace("_", " ") for lv in LEVELS), "invalid", "any medal")


def medal_row(labels: Iterable[Any], medals: Mapping[str, Any]) -> list[Any]:
    """A table row of one task's samples on MLE-bench's scale (`mle_jax.tasks.medals.medal_summary`): the labels,
    the best sample's level, the share of the samples at each level and invalid, and the share with any medal."""
    shares = medals["shares"]
    return [*labels, medals["best"], *(shares[lv] for lv in (*LEVELS, "invalid")), medals["any_medal"]]


def paper_line(task_id: str, paper: Mapping[str, float]) -> str:
    """The paper's Table 1 figures for the task (best of 128), each with the MLE-bench level it would earn."""
    prompted, rl = paper["qwen2.5-3b"], paper["qwen2.5-3b-rl"]
    return (
        f"Paper, Table 1 ({task_id}, best of 128): Qwen2.5-3B prompted {prompted} ({medal(task_id, prompted)}), "
        f"after RL {rl} ({medal(task_id, rl)})."
    )


def evaluation_medals(evaluation: Mapping[str, Any]) -> str:
    """The evaluation's medal table (one row per task and kind of sample that has medals: scratch, improved, best of
    both) and the paper's figures with theirs; "" for an evaluation without medals (one from before them). An
    evaluation of a mix ({"task", "tasks": {id: evaluation}}) has the rows and the paper's line of every task."""
    per_task = dict(evaluation.get("tasks") or {}) or {evaluation.get("task", "?"): evaluation}
    rows = [
        medal_row([task, name], e["medals"])
        for task, ev in per_task.items()
        for name, e in ev.items()
        if isinstance(e, Mapping) and "medals" in e
    ]
    intro = (
        "MLE-bench medals (thresholds: data/mlebench/medal_thresholds.csv): the best sample's level, and the share "
        "of the samples at each level."
    )
    parts = [intro, markdown_table(["task", "", *MEDAL_HEADER], rows)] if rows else []
    parts += [paper_line(task, ev["paper"]) for task, ev in per_task.items() if ev.get("paper") and task != "?"]
    return "\n\n".join(parts)


def evaluation_table(evaluation: Mapping[str, Any]) -> str:
    """The evaluation's samples, valid fraction, mean and best score (in the task's direction) per kind of sample
    (and per task of a mix)."""
    per_task = dict(evaluation.get("tasks") or {})
    header = ["", "samples", "valid fraction", "mean score", "best"]
    if not per_task:
        episodes = evaluation.get("episodes") or {}  # agent.turns > 1: the first turn's and the submitted turn's
        parts = [*evaluation.items(), *((f"episodes: {k.replace('_', ' ')}", v) for k, v in episodes.items())]
        return markdown_table(
            header,
            [
                [name, e.get("samples"), e.get("valid_fraction"), e.get("mean"), e.get("max")]
                for name, e in parts
                if isinstance(e, Mapping) and "samples" in e
            ],
        )
    return markdown_table(
        ["task", *header],
        [
            [task, name, e.get("samples"), e.get("valid_fraction"), e.get("mean"), e.get("max")]
            for task, ev in per_task.items()
            for name, e in ev.items()
            if isinstance(e, Mapping) and "samples" in e
        ],
    )


TASK_HEADER = ["task", "", "samples", "mean reward ± SE", "valid fraction", "mean score", "best score", "medal share",
               "mean Δt (s)"]  # fmt: skip


def task_row(task: str, label: str, records: Sequence[Mapping[str, Any]]) -> list[Any]:
    """One task's row of `TASK_HEADER` over sample records (samples.jsonl, evaluation.json's)."""
    rewards = np.array([r["reward"] for r in records if r.get("reward") is not None], np.float64)
    scores = [r["score"] if r.get("valid") else None for r in records]
    valid = [x for x in scores if x is not None]
    se = float(rewards.std(ddof=1) / np.sqrt(rewards.size)) if rewards.size > 1 else None
    reward = None if not rewards.size else f"{rewards.mean():.3f}" + (f" ± {se:.3f}" if se is not None else "")
    best = (min if get_spec(task).lower_is_better else max)(valid) if valid else None
    return [
        task,
        label,
        len(records),
        reward,
        len(valid) / max(len(records), 1),
        float(np.mean(valid)) if valid else None,
        best,
        medal_summary(task, scores)["any_medal"],
        float(np.mean([r.get("duration_s") or 0.0 for r in records])) if records else None,
    ]


def task_table(samples: Sequence[Mapping[str, Any]], evaluation: Mapping[str, Any] | None) -> str:
    """A row per task of a mix (more than one task among the samples or the evaluation): its RL samples, and its
    evaluation's scratch samples. Empty for a run of one task."""
    evals = dict((evaluation or {}).get("tasks") or {})
    tasks = list(dict.fromkeys([*(r.get("task") for r in samples if r.get("task")), *evals]))
    if len(tasks) < 2:
        return ""
    rows = []
    for t in tasks:
        rows.append(task_row(t, "RL", [r for r in samples if r.get("task") == t]))
        scratch = (evals.get(t) or {}).get("scratch")
        if scratch:
            rows.append(task_row(t, "evaluation", scratch.get("records", [])))
    return markdown_table(TASK_HEADER, rows)


def write_report(
    workdir: str | Path,
    summary: Mapping[str, Any],
    evaluation: Mapping[str, Any] | None,
    plots: bool = True,
    evaluation_file: str = "evaluation.json",
) -> Path:
    """report.md: a summary to read first, the run's figures, the evaluation beside the paper, per task, per step and
    the plots (`plots`: written to workdir/plots; else the ones already there are linked); and samples.html beside it.
    `evaluation_file`: the file in workdir the evaluation was written to."""
    workdir = Path(workdir)
    rows = read_metrics(workdir / "metrics.jsonl")
    samples = read_metrics(workdir / "samples.jsonl")
    if plots:
        pngs = write_plots(rows, workdir / "plots") + write_sample_plots(samples, workdir / "plots")
        if is_search(evaluation):  # the search's trees: score by node order, coloured by operator
            pngs += write_search_plots(evaluation, workdir / "plots")  # type: ignore[arg-type]
    else:
        pngs = sorted((workdir / "plots").glob("*.png"))
    tasks = ", ".join(run_tasks(summary, evaluation, samples)) or "?"
    write_samples_page(samples, workdir, f"Samples: {tasks}")
    parts = [f"# Run report: {tasks}", ""]
    parts += summary_lines(summary, evaluation, submitted_rows(samples), rows, pngs, evaluation_file)
    parts += [f"- **Samples**: [{PAGE}]({PAGE}), the {len(samples)} samples the RL steps trained on, to open in a "
              "browser: filter them by step, task, status, outcome, medal and prompt kind, and read each one's plan, "
              "program, output, score and Δt (samples.jsonl holds the same records)", "", "## Run", ""]  # fmt: skip
    parts.append(markdown_table(["quantity", "value"], sorted(summary.items())))
    if is_search(evaluation):
        parts += ["", "## Evaluation: search at test time", "", f"From {evaluation_file}.", ""]
        parts.append(search_tables(evaluation))  # type: ignore[arg-type]
    elif evaluation:
        parts += ["", "## Evaluation", "", f"From {evaluation_file}.", ""]
        parts.append(evaluation_table(evaluation))
        medals = evaluation_medals({"task": summary.get("task", "?"), **evaluation})
        if medals:
            parts += ["", medals]
    per_task = task_table(submitted_rows(samples), evaluation)
    if per_task:
        parts += ["", "## Per task", "", per_task]
    by_turn = turn_table(samples)
    if by_turn:
        parts += ["", "## By turn", "", "Every turn of the episodes the updates trained on (samples.jsonl).", ""]
        parts.append(by_turn)
    if rows:
        parts += ["", "## Per step", ""]
        keys = [
            "step",
            "reward/mean",
            "score/mean",
            "score/best",
            "valid_fraction",
            "duration_s/mean",
            "version_lag/mean",
            "instrument/lm_fraction",
        ]
        parts.append(markdown_table(keys, [[r.get(k) for k in keys] for r in rows]))
    if pngs:
        parts += ["", "## Plots", ""] + [f"![{p.stem}](plots/{p.name})" for p in pngs]
    path = workdir / "report.md"
    path.write_text("\n".join(parts) + "\n")
    return path


def evaluation_printout(result: dict) -> str:
    """What `python -m mle_jax.evaluate` prints of an evaluation (env/evaluation.evaluate): its table, its medal table
    and the paper's figures with their medals (one of each per task of a mix)."""
    if "tasks" in result:
        return "\n\n".join(f"### {t}\n\n{evaluation_printout(r)}" for t, r in result["tasks"].items())
    rows = []
    for name in ("scratch", "improved", "best_of_both"):
        if name in result:
            r = result[name]
            rows.append([name, r["samples"], r["valid_fraction"], r["mean"], r["max"]])
    for name, r in (result.get("episodes") or {}).items():
        if isinstance(r, dict) and "samples" in r:
            rows.append([f"episodes: {name.replace('_', ' ')}", r["samples"], r["valid_fraction"], r["mean"], r["max"]])
    table = markdown_table(["", "samples", "valid fraction", "mean", "best"], rows)
    medals = evaluation_medals(result)
    return f"{table}\n\n{medals}" if medals else table
