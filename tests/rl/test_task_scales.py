"""One policy over a mix of tasks (issue 22 §1): in a batch of two tasks with very different reward scales and run
times, the per-task advantage whitening and per-task duration weights give both tasks' samples a policy gradient
of the same order, where the whole-batch ones leave the small-scale task almost none.

The real objective (`objectives.PPO`: token rewards, GAE, whitening) and its actor loss, on the tiny random Qwen2
policy; the gradient of each task's samples alone is the loss with the other task's rows masked out (the two sum
to the whole batch's gradient, as the update's micro-batches do)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.rl import core, duration, objectives
from mle_jax.rl.settings import PPOSettings
from tests.rl.tiny import TINY, random_batch

pytestmark = pytest.mark.model

TASKS = np.array([0, 1, 0, 1, 0, 1, 0, 1])  # interleaved: task A (an AUC) and task B (minus a loss, or a failure)
REWARDS = np.array([0.60, -10.0, 0.62, -0.5, 0.61, -10.0, 0.605, -0.5], np.float32)
DURATIONS = np.array([1.5, 40.0, 2.5, 80.0, 2.0, 60.0, 3.0, 70.0], np.float32)  # A runs in seconds, B in a minute


def reversed_within(rewards: np.ndarray, task: int) -> np.ndarray:
    """The rewards with task `task`'s reversed among its samples (the task's mean and spread kept)."""
    out = rewards.copy()
    rows = np.nonzero(TASKS == task)[0]
    out[rows] = rewards[rows[::-1]]
    return out


@pytest.fixture(scope="module")
def grad_norms():
    """(whiten per task?, weigh per task?) -> {task: (|g|, |g - g'|)}: g the policy gradient of the task's samples
    alone; g' the same with the task's rewards reversed among its samples. |g - g'| is how much the task's rewards
    steer the update (|g| alone also counts a push that is the same for every sample of the task)."""
    policy = Qwen2ForCausalLM(TINY, rngs=nnx.Rngs(0))  # no critic: the actor's gradient only
    graphdef, params = nnx.split(policy, nnx.Param)
    batch = dataclasses.replace(random_batch(11), rewards=REWARDS, durations_s=DURATIONS, task_ids=TASKS)
    tokens, attn = jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask)
    mask = jnp.asarray(batch.response_mask, jnp.float32)
    s = PPOSettings(entropy_coef=0.0)
    objective = objectives.get("ppo")

    def logprobs(p):
        return core.token_logprobs(nnx.merge(graphdef, p)(tokens, attention_mask=attn), tokens) * mask

    @jax.jit
    def norms(p, rewards, other_rewards, whiten_ids, weigh_ids, rows):
        lp0 = jax.lax.stop_gradient(logprobs(p))  # on-policy: ratio 1, no token clipped
        # a critic that has learned each task's mean reward: what is left is each task's own spread
        values = core.task_means(rewards, jnp.asarray(TASKS))[:, None] * mask
        weights = duration.duration_weights(jnp.asarray(DURATIONS), s.duration_weights, task_ids=weigh_ids)

        def loss(p, r):
            adv = objective.advantages(s, {"rewards": r, "task_ids": whiten_ids}, mask, lp0, lp0, values)
            mb = {"mask": mask * rows[:, None], "old_logprobs": lp0, "advantages": adv["advantages"],
                  "weights": weights, "slow": jnp.zeros(len(TASKS))}  # fmt: skip
            return objective.policy_loss(s, logprobs(p) * mb["mask"], jnp.zeros_like(mask), mb, jnp.sum(mask))[0]

        g, g_other = jax.grad(loss)(p, rewards), jax.grad(loss)(p, other_rewards)
        return optax.tree.norm(g), optax.tree.norm(jax.tree.map(jnp.subtract, g, g_other))

    out = {}
    for whiten_per_task in (True, False):
        for weigh_per_task in (True, False):
            ids = [TASKS if per_task else np.zeros_like(TASKS) for per_task in (whiten_per_task, weigh_per_task)]
            out[whiten_per_task, weigh_per_task] = {
                k: tuple(
                    map(
                        float,
                        norms(params, REWARDS, reversed_within(REWARDS, k), *ids, (TASKS == k).astype(np.float32)),
                    )
                )
                for k in (0, 1)
            }
    return out


def test_per_task_scales_give_both_tasks_a_gradient_of_the_same_order(grad_norms):
    (a, a_steer), (b, b_steer) = grad_norms[True, True][0], grad_norms[True, True][1]
    assert 0.1 < a / b < 10.0, (a, b)
    assert 0.1 < a_steer / b_steer < 10.0, (a_steer, b_steer)


def test_whole_batch_whitening_leaves_the_small_scale_task_rewards_almost_no_say(grad_norms):
    # A's rewards spread by 0.02, B's by 9.5: whitened together, A's advantages differ by ~1/500 of B's
    (_, a_steer), (_, b_steer) = grad_norms[False, True][0], grad_norms[False, True][1]
    assert a_steer / b_steer < 0.02, (a_steer, b_steer)
    assert grad_norms[True, True][0][1] > 20 * a_steer


def test_whole_batch_duration_weights_shrink_the_fast_task(grad_norms):
    # whitened per task, Δt divided by the whole batch's mean (~32 s): A's programs (~2 s) all get weights ~0.07
    (a, _), (b, _) = grad_norms[True, False][0], grad_norms[True, False][1]
    (a_task, _), (b_task, _) = grad_norms[True, True][0], grad_norms[True, True][1]
    assert a / b < 0.2 * (a_task / b_task), (a, b, a_task, b_task)
