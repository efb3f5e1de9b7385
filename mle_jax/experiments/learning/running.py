"""Running the experiment: the warm start, each arm's RL and evaluations (cached in the output folder, so a
killed experiment resumes), the arm's peak memory, the wall-time ledger, the summary."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from absl import app
from flax import nnx

from mle_jax.env.evaluation import evaluate
from mle_jax.env.rollout import Environment, InstrumentFn
from mle_jax.env.settings import AgentSettings
from mle_jax.experiments.learning.arms import ALGORITHMS, DEFAULT_ARMS, Arm, Scale, arm_config, eval_draws
from mle_jax.experiments.learning.outcomes import (
    arm_task_scores,
    corpus_kinds,
    corpus_medians,
    eval_summary,
    instrument_shares,
    lag_of_kinds,
    paired_by_prompt,
    revision_contrasts,
    share_contrast,
    slow_and_better,
    stale_means,
    step_series,
)
from mle_jax.experiments.learning.report import write_report
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.infra.metrics import MetricsWriter, status_kib
from mle_jax.reporting import provenance
from mle_jax.reporting.results_tables.ablations import arm_contrasts
from mle_jax.rl.loop import AsyncRLLoop, LoopCounters
from mle_jax.run import builders, environment
from mle_jax.run.settings import RunSettings, from_config
from mle_jax.sampling.jax_sampler import JaxSampler
from mle_jax.warmstart.programs import full_grid, solution_kind


def _cached(path: Path, compute: Callable[[], dict]) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return result


def run_dir(out: Path, arm: str, repeat: int) -> Path:
    """Where one repeat of an arm runs: out/arms/ARM for the first (as before repeats existed), ARM.seedR after."""
    return out / "arms" / (arm if repeat == 0 else f"{arm}.seed{repeat}")


def run_arm(
    s: RunSettings,
    arm: Arm,
    initial: nnx.Module,
    base_env: Environment,
    arm_dir: Path,
    instrument_fn: InstrumentFn | None = None,
    draws: int = 1,
    base_dir: Path | None = None,
) -> dict:
    """RL in one arm from the initial policy (resumed if its checkpoints exist), then its evaluation. `s`: the
    arm's settings (`arm_config`, its repeat's seed); its environment is `base_env` (the experiment's task and
    fleet) with the arm's rollout settings, seed, its policy's own sampler and `instrument_fn` (default the
    experiment's frozen instrumenter). The evaluation after RL is every arm's: `base_env`'s, a fresh sampler, with
    the arm's agent (its episodes' turns, `agent.*`) and `draws` independent episodes per start prompt
    (`evaluate`). A fresh arm's improve buffer starts as `prompt.improve_seed` says, the corpus verified once for
    every arm in `base_dir` (the experiment's warm start folder; default the arm's own)."""
    s = dataclasses.replace(s, workdir=str(arm_dir))
    reset_peak_rss()
    policy = nnx.clone(initial)
    learner = builders.make_learner(s, policy)
    tokenizer, task, fleet = base_env.tokenizer, base_env.task, base_env.fleet
    sampler = builders.make_sampler(s.sampler, policy, tokenizer, arm_dir)
    if isinstance(sampler, JaxSampler):
        sampler.reseed(s.seed)  # repeats differ in their samples, not only in their prompts and updates
    env = dataclasses.replace(
        base_env,
        settings=s.rollout,
        sampler=sampler,
        seed=s.seed,
        instrument_fn=instrument_fn or base_env.instrument_fn,
    )
    writer = MetricsWriter(arm_dir, tensorboard=False, samples_mb=s.report.samples_mb, steps=s.loop.steps,
                           output_chars=s.report.sample_output_chars)  # fmt: skip
    loop = AsyncRLLoop(s.loop, env, learner, Checkpointer(arm_dir / "checkpoints", keep=s.checkpoint_keep), writer)
    builders.start_loop(loop, s, task, base_env.packages, base_dir or arm_dir, resume=True)
    resumed_at = loop.counters.step
    loop.run(s.loop.steps)
    loop.close()
    c = loop.counters
    evaluated_here = not (arm_dir / "after.json").is_file()
    after_env = dataclasses.replace(  # seeds: fresh
        with_agent(base_env, s.rollout.agent),
        sampler=builders.local_sampler(s.sampler)(learner.policy_model(), tokenizer),
    )
    after = _cached(arm_dir / "after.json", lambda: evaluate(s.eval, after_env, draws=draws))
    peak = arm_peak_rss(arm_dir / "peak_rss.json", c.step > resumed_at or evaluated_here)
    return arm_result(s, c, arm_dir, after, task.id, fleet.n_slots, peak)


def arm_result(
    s: RunSettings, c: LoopCounters, arm_dir: Path, after: dict, task_id: str, n_slots: int, peak_rss: float | None
) -> dict:
    """What the experiment keeps of one arm's repeat: {"stats": its settings and the loop's totals (`c`, kept across
    resumes in its checkpoints), "after": `eval_summary` of its after-RL evaluation `after`, "steps": `step_series`}.
    n_slots: the executor fleet's; peak_rss: the arm's peak resident memory in GiB (`arm_peak_rss`)."""
    stats = {
        "algorithm": s.learner.algorithm,
        "duration_weights": s.learner.ppo.duration_weights,
        "instrument_mode": s.instrument.mode,
        "improve_fraction": s.rollout.prompt.improve_fraction,
        "seed": s.seed,
        "rl_wall_s": round(c.wall_s, 1),  # the loop's own clock, checkpointed: kept across resumes
        "steps_per_hour": round(c.step * 3600 / c.wall_s, 1) if c.wall_s > 0 else None,
        "turns": s.rollout.agent.turns,
        "programs_sampled_per_hour": round(c.sampled * 3600 / c.wall_s, 1) if c.wall_s > 0 else None,
        # the process's, while this arm ran (its RL and evaluation; the most over the processes that ran them)
        "peak_rss_gib": peak_rss,
        "samples_drawn": c.sampled,
        "resampled_stale": c.resampled_stale,
        "infra_failures": c.infra_failures,
        "executor_utilization": round(min(1.0, c.exec_busy_s / max(c.wall_s * n_slots, 1e-9)), 3),
        "learner_idle_fraction": round(1 - c.update_s / max(c.wall_s, 1e-9), 3),
        "instrument_lm_share": instrument_shares(arm_dir)["lm"],  # of the programs that parse
        "time": {"wait_s": round(c.wait_s, 1), "update_s": round(c.update_s, 1), "sample_s": round(c.sample_s, 1)},
        "stale": stale_means(arm_dir),
    }
    summary = eval_summary(after, task_id, s.rollout.reward.failure)
    return {"stats": stats, "after": summary, "steps": step_series(arm_dir, task_id)}


def arm_entry(arm: Arm, before: dict, repeats: Sequence[dict]) -> dict:
    """An arm in the summary: its before-RL evaluation, its first repeat's result (`arm_result`) at the top, its
    overrides, every repeat with its seed (each with "paired_before_after") and its task scores across them."""
    return {"before": before, **repeats[0], "overrides": dict(arm.overrides),
            "repeats": [{"seed": r["stats"]["seed"], **r} for r in repeats],
            "task_score": arm_task_scores(repeats)}  # fmt: skip


def with_agent(env: Environment, agent: AgentSettings) -> Environment:
    """`env` whose episodes follow `agent` (the same environment when it does already)."""
    if env.settings.agent == agent:
        return env
    return dataclasses.replace(env, settings=dataclasses.replace(env.settings, agent=agent))


def before_path(out: Path, turns: int | None) -> Path:
    """Where the before-RL evaluation is cached: out/before.json, or with --turns one per turns value K,
    out/before_t<K>.json."""
    return out / ("before.json" if turns is None else f"before_t{turns}.json")


def reset_peak_rss() -> None:
    """Restarts the kernel's count of this process's peak resident memory (VmHWM), where Linux allows it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # the peak is then the process's since it started


