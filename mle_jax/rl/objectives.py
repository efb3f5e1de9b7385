"""The RL objective as one seam: a batch of finished samples -> advantages, and the losses the update minimises.

The update (`rl/update.py`) owns the forward passes, the epochs x mini-batches x micro-batches loop and the
optimizer steps; an objective owns the rest:

- `critic`: whether it trains a value model. Only then does the learner build one, hold its optimizer state
  and checkpoint it, and the update run the critic's forward pass and its step (`value_loss`).
- `advantages`: per-token advantages [B, T] of the whole batch (and the critic's returns).
- `policy_loss`: the actor's loss of a micro-batch. Shared by every objective: the clipped surrogate against the
  behaviour policy, or with `ppo.decoupled` against the proximal policy with behaviour weights (AReaL); each
  sample's surrogate times its duration weight, exactly as in PPO; minus the entropy bonus; plus
  `ppo.kl_coef` x KL(π || π_ref) as a loss term when the objective does not put the KL in the reward.

`config.learner.algorithm` names one entry of `OBJECTIVES`. A new objective is a class here and one line in
`OBJECTIVES`: the settings check the name against it, and the learner, `builders.make_learner` and the planner
build a value model only where `critic` is True.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import TYPE_CHECKING

import jax.numpy as jnp
from jax import Array

from mle_jax.rl import core
from mle_jax.rl.advantages import group_advantages

if TYPE_CHECKING:  # rl/settings.py validates its algorithm against this module
    from mle_jax.rl.settings import PPOSettings


class Objective(abc.ABC):
    """Base of the objectives: the shared actor loss; subclasses give the advantages (and a critic's loss)."""

    critic: bool = False  # trains a value model (Qwen2ValueModel) beside the policy
    kl_in_reward: bool = False  # the KL to the reference is a penalty in the token rewards, not a loss term
    needs_groups: bool = False  # its advantages compare a sample with its group's (sampler.group_size >= 2)

    @abc.abstractmethod
    def advantages(
        self, s: PPOSettings, batch: Mapping[str, Array], mask: Array, behaviour_lp: Array, ref_lp: Array,
        values: Array | None,
    ) -> dict[str, Array]:  # fmt: skip
        """The whole batch's advantages [B, T] (0 outside the response), the per-token KL(behaviour || reference)
        [B, T] (a metric, or the reward's penalty), and for a critic its returns [B, T].

        batch: the update's batch (rewards, group_ids, task_ids, durations_s [B]; ...); mask: response_mask float
        [B, T]; behaviour_lp, ref_lp: [B, T], 0 outside the response; values: the critic's [B, T] (None without one).
        """

    def policy_loss(
        self, s: PPOSettings, lp: Array, entropy_tok: Array, mb: Mapping[str, Array], denom: Array
    ) -> tuple[Array, dict[str, Array]]:
        """The actor's loss of a micro-batch and its sums (summed over the micro-batches of a mini-batch).

        lp, entropy_tok: [b, T] logprobs and entropies under the params being trained (lp 0 outside the response).
        mb: mask, old_logprobs (behaviour), advantages [b, T]; weights, slow [b]; prox_logprobs [b, T] with
        `s.decoupled`; ref_logprobs [b, T] unless `kl_in_reward`. denom: the mini-batch's token (or sequence) count.
        """
        mask = mb["mask"]
        if s.decoupled:
            old = mb["prox_logprobs"]
            pg, m = core.decoupled_policy_loss(
                lp, old, mb["old_logprobs"], mb["advantages"], mask, mb["weights"],
                s.clip_ratio, s.dual_clip, s.loss_agg, denom, s.behaviour_weight_cap,
            )  # fmt: skip
        else:
            old = mb["old_logprobs"]
            pg, m = core.policy_loss(
                lp, old, mb["advantages"], mask, mb["weights"], s.clip_ratio, s.dual_clip, s.loss_agg, denom
            )
        entropy = core.aggregate_loss(entropy_tok, mask, s.loss_agg, denom)
        n_tok = jnp.sum(mask)
        sums = {"pg_loss": pg, "entropy": entropy}
        sums |= {k: v * n_tok for k, v in m.items()}  # masked means -> masked sums
        sums |= _staleness_sums(s, lp, old, mb)
        loss = pg - s.entropy_coef * entropy
        if not self.kl_in_reward:  # verl's use_kl_loss, Tunix's GRPO beta: not duration-weighted, as the entropy
            kl = core.aggregate_loss(core.kl_penalty(lp, mb["ref_logprobs"], s.kl_estimator), mask, s.loss_agg, denom)
            sums["kl_loss"] = kl
            loss = loss + s.kl_coef * kl
        return loss, sums

    def value_loss(self, s: PPOSettings, values: Array, mb: Mapping[str, Array], denom: Array) -> tuple[Array, dict]:
        """The critic's loss of a micro-batch (values [b, T] under the critic being trained) and its sums. Only an
        objective with `critic = True` is asked for it (the update builds no critic otherwise): it must define it."""
        raise TypeError(f"{type(self).__name__} sets critic = {self.critic} but defines no value_loss")


def _staleness_sums(s: PPOSettings, lp: Array, old: Array, mb: Mapping[str, Array]) -> dict[str, Array]:
    """Clipped tokens, tokens and behaviour-weight sums of the slow samples (Δt above their task's mean in the batch)
    and of the fast ones: whether the clip (or the weight) silences the slow programs the duration weights exist for."""
    mask = mb["mask"]
    ratio = jnp.exp(jnp.clip(lp - old, -20.0, 20.0))
    clipped = core.clip_active(ratio, mb["advantages"], s.clip_ratio) * mask
    out = {}
    for name, rows in (("slow", mb["slow"]), ("fast", 1.0 - mb["slow"])):
        out[f"stale_tokens_{name}"] = jnp.sum(mask * rows[:, None])
        out[f"stale_clipped_{name}"] = jnp.sum(clipped * rows[:, None])
        if s.decoupled:
            w = core.behaviour_weights(mb["prox_logprobs"], mb["old_logprobs"], s.behaviour_weight_cap)
            out[f"stale_weight_{name}"] = jnp.sum(w * mask * rows[:, None])
    return out


class PPO(Objective):
    """The paper's PPO (verl's): KL penalty in the token rewards, a critic, GAE, advantages whitened over the batch
    (over each task's samples in a batch that mixes tasks)."""

    critic = True
    kl_in_reward = True

    def advantages(self, s, batch, mask, behaviour_lp, ref_lp, values):
        tok_rewards, kl = core.token_rewards(batch["rewards"], mask, behaviour_lp, ref_lp, s.kl_coef, s.kl_estimator)
        advantages, returns = core.gae(tok_rewards, values, mask, s.gamma, s.lam)
        if s.whiten_advantages:  # within each task: one task's reward scale must not drown another's
            advantages = core.task_masked_whiten(advantages, mask, batch.get("task_ids"))
        return {"advantages": advantages, "returns": returns, "kl": kl}

    def value_loss(self, s, values, mb, denom):
        vl, m = core.value_loss(values, mb["old_values"], mb["returns"], mb["mask"], s.value_clip, s.loss_agg, denom)
        return vl, {"vf_loss": vl, "vf_clipfrac": m["vf_clipfrac"] * jnp.sum(mb["mask"])}


class GroupObjective(Objective):
    """Critic-free: each sample's advantage is its reward against its group's (`advantages.group_advantages`), the
    same on every response token, not whitened; the KL to the reference is a loss term."""

    needs_groups = True

    def __init__(self, estimator: str):
        self.estimator = estimator

    def advantages(self, s, batch, mask, behaviour_lp, ref_lp, values):
        per_sample = group_advantages(batch["rewards"], batch["group_ids"], self.estimator)
        kl = core.kl_penalty(behaviour_lp, ref_lp, s.kl_estimator) * mask
        return {"advantages": per_sample[:, None] * mask, "kl": kl}


OBJECTIVES: dict[str, Objective] = {
    "ppo": PPO(),
    "grpo": GroupObjective("grpo"),
    "dr_grpo": GroupObjective("dr_grpo"),
    "rloo": GroupObjective("rloo"),
}


def get(name: str) -> Objective:
    """The objective `name` (config.learner.algorithm); ValueError naming the choices."""
    if name not in OBJECTIVES:
        raise ValueError(f"learner.algorithm must be one of {tuple(OBJECTIVES)}, got {name!r}")
    return OBJECTIVES[name]


def group_size_problem(name: str, group_size: int) -> str | None:
    """Why the objective `name` learns nothing from groups of `group_size` samples (one line naming the flag to
    set), or None: a group objective needs two samples of a prompt to compare, and gives a group of one advantage 0.
    The run's settings and the learning experiment's arms both ask it."""
    if get(name).needs_groups and group_size < 2:
        return (
            f"{name} needs --config.sampler.group_size >= 2, e.g. --config.sampler.group_size=4 (a group of one "
            f"sample has advantage 0 and nothing to learn from)"
        )
    return None


def has_critic(name: str) -> bool:
    """Whether the objective `name` trains a value model."""
    return get(name).critic
