"""Evaluation as in the paper (§4.1): N samples from scratch, each also improved once; graded; mean and max.

At test time the agent both solves from scratch and improves its own solution, and keeps the
better of the two. `python -m mle_jax.evaluate --workdir W [--samples N]` (mle_jax/evaluate.py)
evaluates a run's latest policy and prints our numbers beside the paper's Table 1. Each kind of sample also
says where it stands on MLE-bench's scale (mle_jax/tasks/medals.py): the best sample's medal and the share of
the samples at each level; the paper's figures get theirs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rich.progress import Progress

from mle_jax.env import rollout
from mle_jax.env.driver import EpisodeDriver
from mle_jax.env.episodes import Episode
from mle_jax.env.printed_metric import best_of_printed
from mle_jax.env.settings import EvalSettings
from mle_jax.infra import interrupt
from mle_jax.tasks.medals import medal, medal_summary
from mle_jax.tasks.paper import paper_row


def _run_round(driver: EpisodeDriver, total: int, ended_at_once: int, progress: Progress, label: str) -> None:
    """Runs the driver's turns in flight to their end, with a progress bar of `total` turns (`ended_at_once` of them
    ended without a run)."""
    job = progress.add_task(label, total=total)
    progress.update(job, advance=ended_at_once)
    # Ctrl-C (infra/interrupt.py): the runs in flight are cancelled when the environment closes
    driver.run_out(
        on_turn=lambda _: progress.advance(job),
        interrupted=lambda: interrupt.raise_if_requested(f"stopped during the evaluation ({label}), after RL"),
    )


def summarize(
    scores: list[float | None], rewards: list[float], lower_is_better: bool, task_id: str | None = None
) -> dict:
    """Valid fraction, mean and best score over the valid samples, mean reward and its standard error; with
    `task_id`, the samples' MLE-bench medals (`medal_summary`: the best one's level, the share at each level).

    scores: [n], None for an invalid sample; rewards: [n]."""
    valid = [s for s in scores if s is not None]
    best = (min if lower_is_better else max)(valid) if valid else None
    r = np.asarray(rewards, np.float64)
    out = {
        "samples": len(scores),
        "valid_fraction": len(valid) / max(len(scores), 1),
        "mean": float(np.mean(valid)) if valid else None,
        "max": best,  # "max" = best in the task's direction, as the paper reports it
        "mean_reward": float(r.mean()) if r.size else None,
        "se_reward": standard_error(r),
    }
    if task_id is not None:
        out["medals"] = medal_summary(task_id, scores)
    return out


def standard_error(xs: Sequence[float] | np.ndarray) -> float | None:
    """The standard error of the mean of `xs` (shape [n]); None for fewer than two values."""
    x = np.asarray(xs, np.float64)
    return float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else None


def _score(s: rollout.Sample) -> float | None:
    return None if s.reward is None or not s.reward.valid else float(s.reward.score)


def graded(samples: Sequence[rollout.Sample], task_id: str, lower_is_better: bool) -> dict:
    """`summarize` of the samples that were graded; a sample whose run failed in the executor (its retry too: no
    reward) is the executor's failure, not the agent's, and is counted apart in "infra_failures" (found by
    bench/chaos.py: such a sample ended the evaluation with an AttributeError)."""
    ok = [s for s in samples if s.reward is not None]
    out = summarize([_score(s) for s in ok], [s.reward.total for s in ok], lower_is_better, task_id)
    out["infra_failures"] = len(samples) - len(ok)
    return out


def _summary(samples: list[rollout.Sample], task_id: str, lower_is_better: bool) -> dict:
    out = graded(samples, task_id, lower_is_better)
    out["records"] = [s.record() for s in samples]
    return out


def evaluate(settings: EvalSettings, env: rollout.Environment, task_id: str | None = None, draws: int = 1) -> dict:
    """`settings.samples` scratch samples, then (if settings.improve) one improvement of each; per pair the
    better is kept. An environment over a mix of tasks, without `task_id`: every task so evaluated, as
    {"task": its first task, "tasks": {task id: that task's evaluation}}.

    With `draws` D > 1 every start prompt gets D independent episodes (of agent.turns turns each) and hands in one
    of their submissions, the best by the agent's own printed metric (env/printed_metric.py, never the private
    score): "scratch" holds the n handed in, "draw_samples" all n·D (`draw_summary`); "turns" and "draws" hold K
    and D (only when either is above 1)."""
    if task_id is None and len(env.tasks) > 1:
        per_task = {t: evaluate(settings, env, t, draws) for t in env.tasks}
        return {"task": env.task.id, "tasks": per_task}
    if draws < 1:
        raise ValueError(f"draws must be >= 1, got {draws}")
    task = env.tasks[task_id or env.task.id]
    rng = np.random.default_rng(settings.seed + 10_000)
    n, lower, task_id = settings.samples, task.lower_is_better, task.id
    turns = env.settings.agent.turns
    with Progress() as progress:
        prompts = env.prompts(n, None, rng, improve_fraction=0.0, task_id=task_id)
        prompts = [p for p in prompts for _ in range(draws)]  # each start prompt's D episodes together
        episodes = run_episodes(env, prompts, turns, progress, "eval: from scratch")
        submitted = [e.submitted() for e in episodes]  # one turn: the sample itself
        scratch = [best_of_printed(submitted[i : i + draws], lower) for i in range(0, len(submitted), draws)]
        out = {"task": task_id, "scratch": _summary(scratch, task_id, lower)}
        if draws > 1 or turns > 1:
            out["turns"], out["draws"] = turns, draws
        if draws > 1:
            out["draw_samples"] = draw_summary(submitted, draws, task_id, lower)
        if turns > 1:
            out["episodes"] = episode_summary(episodes, task_id, lower)
        if settings.improve:
            next_uid = 1 + max(s.uid for e in episodes for s in e.turns)  # n after n one-turn episodes
            improved = env.sample([env.improve_prompt(env.previous(s)) for s in scratch], next_uid)
            driver = EpisodeDriver(env)
            _, ended = driver.start(improved)
            _run_round(driver, len(improved), len(ended), progress, "eval: improve")
            out["improved"] = _summary(improved, task_id, lower)
            better_scores, better_rewards = [], []
            for a, b in zip(scratch, improved, strict=True):
                rewards = [x.reward.total for x in (a, b) if x.reward is not None]
                if not rewards:  # both runs failed in the executor: no pair to judge
                    continue
                cands = [x for x in (_score(a), _score(b)) if x is not None]
                better_scores.append((min if lower else max)(cands) if cands else None)
                better_rewards.append(max(rewards))
            out["best_of_both"] = summarize(better_scores, better_rewards, lower, task_id)
    paper = paper_row(task_id)
    if paper:
        out["paper"] = paper
        out["paper_medals"] = {model: medal(task_id, score) for model, score in paper.items()}  # what each would earn
    return out


def run_episodes(
    env: rollout.Environment, prompts: list[rollout.PromptItem], turns: int, progress: Progress, label: str
) -> list[Episode]:
    """One episode per prompt, of at most `turns` turns (env/episodes.py), turn by turn: every episode's turn k runs
    on the fleet together; an episode whose response had no code ends there."""
    driver = EpisodeDriver(env, turns)
    first = env.sample(prompts, 0)
    episodes, ended = driver.start(first)
    _run_round(driver, len(first), len(ended), progress, label if turns == 1 else f"{label}: turn 1")
    uid = len(first)
    for k in range(2, turns + 1):
        if not driver.ready:
            break
        new, ended = driver.advance(uid, key=lambda s: s.episode)  # in the episodes' order
        uid += len(new)
        _run_round(driver, len(new), len(ended), progress, f"{label}: turn {k}")
    for e in episodes:
        e.ended = True
    return episodes


def episode_summary(episodes: list[Episode], task_id: str, lower_is_better: bool) -> dict:
    """Episodes of several turns: the first turn's and the submitted turn's summaries (`summarize`), the valid fraction
    by turn (of the episodes that reached it), and for analysis only the best turn by the private score."""

    def of(samples: list[rollout.Sample]) -> dict:
        return graded(samples, task_id, lower_is_better)

    turns = max(len(e.turns) for e in episodes)
    best = [e.best_private(lower_is_better) or e.submitted() for e in episodes]
    return {
        "first_turn": of([e.first for e in episodes]),
        "submitted": of([e.submitted() for e in episodes]),
        "best_turn_private": of(best),
        "valid_fraction_by_turn": [
            float(np.mean([bool(e.turns[k].reward and e.turns[k].reward.valid) for e in episodes if len(e.turns) > k]))
            for k in range(turns)
        ],
        "duration_s_by_turn": [
            float(np.mean([e.turns[k].duration_s for e in episodes if len(e.turns) > k])) for k in range(turns)
        ],
        "episodes_reaching_turn": [sum(len(e.turns) > k for e in episodes) for k in range(turns)],
        "records": [s.record() for e in episodes for s in e.turns],
    }


def draw_summary(samples: list[rollout.Sample], draws: int, task_id: str, lower_is_better: bool) -> dict:
    """The n·D submissions of D independent draws per start prompt (prompt i's D together): all of them as one
    sample (`summarize`), and by draw d (the d-th of each prompt's D, so d = 1..D are D independent samples of n) the
    valid fraction and mean Δt; for analysis only, the best by the private score per prompt (what the agent could not
    choose).

    samples: [n·D]."""
    by = [samples[d::draws] for d in range(draws)]
    groups = [samples[i : i + draws] for i in range(0, len(samples), draws)]
    best = []
    for g in groups:
        scored = [s for s in g if _score(s) is not None]
        best.append((min if lower_is_better else max)(scored, key=_score) if scored else g[0])
    return {
        "draws": draws,
        "all": graded(samples, task_id, lower_is_better),
        "best_draw_private": graded(best, task_id, lower_is_better),
        "valid_fraction_by_draw": [float(np.mean([bool(s.reward and s.reward.valid) for s in d])) for d in by],
        "duration_s_by_draw": [float(np.mean([s.duration_s for s in d])) for d in by],
        "records": [s.record() for s in samples],
    }