def peak_rss_gib() -> float | None:
    """This process's peak resident memory (VmHWM) since it started or since `reset_peak_rss`, in GiB."""
    kib = status_kib().get("VmHWM")
    return None if kib is None else round(kib / 2**20, 2)


def arm_peak_rss(path: Path, worked: bool) -> float | None:
    """The arm's peak resident memory, kept in `path` across processes: when this process ran part of the arm
    (`worked`), the larger of its peak since `reset_peak_rss` and the recorded one; else the recorded one."""
    recorded = json.loads(path.read_text())["peak_rss_gib"] if path.is_file() else None
    if not worked:
        return recorded
    now = peak_rss_gib()
    peak = max((x for x in (recorded, now) if x is not None), default=None)
    path.write_text(json.dumps({"peak_rss_gib": peak}))
    return peak


def _scaled(s: RunSettings, workdir: Path, scale: Scale) -> RunSettings:
    return dataclasses.replace(
        s,
        workdir=str(workdir),
        loop=dataclasses.replace(s.loop, steps=scale.steps),
        eval=dataclasses.replace(s.eval, samples=scale.eval_samples, improve=False),
    )


def repeat_settings(cfg: Any, arm: Arm, repeat: int, base: RunSettings, scale: Scale) -> RunSettings:
    """An arm's settings in one repeat: its config (`arm_config`) with the seed cfg.seed + repeat, at `scale`, and
    the experiment's evaluation (`base`'s: the same prompts and sampling seeds for every arm and repeat)."""
    c = arm_config(cfg, arm)
    c.seed = int(cfg.seed) + repeat
    return dataclasses.replace(_scaled(from_config(c), Path(base.workdir), scale), eval=base.eval)


