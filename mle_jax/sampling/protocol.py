"""The sampler contract: token-id prompts in, completions with behaviour logprobs out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclass
class Completion:
    """One sampled response to one prompt.

    token_ids: [T] int32, the sampled response tokens (EOS/stop token included when it stopped).
    logprobs:  [T] float32, log-softmax(logits / temperature) of each sampled token: PPO's
               behaviour logprobs.
    text:      the decoded response (special tokens removed).
    finish_reason: "stop" (EOS or a stop token) or "length" (hit max_tokens).
    version:   the policy version of the weights that produced it.
    """

    prompt_ids: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray
    text: str
    finish_reason: str
    version: int


@dataclass(frozen=True)
class SamplingSettings:
    """How the policy samples (paper: temperature 0.7, top-p 1); asdict() gives Sampler.generate's kwargs."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 1024


@runtime_checkable
class Sampler(Protocol):
    """Anything that turns prompts into completions and can take new weights."""

    version: int

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 256,
        top_k: int = -1,
        seed: int | None = None,
    ) -> list[Completion]:
        """Returns len(prompts) * n completions, grouped by prompt (prompt 0's n first)."""
        ...

    def sync(self, params: Any, version: int) -> None:
        """Load new policy params (an nnx.State of the policy model) tagged with `version`."""
        ...
