"""The warm start's settings, apart from the stage so that reading a run config (the launcher, the planner) loads no
corpus, sandbox or SFT machinery: the `warmstart` section (WarmStartSettings) and one SFT run (SFTSettings)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from mle_jax.env.settings import AgentSettings
from mle_jax.executor.result import Limits
from mle_jax.instrument import InstrumentSettings
from mle_jax.models.settings import ModelSettings
from mle_jax.sampling.protocol import SamplingSettings
from mle_jax.tasks.prompts import PromptSettings


@dataclass(frozen=True)
class SFTSettings:
    """One supervised fine-tuning run (the warm start's `warmstart` section supplies them)."""

    steps: int = 300
    lr: float = 1e-3
    batch_size: int = 8
    micro_batch_size: int = 0  # rows per forward+backward, gradients summed over the batch (0: the whole batch)
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    max_response_tokens: int = 640  # longer responses are dropped, never truncated
    max_prompt_tokens: int = 768
    seed: int = 0
    log_every: int = 10
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"SFT needs steps >= 1 and batch_size >= 1, got {self.steps}, {self.batch_size}")
        if self.micro_batch_size < 0 or (self.micro_batch_size and self.batch_size % self.micro_batch_size):
            raise ValueError(
                f"SFT micro_batch_size={self.micro_batch_size} must divide batch_size={self.batch_size} (0: whole)"
            )


@dataclass(frozen=True)
class WarmStartSettings:
    """The `warmstart` section of the run config, with what the stage needs of the rest of it (the model to
    start from, the RL prompts' budgets, the sandbox limits and instrumentation of the verification runs)."""

    enabled: bool = False
    corpus_size: int = 256  # distinct programs from the task grid, each verified in the sandbox
    steps: int = 300
    lr: float = 1e-3
    batch_size: int = 8
    micro_batch_size: int = 0  # rows per forward+backward (gradients accumulated over the batch); 0: the whole batch
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    max_response_tokens: int = 1024  # longer corpus responses are dropped, never truncated
    log_every: int = 10
    checkpoint_every: int = 100
    verify_timeout_s: float = 120.0  # per corpus program
    verify_workers: int = 0  # 0: one per executor slot, at most one per CPU (resolved by mle_jax.run.settings)
    tokenizer_max_token_length: int = 16  # task BPE: merges may cross words up to this many chars
    improve_fraction: float = 0.5  # share of SFT examples on the RL improve prompt
    # improve targets of a kind of solution (model family and features: programs.solution_kind) whose mean score
    # beats the source's kind's, where one scores better than the source (else any better program, as with False)
    improve_to_better_kind: bool = False
    # SFT examples on the instrumentation prompt (C.3), targets by the AST instrumenter (warmstart/instrumentation.py),
    # so the frozen copy of the warm-started policy can instrument; 0: none (a pretrained instruct model can)
    instrument_examples: int = 0
    instrument_redrawn: int = 0  # more of them, about those programs with their hyperparameter values redrawn
    instrument_eval: int = 32  # held-out grid programs the warm-started model instruments after SFT (a metric)
    # steps repeating random token sequences before SFT, so a model from scratch learns to copy (sft.copy_pretrain);
    # only for a fresh model (no model.path), 0: none
    copy_steps: int = 0
    copy_length: int = 96
    # share of the solving SFT examples (scratch, improve and these) on an episode's turn 2 after a failed run: a
    # corpus program with an injected fault (warmstart/faults.py), its real output -> the original program, in the
    # episode context (`debug_context`); 0: none (warmstart/debug.py)
    debug_fraction: float = 0.0
    # held-out grid programs with an injected fault whose turn-2 fix the warm-started policy is asked for after SFT
    # (the metric debug_heldout_fix_share); measured when debug_fraction > 0 or agent.turns > 1; 0: never
    debug_eval: int = 32
    # from the rest of the run config
    seed: int = 0
    model: ModelSettings = field(default_factory=ModelSettings)
    prompt: PromptSettings = field(default_factory=PromptSettings)
    limits: Limits = field(default_factory=Limits)  # the run's sandbox limits; verification has its own timeout
    instrument: InstrumentSettings = field(default_factory=InstrumentSettings)  # the run's instrumenter
    agent: AgentSettings = field(default_factory=AgentSettings)  # the run's episodes (their turn-2 prompt)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)  # the run's sampling (held-out turn 2)

    def __post_init__(self) -> None:
        if not 0.0 <= self.debug_fraction < 1.0:
            raise ValueError(f"warmstart.debug_fraction must be in [0, 1), got {self.debug_fraction}")
        if int(self.debug_eval) != self.debug_eval or self.debug_eval < 0:
            raise ValueError(f"warmstart.debug_eval must be an integer >= 0, got {self.debug_eval}")

    @property
    def debug_context(self) -> str:
        """The form of the debug examples: turn 2's prompt in the run's `agent.context` when its episodes have more
        than one turn; with one turn, the improve prompt ("state"), the one prompt that shows such a run shows a
        failed run's output (improve prompts about earlier solutions)."""
        return self.agent.context if self.agent.turns > 1 else "state"

    @property
    def measures_debug(self) -> bool:
        """Whether the stage measures turn-2 fixes of held-out faulty programs after SFT (`debug_eval`)."""
        return self.debug_eval > 0 and (self.debug_fraction > 0 or self.agent.turns > 1)

    def sft(self) -> SFTSettings:
        return SFTSettings(
            steps=self.steps,
            lr=self.lr,
            batch_size=self.batch_size,
            micro_batch_size=self.micro_batch_size,
            warmup_steps=self.warmup_steps,
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
            max_response_tokens=self.max_response_tokens,
            max_prompt_tokens=self.prompt.max_prompt_tokens,
            seed=self.seed,
            log_every=self.log_every,
            checkpoint_every=self.checkpoint_every,
        )

    def verify_limits(self) -> Limits:
        return dataclasses.replace(self.limits, timeout_s=self.verify_timeout_s)