def experiment_settings(
    cfg: Any, out: Path, scale: Scale, arms: Sequence[Arm], seeds: int
) -> tuple[RunSettings, dict[str, list[RunSettings]]]:
    """The experiment's own settings (its warm start and evaluations, in out/base, at `scale`) and each arm's
    settings in each of its `seeds` repeats (`repeat_settings`), by arm name."""
    s = _scaled(from_config(cfg), out / "base", scale)
    return s, {arm.name: [repeat_settings(cfg, arm, r, s, scale) for r in range(seeds)] for arm in arms}


def experiment(
    cfg: Any,
    out: Path,
    scale: Scale,
    arms: Sequence[Arm] = tuple(DEFAULT_ARMS),
    seeds: int = 1,
    turns: Sequence[int] = (),
    before_only: bool = False,
) -> dict:
    """Runs (or resumes) the whole experiment, `seeds` repeats of every arm; returns the summary it writes to
    out/summary.json. A bad arm (`arm_config`) or config (ConfigError) fails before any work.

    `before_only` (--before_only): only the before-RL evaluations (the cheap part: no arm is trained); the summary
    then has `before_only` and each arm's "before" alone. The same command without it reuses them and trains.

    `turns` (--turns; `arms` already split by `split_by_turns`): the before-RL evaluation once per turns value K with
    K-turn episodes, and every evaluation of a K-turn arm with max(turns) // K independent episodes per start prompt
    (the submission the best of them by the agent's printed metric), so every arm runs max(turns) programs per start
    prompt; the summary then has `turns` and `turns_contrasts` (`revision_contrasts`)."""
    t_start = time.monotonic()
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    runs = {arm.name: [run_dir(out, arm.name, r) for r in range(seeds)] for arm in arms}
    measures = work_left(out, [] if before_only else [d.name for dirs in runs.values() for d in dirs], turns)
    s, arm_settings = experiment_settings(cfg, out, scale, arms, seeds)
    arm_turns = {name: rs[0].rollout.agent.turns if turns else None for name, rs in arm_settings.items()}
    task, packages = environment.prepare(s)
    initial, tokenizer, ws_metrics = builders.build_policy(s, task, packages, out / "base")
    # the frozen instrumenter is the initial policy's; before RL, the initial policy is sampled afresh (eval seeds)
    with environment.open_environment(
        s,
        task,
        packages,
        initial,
        tokenizer,
        out / "base",
        sampler=builders.local_sampler(s.sampler)(initial, tokenizer),
    ) as before_env:
        befores = {}
        for k in sorted(set(arm_turns.values()), key=lambda k: -1 if k is None else k):
            env_k = before_env if k is None else with_agent(before_env, replace(s.rollout.agent, turns=k))
            draws = eval_draws(k, turns) if k is not None else 1
            befores[k] = eval_summary(
                _cached(before_path(out, k), lambda env_k=env_k, draws=draws: evaluate(s.eval, env_k, draws=draws)),
                task.id,
            )
        results = {}
        for arm in () if before_only else arms:
            repeats = []
            k = arm_turns[arm.name]
            for rs, arm_dir in zip(arm_settings[arm.name], runs[arm.name], strict=True):
                # an arm that instruments otherwise (say mode "off") gets its own instrumenter; the rest share one
                own = rs.instrument != s.instrument
                fn = builders.make_instrumenter(rs, initial, tokenizer, arm_dir) if own else None
                draws = eval_draws(k, turns) if k is not None else 1
                r = run_arm(rs, arm, initial, before_env, arm_dir, fn, draws, out / "base")
                repeats.append({**r, "paired_before_after": paired_by_prompt(befores[k], r["after"])})
            results[arm.name] = arm_entry(arm, befores[k], repeats)
    # recorded as soon as the measuring is done, so that a failure while summarising loses no measured time
    provenance_fields = record_wall(out, round(time.monotonic() - t_start, 1) if measures else None)
    if before_only:
        results = {arm.name: {"before": befores[arm_turns[arm.name]], "overrides": dict(arm.overrides)} for arm in arms}
        summary = {**provenance_fields, "task": task.id, "scale": dataclasses.asdict(scale), "before_only": True,
                   "batch_size": s.loop.batch_size, "group_size": s.loop.group_size, "warmstart": ws_metrics,
                   "arms": results}  # fmt: skip
        return _finish(summary, out, results, turns, task.lower_is_better)
    verified = out / "base" / "warmstart" / "verified.jsonl"
    corpus, medians = {}, {}
    if verified.is_file():
        medians = corpus_medians(verified)
        # the kinds the evaluation counts (solution_kind), of each verified program's code
        kinds = {hashlib.sha256(it.code.encode()).hexdigest(): solution_kind(task.id, it.code)
                 for it in full_grid(task.id, packages)}  # fmt: skip
        corpus = corpus_kinds(verified, task.id, lambda rec: kinds.get(rec["sha256"], "other"))
    slow = slow_and_better(corpus, medians, task.lower_is_better)
    summary = {
        **provenance_fields,
        "task": task.id,
        "scale": dataclasses.asdict(scale),
        "seeds": seeds,
        "batch_size": s.loop.batch_size,
        "group_size": s.loop.group_size,
        "algorithms": sorted({rs[0].learner.algorithm for rs in arm_settings.values()}, key=ALGORITHMS.index),
        "warmstart": ws_metrics,
        "corpus_kinds": corpus,
        "corpus_medians": medians,
        "slow_and_better": share_contrast(slow, results, scale.eval_samples),
        "lag_of_slow_and_better": {name: lag_of_kinds(out / "arms" / name, task.id, slow) for name in results},
        "arms": results,
        "contrasts": arm_contrasts(results),
    }
    return _finish(summary, out, results, turns, task.lower_is_better)


