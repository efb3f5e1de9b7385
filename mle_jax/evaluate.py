"""python -m mle_jax.evaluate --workdir W [--samples N] [--task ID]: evaluates a finished run's latest policy as the
paper does (mle_jax/env/evaluation.py) and prints our numbers beside the paper's Table 1.

The evaluation goes to a new file, W/evaluation-<UTC date and time>.json (the run's own evaluation.json is kept), and
W/report.md is rewritten with it; one line says so. With --task it goes to W/evaluation-<ID>.json and report.md,
which is about the run's tasks, is left as it was.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from pathlib import Path

from absl import app, flags

from mle_jax.env.evaluation import evaluate, format_table
from mle_jax.reporting import report
from mle_jax.run import builders, environment
from mle_jax.run.settings import from_config

_WORKDIR = flags.DEFINE_string("workdir", None, "a run's workdir", required=True)
_SAMPLES = flags.DEFINE_integer("samples", 0, "samples (0: the run's eval.samples, default 128)")
_TASK = flags.DEFINE_string(
    "task", None, "evaluate this task only: any task with data, one the run never trained on included (held out)"
)


def main(argv: list[str]) -> None:
    del argv
    workdir = Path(_WORKDIR.value)
    cfg_path = workdir / "config.json"
    if not cfg_path.exists():
        raise app.UsageError(f"{cfg_path} not found: --workdir must be a run's workdir")
    s = from_config({**json.loads(cfg_path.read_text()), "workdir": str(workdir)})
    if _SAMPLES.value:
        s = dataclasses.replace(s, eval=dataclasses.replace(s.eval, samples=_SAMPLES.value))
    tasks, packages = environment.prepare_mix(s)
    model, initial, tokenizer = builders.load_trained_policy(
        s, tasks if len(tasks) > 1 else tasks[0], packages, workdir
    )
    if _TASK.value:  # one task, of the mix or held out
        try:
            mix = {t.id: t for t in tasks}
            held = dataclasses.replace(s.task, id=_TASK.value, prepared_dir="")
            tasks = (
                [mix[_TASK.value]]
                if _TASK.value in mix
                else environment.prepare_mix(dataclasses.replace(s, task=held, tasks=(), task_weights=()))[0]
            )
        except (KeyError, ValueError, FileNotFoundError) as e:
            raise app.UsageError(f"--task={_TASK.value}: {str(e).strip(chr(39))}") from None
    # the run's instrumenter: its mode, its frozen initial model
    env_tasks = tasks if len(tasks) > 1 else tasks[0]
    with environment.open_environment(s, env_tasks, packages, model, tokenizer, workdir, initial=initial) as env:
        result = evaluate(s.eval, env)
    path = workdir / f"evaluation-{_TASK.value}.json" if _TASK.value else dated_path(workdir, datetime.now(UTC))
    path.write_text(json.dumps(result, indent=2))
    print(format_table(result))
    if _TASK.value:
        print(f"wrote {path}; report.md (about the run's tasks) is left as it was")
        return
    summary_file = workdir / report.RUN_SUMMARY
    # a workdir from before run_summary.json: the report's Run table has only the task
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {"task": tasks[0].id}
    report_path = report.write_report(workdir, summary, result, plots=s.report.plots, evaluation_file=path.name)
    print(f"wrote {path} (the run's own evaluation.json is kept) and rewrote {report_path} with it")


def dated_path(workdir: Path, now: datetime) -> Path:
    """workdir/evaluation-<UTC date and time>.json, a name no file there has yet."""
    stem = f"evaluation-{now.astimezone(UTC):%Y%m%dT%H%M%SZ}"
    path, n = workdir / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = workdir / f"{stem}-{n}.json"
    return path


if __name__ == "__main__":
    app.run(main)
