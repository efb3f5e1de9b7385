"""How far a learning experiment got (`python -m mle_jax.experiments.learning ... --progress`): read from its
folder while it runs or after it stopped, nothing trained or evaluated. For runs longer than a session: what each
arm and repeat has done of the planned steps, from its last whole checkpoint (the loop's own counters, kept across
resumes) and its metrics, and which evaluations are cached.

`--partial` summarises what is finished so far the way the finished experiment will (`partial_summary`): every
repeat evaluated after RL, its arm's contrasts with the seeds it has, into DIR/partial/."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mle_jax.executor.fleet import slots_for
from mle_jax.experiments.learning.arms import Arm, Scale
from mle_jax.experiments.learning.outcomes import eval_summary, paired_by_prompt
from mle_jax.experiments.learning.running import (
    arm_entry,
    arm_peak_rss,
    arm_result,
    before_path,
    experiment_settings,
    run_dir,
)
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.infra.metrics import read_metrics
from mle_jax.reporting import provenance
from mle_jax.reporting.results_tables.ablations import arm_contrasts
from mle_jax.reporting.results_tables.learning import (
    render_learning_progress,
    render_rl_arm_contrasts,
    render_rl_before_after,
)
from mle_jax.rl.loop import LoopCounters


def last_counters(arm_dir: Path) -> tuple[list[int], dict[str, Any]]:
    """A run's checkpointed steps and the loop's counters (`LoopCounters.state_dict`) at the last one ({} with none),
    read without touching the checkpoints: the run may be writing one (`Checkpointer(read_only=True)`)."""
    ckpt_dir = arm_dir / "checkpoints"
    if not ckpt_dir.is_dir():
        return [], {}
    ckpt = Checkpointer(ckpt_dir, read_only=True)
    saved = ckpt.all_steps()
    return saved, ckpt.json_item(saved[-1], "loop")["counters"] if saved else {}


def run_progress(arm_dir: Path, steps: int) -> dict[str, Any]:
    """One arm's repeat: RL steps logged and checkpointed of `steps` planned, the loop's clocks at its last checkpoint
    (RL wall, update, sampling: seconds, summed over the processes that ran it), the valid fraction and trained
    improve share of each logged step, and whether its after-RL evaluation is cached. A run not started yet: zeros."""
    rows = read_metrics(arm_dir / "metrics.jsonl")
    saved, counters = last_counters(arm_dir)
    shares = [r["prompt/improve_share_trained"] for r in rows if r.get("prompt/improve_share_trained") is not None]
    return {
        "steps_planned": steps,
        "steps_logged": max((int(r["step"]) for r in rows), default=0),
        "last_checkpoint": saved[-1] if saved else None,
        "rl_wall_s": round(counters.get("wall_s", 0.0), 1),
        "update_s": round(counters.get("update_s", 0.0), 1),
        "sample_s": round(counters.get("sample_s", 0.0), 1),
        "valid_fraction_by_step": [r.get("valid_fraction") for r in rows],
        "improve_share_trained": float(np.mean(shares)) if shares else None,
        "evaluated_after": (arm_dir / "after.json").is_file(),
    }


def experiment_progress(out: Path, arms: Sequence[Arm], seeds: int, steps: int, turns: Sequence[int] = ()) -> dict:
    """The experiment in `out` as the same command plans it (its arms, seeds and steps): which before-RL evaluations
    are cached, and `run_progress` of every arm and repeat, keyed by its folder under out/arms."""
    befores = [before_path(out, k) for k in turns] or [before_path(out, None)]
    runs = {}
    for arm in arms:
        for r in range(seeds):
            d = run_dir(out, arm.name, r)
            runs[d.name] = {"arm": arm.name, "seed_offset": r, **run_progress(d, steps)}
    done = sum(x["steps_logged"] for x in runs.values())
    return {
        "out": str(out),
        "before_evaluated": {p.name: p.is_file() for p in befores},
        "runs": runs,
        "steps_done": done,
        "steps_planned": steps * len(runs),
        "evaluations_after_done": sum(x["evaluated_after"] for x in runs.values()),
    }


def partial_summary(
    cfg: Any, out: Path, arms: Sequence[Arm], seeds: int, scale: Scale, turns: Sequence[int] = ()
) -> dict[str, Any]:
    """The experiment in `out` as far as it got, summarised as the finished one will be, nothing run: every arm's
    repeats whose after-RL evaluation is cached (their stats from the loop's counters at their last checkpoint, read
    only), each tested against the before-RL evaluation paired by start prompt, and the arms' contrasts (Welch over
    the seeds each has so far: `ablations.arm_contrasts`); arms with no finished repeat are left out. With the command,
    the date and `experiment_progress` beside it; written to out/partial/summary.json and out/partial/report.md.
    Raises FileNotFoundError when a before-RL evaluation a finished repeat needs is missing."""
    s, settings = experiment_settings(cfg, out, scale, arms, seeds)
    task_id = s.task.id
    befores: dict[int | None, dict] = {}  # each before-RL evaluation read once (one per turns value)

    def before(k: int | None, run: str) -> dict:
        if k not in befores:
            path = before_path(out, k)
            if not path.is_file():
                raise FileNotFoundError(f"{run} is evaluated after RL but {path} is missing")
            befores[k] = eval_summary(json.loads(path.read_text()), task_id)
        return befores[k]

    results = {}
    for arm in arms:
        k = settings[arm.name][0].rollout.agent.turns if turns else None
        repeats = []
        for r, rs in enumerate(settings[arm.name]):
            d = run_dir(out, arm.name, r)
            if not (d / "after.json").is_file():
                continue
            counters = LoopCounters(**last_counters(d)[1])
            after = json.loads((d / "after.json").read_text())
            peak = arm_peak_rss(d / "peak_rss.json", worked=False)
            res = arm_result(rs, counters, d, after, task_id, slots_for(rs.executor), peak)
            repeats.append({**res, "paired_before_after": paired_by_prompt(before(k, d.name), res["after"])})
        if repeats:
            results[arm.name] = arm_entry(arm, before(k, arm.name), repeats)
    summary = {
        **provenance.stamp(),
        "task": task_id,
        "partial": True,
        "scale": dataclasses.asdict(scale),
        "seeds": seeds,
        "progress": experiment_progress(out, arms, seeds, scale.steps, turns),
        "arms": results,
        "contrasts": arm_contrasts(results),
    }
    folder = out / "partial"
    provenance.write_json(folder / "summary.json", summary)
    (folder / "report.md").write_text(partial_report(summary))
    return summary


def partial_report(summary: dict) -> str:
    """The partial summary in words: each finished run before and after RL, the arms' contrasts over the seeds they
    have, and how far every run got."""
    lines = [f"# As far as it got: {summary['task']} ({summary['date']})", "", f"`{summary['command']}`", ""]
    if summary["arms"]:
        lines += ["Runs evaluated after RL:", "", render_rl_before_after(summary), ""]
        if len(summary["arms"]) > 1:
            lines += ["Each arm against the first, the seed the unit:", "", render_rl_arm_contrasts(summary), ""]
    else:
        lines += ["No run is evaluated after RL yet.", ""]
    lines += ["Every run:", "", render_learning_progress(summary["progress"])]
    return "\n".join(lines) + "\n"
