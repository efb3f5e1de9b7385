"""The PPO-epochs measurement's drift: zero against the policy that sampled the batch, growing as the policy
moves away from it."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mle_jax.experiments.ppo_epochs import drift
from mle_jax.rl import core
from tests.rl.tiny import make_models, random_batch


def _behaviour(model, batch, temperature):
    logits = model(jnp.asarray(batch.tokens), attention_mask=jnp.asarray(batch.attention_mask))
    lp = np.asarray(core.token_logprobs(logits, jnp.asarray(batch.tokens), temperature), np.float32)
    return dataclasses.replace(batch, behaviour_logprobs=lp * batch.response_mask)


def test_drift_is_zero_for_the_behaviour_policy_and_grows_with_a_perturbation():
    policy, _ = make_models(0)
    batch = _behaviour(policy, random_batch(0), 0.7)
    same = drift(policy, batch, 0.7, 0.2)
    assert abs(same["kl_from_behaviour"]) < 1e-5 and same["outside_clip"] == 0.0
    moved = nnx.clone(policy)
    params = nnx.state(moved, nnx.Param)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    noisy = [p + 0.5 * jax.random.normal(k, p.shape, p.dtype) for p, k in zip(leaves, keys, strict=True)]
    nnx.update(moved, jax.tree.unflatten(tree, noisy))
    far = drift(moved, batch, 0.7, 0.2)
    assert far["outside_clip"] > 0.05 and far["kl_from_behaviour"] != same["kl_from_behaviour"]
