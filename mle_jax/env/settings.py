"""The environment's settings, apart from the environment so that reading a run config (the launcher, the planner)
loads no rollout machinery: how a sample travels (RolloutSettings) and the `eval` section (EvalSettings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mle_jax.executor.result import Limits
from mle_jax.sampling.protocol import SamplingSettings
from mle_jax.tasks.prompts import PromptSettings
from mle_jax.tasks.reward import RewardSettings

AGENT_CONTEXTS = ("conversation", "state")
AGENT_CREDITS = ("episode", "turn")


@dataclass(frozen=True)
class AgentSettings:
    """The `agent` section: episodes of several turns (mle_jax/env/episodes.py). One turn is the paper's agent.

    turns: K, the most programs one episode writes (each after reading what the previous one did).
    context: "conversation" (one token sequence: prompt, response, observation, response, ...; earlier tokens kept as
      sampled) | "state" (ML-Agent's step-wise setting: each turn a fresh improve prompt built from the episode's
      last program and its output).
    credit: "episode" (every policy token gets the reward of what the episode submits; an update trains on B finished
      episodes) | "turn" (each turn its own sample with its own reward; an update trains on the first B finished
      turns, ML-Agent's step-wise RL).
    observation_tokens: most tokens of one observation turn (conversation context; its output tail shrinks to fit).
    """

    turns: int = 1
    context: str = "conversation"
    credit: str = "episode"
    observation_tokens: int = 512

    def __post_init__(self) -> None:
        if int(self.turns) != self.turns or self.turns < 1:
            raise ValueError(f"agent.turns must be an integer >= 1 (1: the paper's agent), got {self.turns}")
        if self.context not in AGENT_CONTEXTS:
            raise ValueError(f"agent.context must be one of {', '.join(AGENT_CONTEXTS)}, got {self.context!r}")
        if self.credit not in AGENT_CREDITS:
            raise ValueError(f"agent.credit must be one of {', '.join(AGENT_CREDITS)}, got {self.credit!r}")
        if int(self.observation_tokens) != self.observation_tokens or self.observation_tokens < 16:
            raise ValueError(f"agent.observation_tokens must be an integer >= 16, got {self.observation_tokens}")

    @property
    def rows_per_episode(self) -> int:
        """Learner rows one episode becomes: one conversation with "episode" credit, else one per turn (K)."""
        return 1 if self.context == "conversation" and self.credit == "episode" else self.turns

    @property
    def per_turn(self) -> bool:
        """Whether a batch is made of turns (the first B finished, "turn" credit over several turns) rather than of
        episodes."""
        return self.credit == "turn" and self.turns > 1

    @property
    def rows_per_batch_item(self) -> int:
        """Learner rows per unit of `loop.batch_size`: one per turn when the batch is made of turns, else an
        episode's rows."""
        return 1 if self.per_turn else self.rows_per_episode


@dataclass(frozen=True)
class RolloutSettings:
    """How a sample travels through the environment: its prompt, its sampling, its run limits, its reward.
    The RL loop and the evaluation share them."""

    prompt: PromptSettings = field(default_factory=PromptSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    limits: Limits = field(default_factory=Limits)
    reward: RewardSettings = field(default_factory=RewardSettings)
    agent: AgentSettings = field(default_factory=AgentSettings)

    @property
    def max_sequence_tokens(self) -> int:
        """The learner batch's padded length: prompt budget + response budget; in a conversation of K turns, K
        responses and K - 1 observations after the prompt."""
        a, one = self.agent, self.prompt.max_prompt_tokens + self.sampling.max_tokens
        if a.context != "conversation" or a.turns == 1:
            return one
        return one + (a.turns - 1) * (self.sampling.max_tokens + a.observation_tokens)


@dataclass(frozen=True)
class EvalSettings:
    """The `eval` section of the run config, with the run's seed (the prompts' and samples' RNG)."""

    samples: int = 128
    improve: bool = True
    seed: int = 0
