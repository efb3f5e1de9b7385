"""The static knobs of the update (the `ppo` section of the run config): read by the update and the objectives."""

from __future__ import annotations

import dataclasses

from mle_jax.rl import ppo


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
    logits_chunk: int = 512  # logprobs/entropy over this many positions at a time (ppo.chunked_logprobs_entropy)
    fused_logprobs: bool = True  # their backward by hand (ppo.fused_logprob_entropy); False: autodiff, rematerialised
    decoupled: bool = False  # AReaL's decoupled loss: trust region around the proximal policy, behaviour weights
    behaviour_weight_cap: float = 5.0  # the decoupled loss's cap on π_prox / π_behaviour
    temperature: float = 1.0  # the sampler's: logprobs are of logits / temperature, as sampled

    def __post_init__(self) -> None:
        if self.kl_estimator not in ppo.KL_ESTIMATORS:
            raise ValueError(f"ppo.kl_estimator must be one of {ppo.KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if self.loss_agg not in ppo.LOSS_AGGS:
            raise ValueError(f"ppo.loss_agg must be one of {ppo.LOSS_AGGS}, got {self.loss_agg!r}")
        if self.duration_weights not in ppo.DURATION_MODES:
            raise ValueError(f"ppo.duration_weights must be one of {ppo.DURATION_MODES}, got {self.duration_weights!r}")
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
