"""The sampler contract: token-id prompts in, completions with behaviour logprobs out.

`SamplingSettings` holds the sampling knobs a caller passes to `Sampler.generate` (validated once);
`check_completion` is the shape/dtype contract of every `Completion` a sampler returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import chex
import numpy as np


@dataclass
class Completion:
    """One sampled response to one prompt.

    prompt_ids: [P] int32, the prompt's token ids.
    token_ids: [T] int32, the sampled response tokens (EOS/stop token included when it stopped).
    logprobs:  [T] float32, log-softmax(logits / temperature) of each sampled token: PPO's
               behaviour logprobs.
    text:      the decoded response (special tokens removed).
    finish_reason: "stop" (EOS or a stop token) or "length" (hit max_tokens).
    version:   the policy version of the weights that produced it.
    server:    where it was sampled: the URL of the vLLM server ("" in process).
    """

    prompt_ids: np.ndarray
    token_ids: np.ndarray
    logprobs: np.ndarray
    text: str
    finish_reason: str
    version: int
    server: str = ""


def check_completion(c: Completion) -> Completion:
    """Asserts the `Completion` contract (prompt_ids int32 [P]; token_ids int32 [T]; logprobs float32 [T])
    and returns c. Every sampler calls it on what it returns: a break is a sampler bug (AssertionError)."""
    chex.assert_rank([c.prompt_ids, c.token_ids, c.logprobs], 1)
    chex.assert_type([c.prompt_ids, c.token_ids, c.logprobs], [np.int32, np.int32, np.float32])
    chex.assert_equal_shape([c.token_ids, c.logprobs])
    return c


@dataclass(frozen=True)
class SamplingSettings:
    """The sampling knobs of `Sampler.generate`, validated at construction (ValueError, one line).

    temperature: >= 0 (0 = greedy). top_p: in (0, 1] (1 = off). top_k: <= 0 = off.
    max_tokens: >= 1, most response tokens per completion.
    """

    temperature: float = 0.7  # the paper's (Table 3)
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 1024

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # NaN fails too
            raise ValueError(f"sampling temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling top_p must be in (0, 1] (1 = off), got {self.top_p}")
        if int(self.top_k) != self.top_k:
            raise ValueError(f"sampling top_k must be an integer (<= 0 = off), got {self.top_k}")
        if int(self.max_tokens) != self.max_tokens or self.max_tokens < 1:
            raise ValueError(f"sampling max_tokens must be an integer >= 1, got {self.max_tokens}")

    def generate_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `Sampler.generate`: {temperature, top_p, top_k, max_tokens}."""
        return dataclasses.asdict(self)


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
