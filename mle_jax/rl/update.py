"""The update as one pure function of (state, reference params, batch): what `Learner` jits.

Inside ONE function: reference logprobs, critic values (an objective with a critic) and proximal logprobs
(`ppo.decoupled`), as forward passes over micro-batches; the objective's advantages (rl/objectives.py: for PPO
token rewards with the KL penalty, GAE and whitening; for the group objectives the group-relative reward);
duration weights (each Δt against its own task's mean); then epochs x shuffled mini-batches x micro-batches with
gradient accumulation and one optimizer step per mini-batch for the policy and, with a critic, for the critic.
The epochs' shuffling draws from a key derived from the seed and the state's step (as big_vision does), so a
resumed run draws the same permutations without carrying an RNG in its checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mle_jax.infra import sharding as shd
from mle_jax.rl import core, duration
from mle_jax.rl.objectives import Objective
from mle_jax.rl.settings import PPOSettings

Nested = dict[str, Any]
BATCH_KEYS = (
    "tokens", "attention_mask", "response_mask", "behaviour_logprobs", "rewards", "durations_s", "group_ids",
    "task_ids",
)  # fmt: skip
SAMPLE_KEYS = ("rewards", "durations_s", "group_ids", "task_ids")  # the [B] entries of BATCH_KEYS; others [B, T]
INT_KEYS = ("tokens", "attention_mask", "response_mask", "group_ids", "task_ids")  # int32; the others float32


@struct.dataclass
class TrainState:
    """Everything the update changes. Params are nested dicts (see ParamTree). A critic-free objective has no
    value model: `value` and `value_opt` are None (no leaves: nothing allocated, sharded or checkpointed)."""

    step: jax.Array  # [] int32, number of updates done
    policy: Nested
    value: Nested | None
    policy_opt: Any
    value_opt: Any


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


def update_step(
    state: TrainState,
    ref_params: Nested,
    batch: Mapping[str, jax.Array],
    *,
    s: PPOSettings,
    seed: int,
    objective: Objective,
    policy_apply: Callable[[Nested, jax.Array, jax.Array], jax.Array],
    policy_head: Callable[[Nested], jax.Array],
    value_apply: Callable[[Nested, jax.Array, jax.Array], jax.Array] | None,
    policy_tx: optax.GradientTransformation,
    value_tx: optax.GradientTransformation | None,
    mesh: Mesh,
    ref_device_shardings: Any = None,
    policy_params: Callable[[Nested, Nested], Nested] | None = None,
    value_params: Callable[[Nested, Nested], Nested] | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One update of `objective` on a batch of B samples (pure; jitted by Learner).

    batch: tokens, attention_mask, response_mask, behaviour_logprobs [B, T]; rewards, durations_s, group_ids,
    task_ids [B].
    policy_apply(params, tokens, attention_mask) -> final hidden states [b, T, D]; policy_head(params) -> the head's
    weight [D, V] in the compute dtype (logits are formed `s.logits_chunk` positions at a time: the [b, T, V] logits
    are never live); value_apply(params, tokens, attention_mask) -> values [b, T] (None, with value_tx, when the
    objective has no critic).
    policy_params(trained, ref_params) -> the policy's params, value_params(trained, ref_params) -> the critic's, when
    what the state trains is not the model's params (LoRA: adapters over the frozen base, which is the reference,
    models/lora.py); None: the state holds the model's params.
    seed: with state.step, the key of this update's mini-batch shuffling.
    Returns the new state and scalar metrics.
    """
    critic = objective.critic
    rng = jax.random.fold_in(jax.random.key(seed), state.step)
    b = batch["tokens"].shape[0]
    mini = min(s.mini_batch_size, b)
    micro = min(s.micro_batch_size, mini)
    n_mini, n_micro = b // mini, mini // micro
    mask = batch["response_mask"].astype(jnp.float32)
    behaviour_lp = batch["behaviour_logprobs"] * mask
    if ref_device_shardings is not None:  # reference kept in host memory: bring it over for this update
        ref_params = jax.tree.map(jax.device_put, ref_params, ref_device_shardings)

    def policy_of(trained: Nested) -> Nested:
        return trained if policy_params is None else policy_params(trained, ref_params)

    def value_of(trained: Nested) -> Nested:
        return trained if value_params is None else value_params(trained, ref_params)

    # ---- forward passes with the frozen reference, the critic and (decoupled) the proximal policy, micro-batch
    # by micro-batch
    def logprobs_entropy(params, tokens, attention_mask):
        hidden = policy_apply(params, tokens, attention_mask)
        return core.chunked_logprobs_entropy(
            hidden, tokens, policy_head(params), s.temperature, s.logits_chunk, s.fused_logprobs
        )

    def score(mb):
        out = {"ref": logprobs_entropy(ref_params, mb["tokens"], mb["attention_mask"])[0]}
        if critic:
            values = core.shift_right(value_apply(value_of(state.value), mb["tokens"], mb["attention_mask"]))
            out["values"] = values.astype(jnp.float32)
        if s.decoupled:  # the proximal policy: the params at the start of this update
            out["prox"] = logprobs_entropy(policy_of(state.policy), mb["tokens"], mb["attention_mask"])[0]
        return out

    fwd_in = {k: split_micro(batch[k], b // micro) for k in ("tokens", "attention_mask")}
    scored = jax.tree.map(lambda x: merge_micro(x) * mask, jax.lax.map(score, _constrain(fwd_in, mesh, 1)))
    ref_lp, values = scored["ref"], scored.get("values")

    # ---- advantages (the objective's) and duration weights over the whole batch
    adv = objective.advantages(s, batch, mask, behaviour_lp, ref_lp, values)
    advantages, kl = adv["advantages"], adv["kl"]
    tasks = batch["task_ids"]  # duration weights and the slow flag are relative to the sample's own task
    weights = duration.duration_weights(
        batch["durations_s"], s.duration_weights, s.duration_max_weight, s.min_duration_s, task_ids=tasks
    )
    durations = batch["durations_s"].astype(jnp.float32)
    data = {
        "tokens": batch["tokens"],
        "attention_mask": batch["attention_mask"],
        "mask": mask,
        "old_logprobs": behaviour_lp,
        "advantages": advantages,
        "weights": weights,
        "slow": (durations > core.task_means(durations, tasks)).astype(jnp.float32),  # staleness metrics only
    }
    if critic:
        data |= {"old_values": values, "returns": adv["returns"]}
    if not objective.kl_in_reward:
        data["ref_logprobs"] = ref_lp
    if s.decoupled:
        data["prox_logprobs"] = scored["prox"]

    def policy_loss_fn(params, mb, denom):
        lp, entropy_tok = logprobs_entropy(policy_of(params), mb["tokens"], mb["attention_mask"])
        return objective.policy_loss(s, lp * mb["mask"], entropy_tok, mb, denom)

    def value_loss_fn(params, mb, denom):
        v = core.shift_right(value_apply(value_of(params), mb["tokens"], mb["attention_mask"]).astype(jnp.float32))
        return objective.value_loss(s, v, mb, denom)

    def minibatch_step(st: TrainState, mb_data):
        if s.loss_agg == "token-mean":
            denom = jnp.sum(mb_data["mask"])
        else:
            denom = jnp.sum(jnp.any(mb_data["mask"] > 0, axis=-1)).astype(jnp.float32)
        micros = _constrain(jax.tree.map(lambda x: split_micro(x, n_micro), mb_data), mesh, 1)
        trained = (st.policy, st.value) if critic else (st.policy,)

        def micro_step(acc, mb):
            pg_grads, sums = jax.grad(policy_loss_fn, has_aux=True)(st.policy, mb, denom)
            grads = (pg_grads,)
            if critic:
                v_grads, v_sums = jax.grad(value_loss_fn, has_aux=True)(st.value, mb, denom)
                grads, sums = (pg_grads, v_grads), sums | v_sums
            return jax.tree.map(jnp.add, acc, grads), sums

        zeros = jax.tree.map(jnp.zeros_like, trained)
        grads, sums = jax.lax.scan(micro_step, zeros, micros)
        sums = jax.tree.map(jnp.sum, sums)
        n_tok = jnp.maximum(jnp.sum(mb_data["mask"]), 1.0)
        pg_grads = grads[0]
        p_upd, p_opt = policy_tx.update(pg_grads, st.policy_opt, st.policy)
        st = st.replace(policy=optax.apply_updates(st.policy, p_upd), policy_opt=p_opt)
        metrics = {
            "actor/pg_loss": sums["pg_loss"],
            "actor/entropy": sums["entropy"],
            "actor/clipfrac": sums["clipfrac"] / n_tok,
            "actor/ppo_kl": sums["approx_kl"] / n_tok,
            "actor/ratio": sums["ratio"] / n_tok,
            "actor/grad_norm": optax.tree.norm(pg_grads),
        }
        if "kl_loss" in sums:
            metrics["actor/kl_loss"] = sums["kl_loss"]
        if critic:
            v_grads = grads[1]
            v_upd, v_opt = value_tx.update(v_grads, st.value_opt, st.value)
            st = st.replace(value=optax.apply_updates(st.value, v_upd), value_opt=v_opt)
            metrics |= {
                "critic/vf_loss": sums["vf_loss"],
                "critic/vf_clipfrac": sums["vf_clipfrac"] / n_tok,
                "critic/grad_norm": optax.tree.norm(v_grads),
            }
        metrics |= {k: v for k, v in sums.items() if k.startswith("stale_")}  # summed below, not averaged
        return st, metrics

    def epoch(st: TrainState, epoch_rng):
        order = jax.random.permutation(epoch_rng, b) if s.shuffle else jnp.arange(b)
        shuffled = jax.tree.map(lambda x: jnp.take(x, order, axis=0), data)
        minis = jax.tree.map(lambda x: split_micro(x, n_mini), shuffled)
        return jax.lax.scan(minibatch_step, st, minis)

    state, metrics = jax.lax.scan(epoch, state, jax.random.split(rng, s.epochs))
    stale = {k: jnp.sum(metrics.pop(k)) for k in [k for k in metrics if k.startswith("stale_")]}
    metrics = jax.tree.map(jnp.mean, metrics)
    metrics |= staleness_metrics(stale)
    n_tokens = jnp.sum(mask)
    seq_any = jnp.any(mask > 0, axis=-1)
    metrics |= {
        "rollout/reward_mean": jnp.mean(batch["rewards"]),
        "rollout/kl_ref": jnp.sum(kl) / jnp.maximum(n_tokens, 1.0),
        "rollout/response_length": jnp.mean(jnp.sum(mask, axis=-1)),
        "rollout/advantages_mean": jnp.sum(advantages) / jnp.maximum(n_tokens, 1.0),
        "duration/mean_s": jnp.mean(batch["durations_s"]),
        "duration/weight_max": jnp.max(weights),
        "duration/weight_min": jnp.min(weights),
        "rollout/empty_responses": jnp.sum(~seq_any).astype(jnp.float32),
    }
    if critic:
        metrics |= {
            "rollout/returns_mean": jnp.sum(adv["returns"]) / jnp.maximum(n_tokens, 1.0),
            "critic/values_mean": jnp.sum(values) / jnp.maximum(n_tokens, 1.0),
        }
    return state.replace(step=state.step + 1), metrics


def staleness_metrics(sums: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The update's slow/fast token sums (over every epoch and mini-batch; slow: Δt above its task's mean in the
    batch) -> `stale/clipfrac_{slow,fast}` (share of response tokens the clip cut off) and, decoupled,
    `stale/behaviour_weight_{slow,fast}` (mean weight); NaN where the batch has no such sample (each task's Δt all
    equal: none is slow)."""

    def mean(total: jax.Array, n: jax.Array) -> jax.Array:
        return jnp.where(n > 0, total / jnp.maximum(n, 1.0), jnp.nan)

    out = {}
    for name in ("slow", "fast"):
        n = sums[f"stale_tokens_{name}"]
        out[f"stale/clipfrac_{name}"] = mean(sums[f"stale_clipped_{name}"], n)
        if f"stale_weight_{name}" in sums:
            out[f"stale/behaviour_weight_{name}"] = mean(sums[f"stale_weight_{name}"], n)
    return out