def _finish(summary: dict, out: Path, results: dict, turns: Sequence[int], lower_is_better: bool) -> dict:
    """The summary with its revising contrasts (--turns), written to out/summary.json and out/report.md."""
    if turns:
        summary["turns"] = list(turns)
        summary["turns_contrasts"] = revision_contrasts(results, turns, lower_is_better)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_report(summary, out)
    return summary


def work_left(out: Path, arm_names: list[str], turns: Sequence[int] = ()) -> bool:
    """Whether a process started on `out` measures anything: False when the before-RL evaluation (one per turns
    value with --turns) and every arm's after-RL evaluation are cached (each is written after the stages before
    it), so that the process only regenerates summary.json and the report."""
    befores = [before_path(out, k) for k in turns] or [before_path(out, None)]
    cached = [*befores, *(out / "arms" / name / "after.json" for name in arm_names)]  # a run's folder
    return not all(p.is_file() for p in cached)


def record_wall(out: Path, wall_s: float | None) -> dict[str, Any]:
    """The summary's provenance, from the ledger out/wall.jsonl: one line per process that measured something
    and finished (`wall_s` given; None for a process that only regenerated the summary, which adds nothing).

    Returns {"command", "date": of the last measuring process, "wall_s": the sum of their wall times,
    "processes": the ledger}; with no ledger and no summary before, this process's command and date alone. Wall
    times are recorded when measured and never recomputed: regenerating a summary keeps them. A process killed
    before it finished is not in the ledger. A folder whose summary predates the ledger keeps that summary's
    `wall_s_this_process` as it was.
    """
    ledger = out / "wall.jsonl"
    if wall_s is not None:
        provenance.append_jsonl(ledger, {"wall_s": wall_s})
    runs = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()] if ledger.is_file() else []
    if runs:
        return {"command": runs[-1]["command"], "date": runs[-1]["date"],
                "wall_s": round(sum(r["wall_s"] for r in runs), 1), "processes": runs}  # fmt: skip
    previous = out / "summary.json"
    if previous.is_file():
        old = json.loads(previous.read_text())
        return {k: old[k] for k in ("command", "date", "wall_s", "wall_s_this_process") if k in old}
    # nothing measured by a process that finished (a summary of an unfinished experiment's cached arms, say): the
    # command that wrote the summary, and no wall time
    return provenance.stamp()


def share_warm_start(source: Path, out: Path) -> None:
    """Starts `out` from the warm start of the experiment in `source` (its base/ folder, linked): the same
    initial policy and instrumenter, none of its RL or evaluations."""
    base = source.resolve() / "base"
    if not (base / "warmstart" / "policy" / "DONE").is_file():
        raise app.UsageError(f"--warm_start={source}: no finished warm start in {base} (run that experiment first)")
    out.mkdir(parents=True, exist_ok=True)
    link = out / "base"
    if link.is_symlink() and link.resolve() == base:
        return
    if link.exists() or link.is_symlink():
        raise app.UsageError(f"--warm_start: {link} exists already; use a new --out")
    link.symlink_to(base)
