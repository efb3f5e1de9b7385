"""The evidence of a run over a mix of tasks, gathered into one results file (docs/multitask.md, "One policy over
four tasks").

    python -m mle_jax.experiments.mix_evidence --workdir W --held_out TASK --script S1,S2 --out DIR

W is a `configs/multitask.py:cpu` run made in two launches of the same command, the first with
`--config.loop.steps=0` (the warm start and the warm-started policy's evaluation, kept as evaluation-before.json)
and the second with the RL steps (evaluation.json), each followed by `python -m mle_jax.evaluate --workdir W
--task TASK` of a task outside the mix (evaluation-TASK-before.json, evaluation-TASK.json). S1,S2 are the scripts
that ran those commands (their command lines are recorded). DIR/summary.json gets, per task: the evaluation before and
after RL (mean reward ± SE, valid fraction, mean and best score, the best's MLE-bench medal, any-medal share), the
RL samples it got, and the single-task learning run of the same task in docs/results where there is one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from absl import app, flags

from mle_jax.infra.metrics import read_metrics
from mle_jax.reporting.provenance import stamp

SINGLE_TASK_RUNS = {  # task -> docs/results folder of its single-task learning run (experiments/learning/)
    "random-acts-of-pizza": "learning-pizza",
    "spooky-author-identification": "learning-spooky",
}


def scratch_figures(evaluation: dict[str, Any]) -> dict[str, Any]:
    """One task's evaluation (evaluation.py's dict of that task) -> its scratch samples' figures."""
    s = evaluation["scratch"]
    medals = s.get("medals") or {}
    return {
        "samples": s["samples"],
        "mean_reward": s.get("mean_reward"),
        "se_reward": s.get("se_reward"),
        "valid_fraction": s["valid_fraction"],
        "mean_score": s.get("mean"),
        "best_score": s.get("max"),  # evaluation.py's "max" is the best in the task's direction
        "best_medal": medals.get("best"),
        "any_medal": medals.get("any_medal"),
    }


def per_task(evaluation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """evaluation.json of a mix ({"task", "tasks": {...}}) or of one task -> {task id: scratch figures}."""
    tasks = evaluation.get("tasks") or {evaluation["task"]: evaluation}
    return {t: scratch_figures(e) for t, e in tasks.items()}


def single_task_run(results: Path, task: str) -> dict[str, Any] | None:
    """The duration-weighted arm of the task's single-task learning run in docs/results, if there is one."""
    folder = SINGLE_TASK_RUNS.get(task)
    path = results / folder / "summary.json" if folder else None
    if path is None or not path.is_file():
        return None
    d = json.loads(path.read_text())
    arm = d["arms"].get("duration_weighted") or next(iter(d["arms"].values()))
    keys = ("samples", "mean_reward", "se_reward", "valid_fraction", "mean_score", "best_score")
    return {
        "folder": folder,
        "rl_samples": d["scale"]["steps"] * d["batch_size"],
        "before": {k: arm["before"].get(k) for k in keys},
        "after": {k: arm["after"].get(k) for k in keys},
    }


def report_figure(report: Path, key: str) -> float | None:
    """A figure of a run's report.md summary table (`| key | value |`), as the run wrote it."""
    m = re.search(rf"^\| {re.escape(key)} \| ([^|]+) \|$", report.read_text(), re.M)
    return float(m.group(1)) if m and m.group(1).strip() not in ("—", "None") else None


def script_commands(script: Path) -> list[str]:
    """The `python -m mle_jax...` lines of the script that made the run (its variables as written)."""
    return [line.strip() for line in script.read_text().splitlines() if re.search(r"-m mle_jax\.", line)]


def gather(workdir: Path, held_out: str, script: Path | list[Path], results: Path) -> dict[str, Any]:
    before = per_task(json.loads((workdir / "evaluation-before.json").read_text()))
    after = per_task(json.loads((workdir / "evaluation.json").read_text()))
    samples = read_metrics(workdir / "samples.jsonl")
    steps = read_metrics(workdir / "metrics.jsonl")
    config = json.loads((workdir / "config.json").read_text())
    tasks = {
        t: {
            "before": before[t],
            "after": after.get(t),
            "rl_samples": sum(1 for s in samples if s.get("task") == t),
            "single_task": single_task_run(results, t),
        }
        for t in before
    }
    held = {
        "task": held_out,
        "before": per_task(json.loads((workdir / f"evaluation-{held_out}-before.json").read_text()))[held_out],
        "after": per_task(json.loads((workdir / f"evaluation-{held_out}.json").read_text()))[held_out],
    }
    return {
        **stamp(),
        "script": [c for p in (script if isinstance(script, list) else [script]) for c in script_commands(p)],
        "workdir": str(workdir),
        "rl_steps": len(steps),
        # each launch's wall time as its report.md recorded it: the warm start and the evaluation before RL, then
        # the RL steps and the evaluation after
        "wall_s_before": report_figure(workdir / "report-before.md", "wall_s"),
        "warmstart_wall_s": report_figure(workdir / "report-before.md", "warmstart/wall_s"),
        "wall_s_rl_and_after": report_figure(workdir / "report.md", "wall_s"),
        "rl_wall_s": report_figure(workdir / "report.md", "rl/wall_s"),
        "batch_size": config["loop"]["batch_size"],
        "warmstart_steps": config["warmstart"]["steps"],
        "corpus_size": config["warmstart"]["corpus_size"],
        "tasks": tasks,
        "held_out": held,
    }


_FLAGS: dict[str, Any] = {}


def define_flags() -> None:
    """The CLI's flags, defined when it runs (not on import: a test that imports this module beside another CLI
    must not define a second --workdir)."""
    _FLAGS["workdir"] = flags.DEFINE_string("workdir", None, "the mix run's workdir", required=True)
    _FLAGS["held_out"] = flags.DEFINE_string("held_out", None, "the task outside the mix that was evaluated",
                                             required=True)  # fmt: skip
    _FLAGS["script"] = flags.DEFINE_list("script", None, "the scripts that ran the commands, in order", required=True)
    _FLAGS["out"] = flags.DEFINE_string("out", "docs/results/multitask-cpu", "where summary.json goes")


def main(argv: list[str]) -> None:
    del argv
    workdir, held = Path(_FLAGS["workdir"].value), _FLAGS["held_out"].value
    for name in ("evaluation-before.json", "evaluation.json", f"evaluation-{held}-before.json"):
        if not (workdir / name).is_file():
            raise app.UsageError(f"{workdir / name} not found: see this module's docstring for the run it reads")
    out = Path(_FLAGS["out"].value)
    out.mkdir(parents=True, exist_ok=True)
    summary = gather(workdir, held, [Path(p) for p in _FLAGS["script"].value], Path("docs/results"))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'summary.json'}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
