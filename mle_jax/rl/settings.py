"""The RL settings, in one home: the `loop` section (`LoopSettings`), the update's knobs (the `ppo` section,
`PPOSettings`) and what the learner needs (`LearnerSettings`), apart from the loop itself so that reading a config
(the launcher, the planner) loads no RL loop."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from mle_jax.infra.optim import OptimSettings
from mle_jax.models import lora
from mle_jax.rl import core, duration, objectives

SYNC_SOURCES = ("hf", "orbax", "shm")


@dataclass(frozen=True)
class LoopSettings:
    """The `loop` section of the run config, with the sync and checkpoint cadence and the seed."""

    batch_size: int = 128  # B: samples per update
    group_size: int = 1  # n: samples of each prompt, sampled together; an update trains on B / n whole groups
    in_flight_multiplier: int = 2  # m: m*B samples kept in flight
    max_version_lag: int = 0  # > 0: re-sample prompts whose programs still wait in the queue after this many versions
    steps: int = 100
    improve_buffer_size: int = 256
    max_consecutive_infra_failures: int = 32  # this many executor failures in a row stop the run
    sync_every: int = 1  # sync weights to the sampler every k learner steps
    # "hf": export the policy as HF safetensors for the sampler; "orbax": the sampler loads the learner's own
    # checkpoint of that step (saved at every sync; vLLM only; BUILD.md "Weight sync at 3B scale"); "shm": the host
    # copy handed to the vLLM servers of this host through shared memory, no file (sampling/shm_sync.py; one process)
    sync_source: str = "hf"
    checkpoint_every: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"loop.steps must be >= 0 (0: no RL, the warm-started policy), got {self.steps}")
        if self.batch_size < 1 or self.in_flight_multiplier < 1:
            raise ValueError(
                f"loop.batch_size and loop.in_flight_multiplier must be >= 1, got {self.batch_size}, "
                f"{self.in_flight_multiplier}"
            )
        if self.group_size < 1:
            raise ValueError(f"sampler.group_size must be >= 1, got {self.group_size}")
        if self.batch_size % self.group_size:
            raise ValueError(
                f"loop.batch_size B={self.batch_size} is not a multiple of sampler.group_size n={self.group_size}: "
                f"an update trains on whole groups (pick n dividing B)"
            )
        if self.sync_source not in SYNC_SOURCES:
            raise ValueError(f"sampler.sync_source must be one of {SYNC_SOURCES}, got {self.sync_source!r}")
        if self.sync_every < 1 or self.checkpoint_every < 1 or self.max_consecutive_infra_failures < 1:
            raise ValueError(
                "sampler.sync_every, checkpoint.every and loop.max_consecutive_infra_failures must be >= 1"
            )


@dataclasses.dataclass(frozen=True)
class PPOSettings:
    """The `ppo` section of the run config plus the sampling temperature: the static knobs of the update
    (hashable; part of the jit cache key). Defaults are the paper's (Table 3)."""

    gamma: float = 1.0
    lam: float = 1.0
    clip_ratio: float = 0.2
    dual_clip: float = 0.0
    value_clip: float = 0.5
    entropy_coef: float = 0.001
    kl_coef: float = 0.001
    kl_estimator: str = "k1"
    whiten_advantages: bool = True
    loss_agg: str = "token-mean"
    duration_weights: str = "batch_mean"
    duration_max_weight: float = 10.0  # for duration_weights="clipped"
    min_duration_s: float = 1.0  # Δt floor of the duration weights (ppo.duration_weights)
    epochs: int = 1
    mini_batch_size: int = 128
    micro_batch_size: int = 8
    shuffle: bool = True
    seq_bucket: int = 128  # the learner pads T up to a multiple of this (one compile per bucket; 0: off)
    logits_chunk: int = 512  # logprobs/entropy over this many positions at a time (core.chunked_logprobs_entropy)
    fused_logprobs: bool = True  # their backward by hand (core.fused_logprob_entropy); False: autodiff, rematerialised
    decoupled: bool = False  # AReaL's decoupled loss: trust region around the proximal policy, behaviour weights
    behaviour_weight_cap: float = 5.0  # the decoupled loss's cap on π_prox / π_behaviour
    temperature: float = 1.0  # the sampler's: logprobs are of logits / temperature, as sampled

    def __post_init__(self) -> None:
        if self.kl_estimator not in core.KL_ESTIMATORS:
            raise ValueError(f"ppo.kl_estimator must be one of {core.KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.loss_agg not in core.LOSS_AGGS:
            raise ValueError(f"ppo.loss_agg must be one of {core.LOSS_AGGS}, got {self.loss_agg!r}")
        if self.duration_weights not in duration.DURATION_MODES:
            raise ValueError(
                f"ppo.duration_weights must be one of {duration.DURATION_MODES}, got {self.duration_weights!r}"
            )
        if self.epochs < 1 or self.mini_batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("ppo.epochs, mini_batch_size and micro_batch_size must be >= 1")
        if self.temperature <= 0:
            raise ValueError(f"sampler temperature must be > 0 for logprobs, got {self.temperature}")
        if self.logits_chunk < 0:
            raise ValueError(f"ppo.logits_chunk must be >= 0 (0: all positions at once), got {self.logits_chunk}")
        if self.dual_clip and self.dual_clip <= 1.0:
            raise ValueError(f"ppo.dual_clip must be > 1 (or 0 for off), got {self.dual_clip}")
        if self.behaviour_weight_cap < 1.0:  # below 1 it would down-weight tokens that are not stale at all
            raise ValueError(f"ppo.behaviour_weight_cap must be >= 1, got {self.behaviour_weight_cap}")


@dataclasses.dataclass(frozen=True)
class LearnerSettings:
    """What the learner needs of the run config: the objective (the `learner` section), the update's knobs, the
    optimizers, where the frozen reference lives, and the seed of the update's shuffling."""

    algorithm: str = "ppo"  # a name in rl/objectives.OBJECTIVES
    ppo: PPOSettings = dataclasses.field(default_factory=PPOSettings)
    optim: OptimSettings = dataclasses.field(default_factory=OptimSettings)
    reference_on_host: bool = False  # keep the frozen reference in pinned host memory (saves device memory)
    seed: int = 0
    # adapters on the policy and the critic over one frozen base, which is the reference (rank 0: every weight)
    lora: lora.LoraSettings = dataclasses.field(default_factory=lora.LoraSettings)

    def __post_init__(self) -> None:
        objectives.get(self.algorithm)  # ValueError naming the choices

    @property
    def objective(self) -> objectives.Objective:
        return objectives.get(self.algorithm)
