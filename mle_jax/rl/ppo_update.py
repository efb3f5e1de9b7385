"""The PPO update as one pure function of (state, reference params, batch): what `Learner` jits.

Inside ONE function: reference logprobs and critic values (forward passes over micro-batches), token
rewards (terminal reward minus the KL penalty to the frozen reference), GAE, optional advantage
whitening, duration weights, then PPO epochs x shuffled mini-batches x micro-batches with gradient
accumulation and one optimizer step per mini-batch for the policy and for the critic. The epochs'
shuffling draws from a key derived from the seed and the state's step (as big_vision does), so a resumed
run draws the same permutations without carrying an RNG in its checkpoint.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mle_jax import sharding as shd
from mle_jax.rl import ppo

Nested = dict[str, Any]
BATCH_KEYS = ("tokens", "attention_mask", "response_mask", "behaviour_logprobs", "rewards", "durations_s")


@struct.dataclass
class TrainState:
    """Everything the update changes. Params are nested dicts (see ParamTree)."""

    step: jax.Array  # [] int32, number of updates done
    policy: Nested
    value: Nested
    policy_opt: Any
    value_opt: Any


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


def split_micro(x: jax.Array, n: int) -> jax.Array:
    """[B, ...] -> [n, B // n, ...]; chunk k holds rows k, k + n, k + 2n, ... so that every chunk is spread
    evenly over the devices that hold contiguous blocks of the batch dimension."""
    b = x.shape[0]
    return jnp.swapaxes(x.reshape(b // n, n, *x.shape[1:]), 0, 1)


def merge_micro(x: jax.Array) -> jax.Array:
    """Inverse of split_micro: [n, m, ...] -> [m * n, ...]."""
    return jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _constrain(tree: Any, mesh: Mesh, leading: int) -> Any:
    """Shard dimension `leading` of every leaf over the batch axes (keeps micro-batches spread out)."""

    def one(x):
        spec = [None] * x.ndim
        spec[leading] = shd.BATCH_AXES
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))

    return jax.tree.map(one, tree)


def ppo_update(
    state: TrainState,
    ref_params: Nested,
    batch: Mapping[str, jax.Array],
    *,
    s: PPOSettings,
    seed: int,
    policy_apply: Callable[[Nested, jax.Array, jax.Array], jax.Array],
    policy_head: Callable[[Nested, jax.Array], jax.Array],
    value_apply: Callable[[Nested, jax.Array, jax.Array], jax.Array],
    policy_tx: optax.GradientTransformation,
    value_tx: optax.GradientTransformation,
    mesh: Mesh,
    ref_device_shardings: Any = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One PPO update on a batch of B samples (pure; jitted by Learner).

    batch: tokens, attention_mask, response_mask, behaviour_logprobs [B, T]; rewards, durations_s [B].
    policy_apply(params, tokens, attention_mask) -> final hidden states [b, T, D]; policy_head(params, h [b, c, D])
    -> logits [b, c, V] float32 (applied `s.logits_chunk` positions at a time: the [b, T, V] logits are never
    live); value_apply(params, tokens, attention_mask) -> values [b, T].
    seed: with state.step, the key of this update's mini-batch shuffling.
    Returns the new state and scalar metrics.
    """
    rng = jax.random.fold_in(jax.random.key(seed), state.step)
    b = batch["tokens"].shape[0]
    mini = min(s.mini_batch_size, b)
    micro = min(s.micro_batch_size, mini)
    n_mini, n_micro = b // mini, mini // micro
    mask = batch["response_mask"].astype(jnp.float32)
    behaviour_lp = batch["behaviour_logprobs"] * mask
    if ref_device_shardings is not None:  # reference kept in host memory: bring it over for this update
        ref_params = jax.tree.map(jax.device_put, ref_params, ref_device_shardings)

    # ---- forward passes with the frozen reference and the critic, micro-batch by micro-batch
    def logprobs_entropy(params, tokens, attention_mask):
        hidden = policy_apply(params, tokens, attention_mask)
        head = functools.partial(policy_head, params)
        return ppo.chunked_logprobs_entropy(hidden, tokens, head, s.temperature, s.logits_chunk)

    def score(mb):
        ref_lp, _ = logprobs_entropy(ref_params, mb["tokens"], mb["attention_mask"])
        values = ppo.shift_right(value_apply(state.value, mb["tokens"], mb["attention_mask"]))
        return ref_lp, values.astype(jnp.float32)

    fwd_in = {k: split_micro(batch[k], b // micro) for k in ("tokens", "attention_mask")}
    ref_lp, values = jax.lax.map(score, _constrain(fwd_in, mesh, 1))
    ref_lp, values = merge_micro(ref_lp) * mask, merge_micro(values) * mask

    # ---- rewards, advantages, duration weights over the whole batch
    tok_rewards, kl = ppo.token_rewards(batch["rewards"], mask, behaviour_lp, ref_lp, s.kl_coef, s.kl_estimator)
    advantages, returns = ppo.gae(tok_rewards, values, mask, s.gamma, s.lam)
    if s.whiten_advantages:
        advantages = ppo.masked_whiten(advantages, mask)
    weights = ppo.duration_weights(batch["durations_s"], s.duration_weights, s.duration_max_weight, s.min_duration_s)
    data = {
        "tokens": batch["tokens"],
        "attention_mask": batch["attention_mask"],
        "mask": mask,
        "old_logprobs": behaviour_lp,
        "old_values": values,
        "advantages": advantages,
        "returns": returns,
        "weights": weights,
    }

    def policy_loss_fn(params, mb, denom):
        lp, entropy_tok = logprobs_entropy(params, mb["tokens"], mb["attention_mask"])
        lp = lp * mb["mask"]
        pg, m = ppo.policy_loss(
            lp, mb["old_logprobs"], mb["advantages"], mb["mask"], mb["weights"],
            s.clip_ratio, s.dual_clip, s.loss_agg, denom,
        )  # fmt: skip
        entropy = ppo.aggregate_loss(entropy_tok, mb["mask"], s.loss_agg, denom)
        n_tok = jnp.sum(mb["mask"])
        sums = {"pg_loss": pg, "entropy": entropy}
        sums |= {k: v * n_tok for k, v in m.items()}  # masked means -> masked sums
        return pg - s.entropy_coef * entropy, sums

    def value_loss_fn(params, mb, denom):
        v = ppo.shift_right(value_apply(params, mb["tokens"], mb["attention_mask"]).astype(jnp.float32))
        vl, m = ppo.value_loss(v, mb["old_values"], mb["returns"], mb["mask"], s.value_clip, s.loss_agg, denom)
        return vl, {"vf_loss": vl, "vf_clipfrac": m["vf_clipfrac"] * jnp.sum(mb["mask"])}

    def minibatch_step(st: TrainState, mb_data):
        if s.loss_agg == "token-mean":
            denom = jnp.sum(mb_data["mask"])
        else:
            denom = jnp.sum(jnp.any(mb_data["mask"] > 0, axis=-1)).astype(jnp.float32)
        micros = _constrain(jax.tree.map(lambda x: split_micro(x, n_micro), mb_data), mesh, 1)

        def micro_step(acc, mb):
            pg_grads, p_sums = jax.grad(policy_loss_fn, has_aux=True)(st.policy, mb, denom)
            v_grads, v_sums = jax.grad(value_loss_fn, has_aux=True)(st.value, mb, denom)
            acc = jax.tree.map(jnp.add, acc, (pg_grads, v_grads))
            return acc, p_sums | v_sums

        zeros = jax.tree.map(jnp.zeros_like, (st.policy, st.value))
        (pg_grads, v_grads), sums = jax.lax.scan(micro_step, zeros, micros)
        sums = jax.tree.map(jnp.sum, sums)
        n_tok = jnp.maximum(jnp.sum(mb_data["mask"]), 1.0)
        p_upd, p_opt = policy_tx.update(pg_grads, st.policy_opt, st.policy)
        v_upd, v_opt = value_tx.update(v_grads, st.value_opt, st.value)
        st = st.replace(
            policy=optax.apply_updates(st.policy, p_upd),
            value=optax.apply_updates(st.value, v_upd),
            policy_opt=p_opt,
            value_opt=v_opt,
        )
        metrics = {
            "actor/pg_loss": sums["pg_loss"],
            "actor/entropy": sums["entropy"],
            "actor/clipfrac": sums["clipfrac"] / n_tok,
            "actor/ppo_kl": sums["approx_kl"] / n_tok,
            "actor/ratio": sums["ratio"] / n_tok,
            "actor/grad_norm": optax.tree.norm(pg_grads),
            "critic/vf_loss": sums["vf_loss"],
            "critic/vf_clipfrac": sums["vf_clipfrac"] / n_tok,
            "critic/grad_norm": optax.tree.norm(v_grads),
        }
        return st, metrics

    def epoch(st: TrainState, epoch_rng):
        order = jax.random.permutation(epoch_rng, b) if s.shuffle else jnp.arange(b)
        shuffled = jax.tree.map(lambda x: jnp.take(x, order, axis=0), data)
        minis = jax.tree.map(lambda x: split_micro(x, n_mini), shuffled)
        return jax.lax.scan(minibatch_step, st, minis)

    state, metrics = jax.lax.scan(epoch, state, jax.random.split(rng, s.epochs))
    metrics = jax.tree.map(jnp.mean, metrics)
    n_tokens = jnp.sum(mask)
    seq_any = jnp.any(mask > 0, axis=-1)
    metrics |= {
        "rollout/reward_mean": jnp.mean(batch["rewards"]),
        "rollout/kl_ref": jnp.sum(kl) / jnp.maximum(n_tokens, 1.0),
        "rollout/response_length": jnp.mean(jnp.sum(mask, axis=-1)),
        "rollout/advantages_mean": jnp.sum(advantages) / jnp.maximum(n_tokens, 1.0),
        "rollout/returns_mean": jnp.sum(returns) / jnp.maximum(n_tokens, 1.0),
        "critic/values_mean": jnp.sum(values) / jnp.maximum(n_tokens, 1.0),
        "duration/mean_s": jnp.mean(batch["durations_s"]),
        "duration/weight_max": jnp.max(weights),
        "duration/weight_min": jnp.min(weights),
        "rollout/empty_responses": jnp.sum(~seq_any).astype(jnp.float32),
    }
    return state.replace(step=state.step + 1), metrics
