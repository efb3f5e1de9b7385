"""The learner's jitted, micro-batched update against a plain full-batch PPO step written out by hand."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.value import Qwen2ValueModel
from mle_jax.rl import core, duration
from mle_jax.rl.learner import Learner
from mle_jax.rl.update import merge_micro, split_micro
from tests.rl.tiny import TINY, learner_config, linear_adam, make_models, mesh, params_digest, random_batch

pytestmark = pytest.mark.model


def reference_step(cfg, policy, value, batch, task_ids=None):
    """One PPO epoch on one mini-batch = the whole batch, no micro-batching: the textbook update. With task_ids [B],
    advantages whitened and Δt divided by their mean within each task."""
    s = cfg.ppo
    ref = nnx.clone(policy)
    tokens, attn = jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask)
    mask = jnp.asarray(batch.response_mask, jnp.float32)
    blp = jnp.asarray(batch.behaviour_logprobs)
    ref_lp = core.token_logprobs(ref(tokens, attention_mask=attn), tokens) * mask
    values = core.shift_right(value(tokens, attention_mask=attn)) * mask
    tok_r, _ = core.token_rewards(jnp.asarray(batch.rewards), mask, blp, ref_lp, s.kl_coef, s.kl_estimator)
    adv, ret = core.gae(tok_r, values, mask, s.gamma, s.lam)
    adv = core.task_masked_whiten(adv, mask, task_ids)
    w = duration.duration_weights(
        jnp.asarray(batch.durations_s), s.duration_weights, s.duration_max_weight, task_ids=task_ids
    )

    def policy_objective(model):
        logits = model(tokens, attention_mask=attn)
        lp = core.token_logprobs(logits, tokens) * mask
        pg, _ = core.policy_loss(lp, blp, adv, mask, w, s.clip_ratio, s.dual_clip, s.loss_agg)
        ent = core.masked_mean(core.shift_right(core.entropy_from_logits(logits)), mask)
        return pg - s.entropy_coef * ent

    def value_objective(model):
        v = core.shift_right(model(tokens, attention_mask=attn))
        return core.value_loss(v, values, ret, mask, s.value_clip, s.loss_agg)[0]

    out = []
    for model, objective, lr in ((policy, policy_objective, cfg.optim.actor_lr),
                                 (value, value_objective, cfg.optim.critic_lr)):  # fmt: skip
        params = nnx.state(model, nnx.Param)
        loss, grads = nnx.value_and_grad(objective)(model)
        tx = cfg.optim.optimizer(lr)
        updates, _ = tx.update(grads, tx.init(params), params)
        new_params = jax.tree.leaves(jax.tree.map(jnp.add, params, updates))
        out.append((float(loss), float(optax.tree.norm(grads)), new_params))
    return out


def test_split_merge_micro_roundtrip():
    x = jnp.arange(24).reshape(12, 2)
    parts = split_micro(x, 3)
    assert parts.shape == (3, 4, 2)
    np.testing.assert_array_equal(np.asarray(parts[1, :, 0]), [2, 8, 14, 20])  # rows 1, 4, 7, 10
    np.testing.assert_array_equal(np.asarray(merge_micro(parts)), np.asarray(x))


def test_update_equals_full_batch_ppo_step():
    cfg = learner_config(micro_batch_size=2)  # 4 micro-batches accumulated into one mini-batch
    # Adam's first step is lr * g / (|g| + eps): with the default eps it is ~lr * sign(g), blind to the
    # gradient's scale and noisy for g ~ 1e-9. A large eps makes it ~lr * g, so params check the gradient.
    cfg = linear_adam(cfg)
    policy, value = make_models(0)
    learner = Learner(cfg, policy, value, mesh=mesh())
    batch = random_batch(1)
    expected = reference_step(cfg, *make_models(0), batch)
    metrics = learner.update(batch)
    (p_loss, p_norm, p_params), (v_loss, v_norm, v_params) = expected
    got_policy = jax.tree.leaves(learner.policy_state())
    got_value = jax.tree.leaves(learner.value_tree.to_state(learner.state.value))
    assert len(got_policy) == len(p_params) and len(got_value) == len(v_params)
    for got, want in zip(got_policy + got_value, p_params + v_params, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["actor/grad_norm"], p_norm, rtol=1e-4)
    np.testing.assert_allclose(metrics["critic/grad_norm"], v_norm, rtol=1e-4)
    np.testing.assert_allclose(metrics["actor/pg_loss"] - 0.01 * metrics["actor/entropy"], p_loss, rtol=1e-4)
    np.testing.assert_allclose(metrics["critic/vf_loss"], v_loss, rtol=1e-4)
    assert metrics["learner/step"] == 1.0 and learner.step == 1
    # the initial weights moved (the comparison above is not trivially true)
    init = jax.tree.leaves(nnx.state(make_models(0)[0], nnx.Param))
    assert max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(got_policy, init, strict=True)) > 1e-3


def test_update_of_two_tasks_whitens_and_weighs_within_each_task():
    """A batch mixing a task of small rewards and short runs with one of large rewards and long runs: the update
    equals the full-batch step with per-task whitening and duration weights, not the whole-batch one."""
    cfg = linear_adam(learner_config(micro_batch_size=2))
    batch = random_batch(1)
    tasks = np.array([0, 1, 1, 0, 1, 0, 0, 1])
    rewards = np.where(tasks == 1, batch.rewards * 5.0 - 5.0, batch.rewards * 0.01 + 0.6)
    durations = np.where(tasks == 1, 30.0, 1.0) * np.array([1.0, 2.0, 1.5, 3.0, 0.5, 2.0, 1.5, 1.0])
    batch = dataclasses.replace(batch, rewards=rewards, durations_s=np.maximum(durations, 1.0), task_ids=tasks * 3)
    learner = Learner(cfg, *make_models(0), mesh=mesh())
    metrics = learner.update(batch)
    per_task = reference_step(cfg, *make_models(0), batch, task_ids=jnp.asarray(batch.task_ids))
    whole = reference_step(cfg, *make_models(0), batch)
    got = jax.tree.leaves(learner.policy_state()) + jax.tree.leaves(learner.value_tree.to_state(learner.state.value))
    want, other = per_task[0][2] + per_task[1][2], whole[0][2] + whole[1][2]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(metrics["actor/grad_norm"], per_task[0][1], rtol=1e-4)
    assert abs(per_task[0][1] - whole[0][1]) > 0.05 * whole[0][1]  # the per-task scales change the step
    assert max(float(np.abs(np.asarray(g) - np.asarray(o)).max()) for g, o in zip(got, other, strict=True)) > 1e-3
    w = duration.duration_weights(jnp.asarray(batch.durations_s), "batch_mean", task_ids=jnp.asarray(tasks))
    assert metrics["duration/weight_max"] == pytest.approx(float(jnp.max(w)), rel=1e-6)
    assert metrics["duration/weight_min"] == pytest.approx(float(jnp.min(w)), rel=1e-6)


def test_equal_durations_are_plain_ppo_and_host_reference_is_the_same():
    """batch_mean weights with equal Δt == weights off, bit for bit (reference held in host memory for the
    second learner: same numbers); unequal Δt then make the two differ."""
    weighted = Learner(learner_config(duration_weights="batch_mean"), *make_models(3), mesh=mesh())
    cfg_off = dataclasses.replace(learner_config(duration_weights="off"), reference_on_host=True)
    plain = Learner(cfg_off, *make_models(3), mesh=mesh())
    assert all(x.sharding.memory_kind == "pinned_host" for x in jax.tree.leaves(plain.reference))
    equal = random_batch(5, equal_durations=True)
    m_w, m_p = weighted.update(equal), plain.update(equal)
    assert params_digest(weighted.state) == params_digest(plain.state)
    assert m_w["actor/pg_loss"] == m_p["actor/pg_loss"] and m_w["duration/weight_max"] == 1.0
    unequal = random_batch(6)
    weighted.update(unequal)
    plain.update(unequal)
    assert params_digest(weighted.state.policy) != params_digest(plain.state.policy)
    # the critic's loss is not duration-weighted: the same critic update either way
    assert params_digest(weighted.state.value) == params_digest(plain.state.value)


def test_state_dict_roundtrip_policy_state_and_errors():
    cfg = learner_config()
    a = Learner(cfg, *make_models(0), mesh=mesh())
    b = Learner(cfg, *make_models(7), mesh=mesh())
    a.update(random_batch(2))
    b.load_state_dict(a.state_dict())
    assert params_digest(a.state) == params_digest(b.state) and b.step == 1
    # policy_state() drops into a fresh model (what Sampler.sync does)
    fresh, _ = make_models(9)
    nnx.update(fresh, a.policy_state())
    tokens = jnp.asarray(random_batch(3).tokens)
    np.testing.assert_allclose(np.asarray(fresh(tokens)), np.asarray(a.policy_model()(tokens)), rtol=1e-6)
    # a bf16 model: the learner keeps float32 master params, hands the sampler bf16 ones
    policy16 = Qwen2ForCausalLM(TINY, rngs=nnx.Rngs(0), dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    l16 = Learner(cfg, policy16, Qwen2ValueModel(TINY, rngs=nnx.Rngs(1), param_dtype=jnp.bfloat16), mesh())
    assert {x.dtype for x in jax.tree.leaves(l16.state.policy)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(l16.policy_state())} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(l16.policy_state(model_dtypes=False))} == {jnp.dtype(jnp.float32)}
    with pytest.raises(ValueError, match="multiple of ppo.mini_batch_size"):
        a.update(random_batch(4, b=12))
    with pytest.raises(KeyError, match="policy_opt"):
        a.load_state_dict({k: v for k, v in a.state_dict().items() if k != "policy_opt"})
    bad = learner_config(micro_batch_size=3)
    with pytest.raises(ValueError, match="micro_batch_size"):
        Learner(bad, *make_models(0), mesh=mesh()).check_batch(random_batch(1))
    with pytest.raises(ValueError, match="loss_agg"):
        learner_config(loss_agg="sum")
