"""The environment's settings, apart from the environment so that reading a run config (the launcher, the planner)
loads no rollout machinery: how a sample travels (RolloutSettings) and the `eval` section (EvalSettings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from mle_jax.executor.result import Limits
from mle_jax.sampling.protocol import SamplingSettings
from mle_jax.tasks.prompts import PromptSettings
from mle_jax.tasks.reward import RewardSettings


@dataclass(frozen=True)
class RolloutSettings:
    """How a sample travels through the environment: its prompt, its sampling, its run limits, its reward.
    The RL loop and the evaluation share them."""

    prompt: PromptSettings = field(default_factory=PromptSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    limits: Limits = field(default_factory=Limits)
    reward: RewardSettings = field(default_factory=RewardSettings)

    @property
    def max_sequence_tokens(self) -> int:
        """Prompt budget + response budget: the learner batch's padded length."""
        return self.prompt.max_prompt_tokens + self.sampling.max_tokens


@dataclass(frozen=True)
class EvalSettings:
    """The `eval` section of the run config, with the run's seed (the prompts' and samples' RNG)."""

    samples: int = 128
    improve: bool = True
    seed: int = 0
