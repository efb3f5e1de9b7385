"""What one RL step reports of the samples it trained on (rl/loop.py writes it): the step's statistics
(`StepStats`), per task and per turn, and the records of samples.jsonl."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mle_jax.env import rollout
from mle_jax.env.episodes import Episode
from mle_jax.tasks.medals import medal_summary
from mle_jax.tasks.registry import get_spec
from mle_jax.tasks.reward import task_scores


def ratio(part: int, whole: int) -> float | None:
    """part / whole to 3 places; None when whole is 0."""
    return round(part / whole, 3) if whole else None


def _share(flags: list[bool]) -> float | None:
    return float(np.mean(flags)) if flags else None


@dataclass
class StepStats:
    """What one update saw: the B samples it trained on."""

    samples: list[rollout.Sample] = field(default_factory=list)
    tasks: tuple[str, ...] = ()  # a run over a mix of several tasks: their ids, for a row of metrics per task
    # a run of one task: whether its score is better lower, for score/best (a mix has score/best/<task> instead)
    lower_is_better: bool | None = None
    failure: float = -10.0  # reward.failure: an invalid solution's task score (the paper's -10)

    def _task_scores(self) -> np.ndarray:
        """[B] the paper's task score of each sample (`task_scores`), in its own task's direction."""
        lower = [get_spec(s.task).lower_is_better if self.tasks else bool(self.lower_is_better) for s in self.samples]
        valid = [s.reward.valid for s in self.samples]
        return task_scores(valid, [s.reward.score for s in self.samples], np.array(lower, bool), self.failure)

    def metrics(self) -> dict[str, float]:
        rewards = np.array([s.reward.total for s in self.samples], dtype=np.float64)
        valid = np.array([s.reward.valid for s in self.samples], dtype=bool)
        scores = np.array([s.reward.score for s in self.samples if s.reward.valid], dtype=np.float64)
        durations = np.array([s.duration_s for s in self.samples], dtype=np.float64)
        prints = np.array([s.reward.n_prints for s in self.samples], dtype=np.float64)
        parsed = [s for s in self.samples if s.code and s.instrument_path != "unparsed"]
        score_part = np.where(valid, rewards, 0.0)
        progress_part = np.where(valid, 0.0, rewards)
        m = {
            "reward/mean": rewards.mean(),
            "reward/max": rewards.max(),
            "reward/score_part": score_part.mean(),
            "reward/progress_part": progress_part.mean(),
            "valid_fraction": valid.mean(),
            "score/mean": scores.mean() if scores.size else None,
            "score/max": scores.max() if scores.size else None,
            "score/min": scores.min() if scores.size else None,
            "score/best": best_score(scores.tolist(), self.lower_is_better),
            # the paper's Fig. 9 number: -10 for an invalid solution, else the signed score; no partial credit
            "task_score/mean": self._task_scores().mean(),
            "duration_s/mean": durations.mean(),
            "duration_s/max": durations.max(),
            "progress_prints/mean": prints.mean(),
            "no_code_fraction": np.mean([s.code is None for s in self.samples]),
            "improve_fraction": np.mean([s.prompt.kind == "improve" for s in self.samples]),
            # the same, under the name of its peer `prompt/improve_share_drawn` (rl/loop.py): trained vs drawn
            "prompt/improve_share_trained": np.mean([s.prompt.kind == "improve" for s in self.samples]),
            # of the programs an instrumenter can work on (they parse): the LM's share and the fallback's
            "instrument/lm_fraction": _share([s.instrument_path == "lm" for s in parsed]),
            "instrument/fallback_fraction": _share([s.instrument_path == "fallback" for s in parsed]),
            "instrument/unparsed_fraction": _share([s.instrument_path == "unparsed" for s in self.samples if s.code]),
            "response_tokens/mean": np.mean([len(s.completion.token_ids) for s in self.samples]),
        }
        for kind in ("scratch", "improve"):  # self-improvement works only if improve prompts stay valid
            of_kind = [s.reward.valid for s in self.samples if s.prompt.kind == kind]
            m[f"valid_fraction/{kind}"] = np.mean(of_kind) if of_kind else None
        if self.tasks:  # a mix of tasks: a row per task (none of its samples in this batch: None)
            for task in self.tasks:
                m.update(task_metrics(task, [s for s in self.samples if s.task == task], self.failure))
        return {k: (None if v is None else float(v)) for k, v in m.items()}


def best_score(scores: list[float], lower_is_better: bool | None) -> float | None:
    """The best of the valid samples' scores in the task's direction (the max is the worst log loss); None when
    there is none or the direction is unknown (scores of several tasks do not compare)."""
    if not scores or lower_is_better is None:
        return None
    return min(scores) if lower_is_better else max(scores)


def task_metrics(task: str, samples: list[rollout.Sample], failure: float = -10.0) -> dict[str, float | None]:
    """One task's share of a batch: `<metric>/<task>` for reward/mean, reward/se, valid_fraction, score/mean,
    score/best (in the task's direction), task_score/mean (`task_scores`: `failure` for an invalid solution),
    medal_fraction (samples at bronze or above) and duration_s/mean."""
    if not samples:
        keys = ("samples", "reward/mean", "reward/se", "valid_fraction", "score/mean", "score/best", "task_score/mean")
        return {f"{k}/{task}": None for k in (*keys, "medal_fraction", "duration_s/mean")}
    rewards = np.array([s.reward.total for s in samples], dtype=np.float64)
    scores = [float(s.reward.score) for s in samples if s.reward.valid]
    lower = get_spec(task).lower_is_better
    medals = medal_summary(task, [float(s.reward.score) if s.reward.valid else None for s in samples])
    return {
        f"samples/{task}": float(len(samples)),
        f"reward/mean/{task}": float(rewards.mean()),
        f"reward/se/{task}": float(rewards.std(ddof=1) / np.sqrt(rewards.size)) if rewards.size > 1 else None,
        f"valid_fraction/{task}": float(np.mean([s.reward.valid for s in samples])),
        f"score/mean/{task}": float(np.mean(scores)) if scores else None,
        f"score/best/{task}": best_score(scores, lower),
        f"task_score/mean/{task}": float(
            task_scores([s.reward.valid for s in samples], [s.reward.score for s in samples], lower, failure).mean()
        ),
        f"medal_fraction/{task}": medals["any_medal"],
        f"duration_s/mean/{task}": float(np.mean([s.duration_s for s in samples])),
    }


def turn_metrics(
    episodes: list[Episode], turns: int, c_version: int, samples: list[rollout.Sample] | None = None
) -> dict[str, float | None]:
    """Episodes of several turns: per turn k (1..K) the valid fraction, mean reward and Δt of the episodes that
    reached it (`<metric>/turn<k>`), the mean number of turns, the episodes' Δt (sum of their turns'), and the version
    lag per policy token (a later turn may be sampled after a weight sync). With `samples` (a batch of turns, "turn"
    credit) the per-turn figures and the lag are of those turns, and the episode figures of `episodes`, the episodes
    whose last turn trained (None when there is none)."""
    m: dict[str, float | None] = {}
    trained = samples if samples is not None else [s for e in episodes for s in e.turns]
    for k in range(1, turns + 1):
        at = [s for s in trained if s.turn == k]
        m[f"valid_fraction/turn{k}"] = float(np.mean([s.reward.valid for s in at])) if at else None
        m[f"reward/mean/turn{k}"] = float(np.mean([s.reward.total for s in at])) if at else None
        m[f"duration_s/mean/turn{k}"] = float(np.mean([s.duration_s for s in at])) if at else None
    m["episode/turns"] = float(np.mean([len(e.turns) for e in episodes])) if episodes else None
    m["episode/duration_s/mean"] = float(np.mean([e.duration_s for e in episodes])) if episodes else None
    m["episode/submitted_turn"] = float(np.mean([e.submitted().turn for e in episodes])) if episodes else None
    lags = [(c_version - 1 - s.version, len(s.completion.token_ids)) for s in trained]
    tokens = sum(n for _, n in lags)
    m["version_lag/token_mean"] = float(sum(lag * n for lag, n in lags) / tokens) if tokens else None
    return m


def episode_records(
    episodes: list[Episode],
    version: int,
    env: rollout.Environment,
    output_chars: int | None = None,
    only: set[int] | None = None,
) -> list[dict]:
    """samples.jsonl rows of an update: one per turn (`Sample.record`, its texts with `output_chars`), with its version
    lag, whether its episode submitted it and (for analysis only: the agent never sees it) whether it is the episode's
    best turn by the private score. `only`: the uids of the turns to write (a batch of turns, "turn" credit); the two
    flags are None for a turn whose episode has not ended yet."""
    out = []
    for e in episodes:
        submitted, best = e.submitted(), e.best_private(env.task_of(e.first).lower_is_better)
        for s in e.turns:
            if only is not None and s.uid not in only:
                continue
            row = {**s.record(output_chars), "lag": version - s.version}
            if only is not None:
                row["trained_as"] = "turn"  # a sample of its own ("turn" credit), whatever its episode submits
            if len(e.turns) > 1 or e.first.turn != 1 or env.settings.agent.turns > 1:
                ended = e.ended
                row |= {"submitted": s is submitted if ended else None, "best_private": s is best if ended else None}
            out.append(row)
    return out
