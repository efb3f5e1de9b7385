"""The one optimizer builder: global-norm clipping then AdamW, with a warmup and an optional cosine decay.

Used by the PPO learner (policy and critic: constant lr after warmup, as the paper) and by the warm-start
SFT (warmup, then cosine decay to `end_lr_fraction` of lr over `decay_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass

import optax


@dataclass(frozen=True)
class OptimSettings:
    """The `optim` section of the run config (actor and critic learning rates are picked by the learner)."""

    actor_lr: float = 1e-5
    critic_lr: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_steps: int = 0
    adam_eps: float = 1e-8
    master_dtype: str = "float32"  # learner-side params and Adam moments ("" = the model's param dtype)

    def __post_init__(self) -> None:
        if self.actor_lr <= 0 or self.critic_lr <= 0:
            raise ValueError(f"optim: learning rates must be > 0, got actor {self.actor_lr}, critic {self.critic_lr}")
        if self.grad_clip <= 0:
            raise ValueError(f"optim.grad_clip must be > 0, got {self.grad_clip}")
        if self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")

    def optimizer(self, lr: float) -> optax.GradientTransformation:
        """The learner's optimizer for one model at `lr` (actor_lr or critic_lr): constant after the warmup."""
        return make_optimizer(
            lr,
            grad_clip=self.grad_clip,
            weight_decay=self.weight_decay,
            warmup_steps=self.warmup_steps,
            adam_eps=self.adam_eps,
        )


def make_optimizer(
    lr: float,
    *,
    grad_clip: float,
    weight_decay: float = 0.0,
    warmup_steps: int = 0,
    adam_eps: float = 1e-8,
    decay_steps: int = 0,
    end_lr_fraction: float = 0.1,
) -> optax.GradientTransformation:
    """clip_by_global_norm(grad_clip) then AdamW(schedule, weight_decay).

    schedule: linear warmup from 0 over `warmup_steps`, then constant lr (decay_steps == 0), or cosine
    decay to `end_lr_fraction * lr` at step `decay_steps` (counting the warmup).
    """
    if decay_steps > 0:
        warmup = max(1, min(warmup_steps, decay_steps - 1))
        schedule = optax.warmup_cosine_decay_schedule(
            0.0, lr, warmup, max(decay_steps, warmup + 1), end_value=lr * end_lr_fraction
        )
    elif warmup_steps > 0:
        schedule = optax.linear_schedule(0.0, lr, warmup_steps)
    else:
        schedule = lr
    return optax.chain(
        optax.clip_by_global_norm(grad_clip),
        optax.adamw(schedule, eps=adam_eps, weight_decay=weight_decay),
    )
