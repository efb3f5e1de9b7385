"""Episodes of several turns: the agent writes a program, reads what its run did (env/observation.py), revises.

One turn (`agent.turns` = 1, the default) is the paper's agent: an episode is one sample. With K turns each turn is
an ordinary `Sample` (its own prompt, response, run, reward); an `Episode` strings them together:

- context "conversation": turn k's prompt is the episode's token sequence so far, start prompt · response₁ ·
  observation₁ · … · observation_{k-1}: earlier responses' tokens exactly as sampled, each observation the tokens of
  a user turn of the chat template. Context "state": turn k's prompt is the paper's improve prompt (C.2) about
  turn k-1's program and its output (ML-Agent's step-wise setting), a prompt of bounded length.
- An episode ends after K turns, or earlier when a response has no code block (nothing to run, nothing to revise).
  It submits its last turn whose submission.csv passed the format check (what an agent that cannot see the private
  score would hand in), else its last turn.
- The learner's rows (`episode_rows`): credit "episode" gives every policy token the reward of the submitted turn
  and the episode's Δt (the sum of its turns' run times); in a conversation that is one row, prompt · r₁ · o₁ · … ·
  r_K with the observations masked out of every loss. Credit "turn" (or context "state") gives one row per turn,
  with its own reward and Δt ("episode" credit in "state": each turn's row gets the episode's reward and Δt).
  Rows of turns an episode did not reach are inert (`INERT`): no policy token, their own task and group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mle_jax.env.settings import AgentSettings

if TYPE_CHECKING:
    from mle_jax.env.rollout import Sample


@dataclass
class Episode:
    """The turns of one episode, in order (the last may still be running)."""

    turns: list[Sample] = field(default_factory=list)
    ended: bool = False  # no further turn will be sampled

    @property
    def first(self) -> Sample:
        return self.turns[0]

    @property
    def uid(self) -> int:
        return self.first.uid

    @property
    def group(self) -> int:
        return self.first.group

    @property
    def task(self) -> str:
        return self.first.task

    @property
    def last(self) -> Sample:
        return self.turns[-1]

    @property
    def done(self) -> bool:
        return self.ended and self.last.done

    def continues(self, turns: int) -> bool:
        """Whether a finished last turn is followed by another: fewer than `turns` turns so far and its response had
        code (an executor failure never continues: its group is dropped)."""
        last = self.last
        if not last.done or last.reward is None:
            return False
        return len(self.turns) < turns and last.code is not None

    def submitted(self) -> Sample:
        """The turn the episode hands in: the last one whose submission passed the format check, else the last."""
        for s in reversed(self.turns):
            if s.observation is not None and s.observation.submission_ok:
                return s
        return self.last

    def best_private(self, lower_is_better: bool) -> Sample | None:
        """The turn with the best private score (analysis only: never shown to the agent, never chosen by it)."""
        valid = [s for s in self.turns if s.reward is not None and s.reward.valid]
        if not valid:
            return None
        return (min if lower_is_better else max)(valid, key=lambda s: float(s.reward.score))

    @property
    def duration_s(self) -> float:
        """Δt of the episode: the sum of its turns' run times."""
        return float(sum(s.duration_s for s in self.turns))


@dataclass
class Row:
    """One learner row: prompt, then segments (a response with its behaviour logprobs, or an observation with None),
    its reward, Δt, policy version, group and task. An empty `segments` list is an inert row."""

    prompt_ids: list[int]
    segments: list[tuple[list[int], list[float] | None]]
    reward: float
    duration_s: float
    version: int
    group: int
    task: str
    versions: list[int] = field(default_factory=list)  # each response segment's policy version


INERT_TASK = "\x00inert"  # the task of inert rows: their own task for the duration weights and the whitening


def _response(s: Sample) -> tuple[list[int], list[float]]:
    return [int(t) for t in s.completion.token_ids], [float(x) for x in s.completion.logprobs]


def turn_row(s: Sample, reward: float, duration_s: float, group: int) -> Row:
    """A turn as a row of its own: its prompt (the conversation so far, or the state prompt) and its response."""
    ids, lps = _response(s)
    return Row(list(s.prompt.prompt_ids), [(ids, lps)], reward, duration_s, s.version, group, s.task, [s.version])


def conversation_row(ep: Episode, reward: float, duration_s: float) -> Row:
    """The whole conversation as one row: the start prompt, each response (policy tokens) and the observation turn
    after it (the `observation_ids` appended when the next turn was sampled)."""
    segments: list[tuple[list[int], list[float] | None]] = []
    for i, s in enumerate(ep.turns):
        segments.append(_response(s))
        if i + 1 < len(ep.turns):
            if s.observation_ids is None:
                raise ValueError(f"episode {ep.uid}: turn {s.turn} is followed by another but has no observation ids")
            segments.append((list(s.observation_ids), None))
    versions = [s.version for s in ep.turns]
    return Row(list(ep.first.prompt.prompt_ids), segments, reward, duration_s, min(versions), ep.group, ep.task,
               versions)  # fmt: skip


def turn_group(group: int, turn: int, turns: int) -> int:
    """The group of a turn's row with "turn" credit: the same turn of the episodes sampled from one start prompt."""
    return group * turns + (turn - 1)


def episode_rows(ep: Episode, agent: AgentSettings) -> list[Row]:
    """The learner rows of a finished episode (`agent.rows_per_episode` of them, inert ones included)."""
    rows: list[Row] = []
    submitted = ep.submitted()
    if agent.credit == "episode":
        reward = float(submitted.reward.total)
        if agent.context == "conversation":
            return [conversation_row(ep, reward, ep.duration_s)]
        rows = [turn_row(s, reward, ep.duration_s, ep.group) for s in ep.turns]
    else:
        rows = [
            turn_row(s, float(s.reward.total), s.duration_s, turn_group(ep.group, s.turn, agent.turns))
            for s in ep.turns
        ]
    return rows + [inert_row() for _ in range(agent.rows_per_episode - len(rows))]


def inert_row() -> Row:
    return Row([0], [], 0.0, 0.0, 0, -1, INERT_TASK)


def policy_tokens(rows: Sequence[Row]) -> int:
    return sum(len(ids) for r in rows for ids, lp in r.segments if lp is not None)
