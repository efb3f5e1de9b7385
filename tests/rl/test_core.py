"""PPO math against plain numpy references and hand-computed cases."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mle_jax.rl import core, duration


def numpy_gae(rewards, values, mask, gamma, lam):
    """Textbook GAE on each row's response span only (the value after the last token is 0)."""
    adv = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        idx = np.nonzero(mask[b])[0]
        last = 0.0
        for j in reversed(range(len(idx))):
            t = idx[j]
            next_v = values[b, idx[j + 1]] if j + 1 < len(idx) else 0.0
            delta = rewards[b, t] + gamma * next_v - values[b, t]
            last = delta + gamma * lam * last
            adv[b, t] = last
    return adv, (adv + values) * mask


def random_masks(rng, b, t):
    mask = np.zeros((b, t), np.float32)
    for i in range(b):
        start = rng.integers(1, t // 2)
        end = rng.integers(start + 1, t + 1)
        mask[i, start:end] = 1
    return mask


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_matches_numpy(gamma, lam):
    rng = np.random.default_rng(0)
    b, t = 5, 12
    mask = random_masks(rng, b, t)
    rewards = rng.normal(size=(b, t)).astype(np.float32) * mask
    values = rng.normal(size=(b, t)).astype(np.float32)
    adv, ret = core.gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma, lam)
    ref_adv, ref_ret = numpy_gae(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(np.asarray(adv), ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ret), ref_ret, rtol=1e-5, atol=1e-5)


def test_gae_gamma_lambda_one_is_return_minus_value():
    """With γ = λ = 1 and only a terminal reward, A_t = R - V_t on every response token."""
    mask = np.array([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]], np.float32)
    rewards = np.array([2.0, -1.0], np.float32)
    tok = core.place_terminal_reward(jnp.asarray(rewards), jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(tok), [[0, 0, 0, 2, 0], [0, 0, 0, 0, -1]])
    values = np.arange(10, dtype=np.float32).reshape(2, 5) / 10
    adv, ret = core.gae(tok, jnp.asarray(values), jnp.asarray(mask), 1.0, 1.0)
    np.testing.assert_allclose(np.asarray(adv), (rewards[:, None] - values) * mask, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), rewards[:, None] * mask, atol=1e-6)


def test_kl_estimators_and_token_rewards():
    lp = jnp.array([[0.0, -1.0, -2.0]])
    ref = jnp.array([[0.0, -1.5, -1.0]])
    mask = jnp.array([[0.0, 1.0, 1.0]])
    k1 = core.kl_penalty(lp, ref, "k1")
    np.testing.assert_allclose(np.asarray(k1), [[0.0, 0.5, -1.0]], atol=1e-6)
    k3 = core.kl_penalty(lp, ref, "k3")
    # k3 = exp(ref - lp) - 1 - (ref - lp)
    expect = [np.exp(-0.5) - 1 + 0.5, np.exp(1.0) - 1 - 1.0]
    np.testing.assert_allclose(np.asarray(k3)[0, 1:], expect, rtol=1e-6)
    tr, kl = core.token_rewards(jnp.array([3.0]), mask, lp, ref, 0.1, "k1")
    np.testing.assert_allclose(np.asarray(tr), [[0.0, -0.05, 3.0 + 0.1]], atol=1e-6)
    np.testing.assert_allclose(np.asarray(kl), [[0.0, 0.5, -1.0]], atol=1e-6)
    with pytest.raises(ValueError, match="kl estimator"):
        core.kl_penalty(lp, ref, "k2")


def test_policy_loss_hand_computed():
    # two samples, two response tokens each
    old = jnp.log(jnp.array([[0.5, 0.5], [0.5, 0.5]]))
    new = jnp.log(jnp.array([[0.75, 0.5], [0.25, 0.5]]))  # ratios [[1.5, 1], [0.5, 1]]
    adv = jnp.array([[1.0, 2.0], [-1.0, -2.0]])
    mask = jnp.ones((2, 2))
    loss, m = core.policy_loss(new, old, adv, mask, clip_ratio=0.2)
    # token losses: max(-A r, -A clip(r)): [[-1.2, -2], [0.8, 2]] -> mean = -0.1
    np.testing.assert_allclose(float(loss), (-1.2 - 2 + 0.8 + 2) / 4, rtol=1e-6)
    np.testing.assert_allclose(float(m["clipfrac"]), 0.5, rtol=1e-6)
    # per-sample weights [2, 0]: only sample 0 counts, twice
    loss_w, _ = core.policy_loss(new, old, adv, mask, jnp.array([2.0, 0.0]), clip_ratio=0.2)
    np.testing.assert_allclose(float(loss_w), 2 * (-1.2 - 2) / 4, rtol=1e-6)
    # seq-mean-token-mean with unequal lengths
    mask2 = jnp.array([[1.0, 0.0], [1.0, 1.0]])
    loss_s, _ = core.policy_loss(new, old, adv, mask2, clip_ratio=0.2, loss_agg="seq-mean-token-mean")
    np.testing.assert_allclose(float(loss_s), (-1.2 + (0.8 + 2) / 2) / 2, rtol=1e-6)
    loss_t, _ = core.policy_loss(new, old, adv, mask2, clip_ratio=0.2, loss_agg="token-mean")
    np.testing.assert_allclose(float(loss_t), (-1.2 + 0.8 + 2) / 3, rtol=1e-6)


def test_dual_clip_caps_negative_advantage_loss():
    old = jnp.zeros((1, 1))
    new = jnp.log(jnp.array([[10.0]]))  # ratio 10
    adv = jnp.array([[-1.0]])
    mask = jnp.ones((1, 1))
    plain, _ = core.policy_loss(new, old, adv, mask, clip_ratio=0.2)
    np.testing.assert_allclose(float(plain), 10.0, rtol=1e-5)  # max(10, 1.2)
    dual, _ = core.policy_loss(new, old, adv, mask, clip_ratio=0.2, dual_clip=3.0)
    np.testing.assert_allclose(float(dual), 3.0, rtol=1e-5)
    with pytest.raises(ValueError, match="dual_clip"):
        core.policy_loss(new, old, adv, mask, dual_clip=0.5)


def test_value_loss_hand_computed():
    values = jnp.array([[1.0, 0.0]])
    old = jnp.array([[0.0, 0.0]])
    returns = jnp.array([[2.0, 1.0]])
    mask = jnp.ones((1, 2))
    loss, m = core.value_loss(values, old, returns, mask, value_clip=0.5)
    # token 0: unclipped (1-2)^2 = 1, clipped (0.5-2)^2 = 2.25 -> 2.25; token 1: 1 and 1 -> 1
    np.testing.assert_allclose(float(loss), 0.5 * (2.25 + 1.0) / 2, rtol=1e-6)
    np.testing.assert_allclose(float(m["vf_clipfrac"]), 0.5)


def test_entropy_and_token_logprobs():
    logits = jnp.log(jnp.array([[[0.5, 0.25, 0.25], [1 / 3, 1 / 3, 1 / 3], [0.9, 0.05, 0.05]]]))
    ent = core.entropy_from_logits(logits)
    p = np.array([0.5, 0.25, 0.25])
    np.testing.assert_allclose(float(ent[0, 0]), -(p * np.log(p)).sum(), rtol=1e-6)
    np.testing.assert_allclose(float(ent[0, 1]), np.log(3), rtol=1e-6)
    tokens = jnp.array([[2, 1, 0]])
    lp = core.token_logprobs(logits, tokens)
    np.testing.assert_allclose(np.asarray(lp), [[0.0, np.log(0.25), np.log(1 / 3)]], rtol=1e-6)
    lp_t = core.token_logprobs(logits, tokens, temperature=0.5)
    ref = jax.nn.log_softmax(2 * logits[0, 0])[1]
    np.testing.assert_allclose(float(lp_t[0, 1]), float(ref), rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(core.shift_right(jnp.array([[1, 2, 3]]))), [[0, 1, 2]])


def test_fused_logprobs_in_bf16_match_autodiff():
    """With a bf16 head both backwards cast the logits' cotangent to bf16 before the head's GEMMs: the fused one
    gives autodiff's gradients within bf16 rounding, and its values exactly."""
    rng = np.random.default_rng(1)
    b, t, d, v = 2, 10, 16, 53
    hidden = jnp.asarray(rng.normal(size=(b, t, d)), jnp.bfloat16)
    w = jnp.asarray(rng.normal(size=(d, v)) * 0.3, jnp.bfloat16)
    tokens = jnp.asarray(rng.integers(0, v, size=(b, t)), jnp.int32)
    a = jnp.asarray(rng.normal(size=(2, b, t)), jnp.float32)

    def loss(fused):
        def f(h, w):
            lp, ent = core.chunked_logprobs_entropy(h, tokens, w, 0.7, 4, fused)
            return jnp.sum(lp * a[0]) + jnp.sum(ent * a[1]), (lp, ent)

        return jax.jit(jax.grad(f, argnums=(0, 1), has_aux=True))

    (gh_f, gw_f), out_f = loss(True)(hidden, w)
    (gh_a, gw_a), out_a = loss(False)(hidden, w)
    for x, y in zip(out_f, out_a, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)
    for gf, ga in ((gh_f, gh_a), (gw_f, gw_a)):
        assert gf.dtype == ga.dtype == jnp.bfloat16
        gf, ga = np.asarray(gf, np.float32), np.asarray(ga, np.float32)
        assert np.abs(gf - ga).max() <= 0.02 * np.abs(ga).max() and np.abs(ga).max() > 1e-2


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("chunk", [0, 1, 5, 12, 64])
def test_chunked_logprobs_entropy_equal_the_direct_computation(chunk, fused):
    """Chunked over the sequence (with padding when T is not a multiple, and the one-block path) = token_logprobs
    and shift_right(entropy_from_logits) of the full logits: values and the gradients wrt hidden and head, by the
    fused block's hand-written backward and by autodiff."""
    rng = np.random.default_rng(0)
    b, t, d, v, temp = 3, 12, 8, 37, 0.7
    hidden = jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(d, v)) * 0.3, jnp.float32)
    tokens = jnp.asarray(rng.integers(0, v, size=(b, t)), jnp.int32)
    a_lp = jnp.asarray(rng.normal(size=(b, t)), jnp.float32)
    a_ent = jnp.asarray(rng.normal(size=(b, t)), jnp.float32)

    def direct(h, w):
        logits = h @ w
        lp = core.token_logprobs(logits, tokens, temp)
        ent = core.shift_right(core.entropy_from_logits(logits / temp))
        return lp, ent

    def chunked(h, w):
        return core.chunked_logprobs_entropy(h, tokens, w, temp, chunk, fused)

    def loss(fn):
        return lambda h, w: jnp.sum(fn(h, w)[0] * a_lp) + jnp.sum(fn(h, w)[1] * a_ent)

    lp_d, ent_d = direct(hidden, w)
    lp_c, ent_c = chunked(hidden, w)
    assert lp_c.shape == ent_c.shape == (b, t)
    np.testing.assert_allclose(np.asarray(lp_c), np.asarray(lp_d), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent_c), np.asarray(ent_d), rtol=1e-5, atol=1e-5)
    assert float(jnp.max(jnp.abs(lp_d))) > 1.0 and float(jnp.mean(ent_d[:, 1:])) > 0.5  # non-trivial values
    g_d = jax.grad(loss(direct), argnums=(0, 1))(hidden, w)
    g_c = jax.jit(jax.grad(loss(chunked), argnums=(0, 1)))(hidden, w)
    for gd, gc in zip(g_d, g_c, strict=True):
        assert float(jnp.max(jnp.abs(gd))) > 1e-2
        np.testing.assert_allclose(np.asarray(gc), np.asarray(gd), rtol=1e-4, atol=1e-5)


def test_masked_whiten():
    x = jnp.array([[9.0, 1.0, 2.0, 3.0], [9.0, 4.0, 9.0, 9.0]])
    mask = jnp.array([[0, 1, 1, 1], [0, 1, 0, 0]], jnp.float32)
    w = np.asarray(core.masked_whiten(x, mask))
    vals = np.array([1.0, 2.0, 3.0, 4.0])
    expect = (vals - vals.mean()) / vals.std(ddof=1)
    np.testing.assert_allclose(w[mask > 0], expect, rtol=1e-5)
    assert np.all(w[np.asarray(mask) == 0] == 0)


def test_task_masked_whiten_whitens_each_task_with_its_own_mean_and_std():
    # rows 0 and 2 are task 7: tokens {1, 3, 5}, mean 3, unbiased var (4 + 0 + 4) / 2 = 4, std 2 -> -1, 0, 1
    # row 1 is task 2: tokens {100, 300}, mean 200, var (1e4 + 1e4) / 1 = 2e4, std 141.42 -> -0.7071, 0.7071
    x = jnp.array([[9.0, 1.0, 3.0], [9.0, 100.0, 300.0], [9.0, 5.0, 9.0]])
    mask = jnp.array([[0, 1, 1], [0, 1, 1], [0, 1, 0]], jnp.float32)
    tasks = jnp.array([7, 2, 7])
    w = np.asarray(core.task_masked_whiten(x, mask, tasks))
    want = np.array([[0.0, -1.0, 0.0], [0.0, -(0.5**0.5), 0.5**0.5], [0.0, 1.0, 0.0]])
    np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-6)
    # the whole-batch whitening puts task 7's tokens all near -0.6: the big task's spread swamps theirs
    whole = np.asarray(core.masked_whiten(x, mask))
    assert np.ptp(whole[[0, 0, 2], [1, 2, 1]]) < 0.05
    # shift_mean False adds each task's own mean back
    kept = np.asarray(core.task_masked_whiten(x, mask, tasks, shift_mean=False))
    np.testing.assert_allclose(kept, (want + np.array([[3.0], [200.0], [3.0]])) * np.asarray(mask), rtol=1e-5)
    # a task of one token gets 0, as masked_whiten gives a batch of one token
    lone = np.asarray(core.task_masked_whiten(x, mask, jnp.array([7, 2, 5])))
    assert lone[2, 1] == 0.0 and np.all(np.isfinite(lone))


def test_task_masked_whiten_of_one_task_is_masked_whiten_bit_for_bit():
    rng = np.random.default_rng(3)
    b, t = 9, 13
    mask = jnp.asarray(random_masks(rng, b, t))
    x = jnp.asarray(rng.normal(size=(b, t)) * 5.0 + 2.0, jnp.float32)
    for shift in (True, False):
        want = np.asarray(core.masked_whiten(x, mask, shift))
        assert np.array_equal(np.asarray(core.task_masked_whiten(x, mask, None, shift)), want)
        assert np.array_equal(np.asarray(core.task_masked_whiten(x, mask, jnp.full((b,), 4), shift)), want)
        jitted = jax.jit(lambda x, m, ids, s=shift: core.task_masked_whiten(x, m, ids, s))
        assert np.array_equal(np.asarray(jitted(x, mask, jnp.zeros(b, jnp.int32))), np.asarray(
            jax.jit(lambda x, m, s=shift: core.masked_whiten(x, m, s))(x, mask)))  # fmt: skip
    # two tasks: each task's rows whitened alone, wherever its rows are
    ids = jnp.asarray(rng.integers(0, 2, size=b))
    got = np.asarray(core.task_masked_whiten(x, mask, ids))
    for k in (0, 1):
        rows = np.asarray(ids) == k
        np.testing.assert_allclose(got[rows], np.asarray(core.masked_whiten(x[rows], mask[rows])), rtol=1e-5, atol=1e-6)


def test_duration_weights_per_task_hand_worked():
    # task 0: Δt 1, 3 (mean 2); task 1: Δt 10, 20, 30 (mean 20); task 2: Δt 5, 5 (no information)
    d = jnp.array([1.0, 10.0, 3.0, 20.0, 5.0, 30.0, 5.0])
    tasks = jnp.array([0, 1, 0, 1, 2, 1, 2])
    w = np.asarray(duration.duration_weights(d, "batch_mean", task_ids=tasks))
    np.testing.assert_allclose(w, [0.5, 0.5, 1.5, 1.0, 1.0, 1.5, 1.0], rtol=1e-6)
    assert w[4] == 1.0 and w[6] == 1.0  # a task's equal Δt: exactly ones for that task
    # the whole batch's mean (74 / 7) would call task 0's slower program (3 s) fast: weight 0.28
    assert np.asarray(duration.duration_weights(d, "batch_mean"))[2] < 0.3
    # clipped at 1.2 of the task's mean, then back to mean 1 within the task:
    # task 0: 0.5, 1.2 -> / 0.85; task 1: 0.5, 1.0, 1.2 -> / 0.9
    c = np.asarray(duration.duration_weights(d, "clipped", max_weight=1.2, task_ids=tasks))
    np.testing.assert_allclose(c, [0.5 / 0.85, 0.5 / 0.9, 1.2 / 0.85, 1.0 / 0.9, 1.0, 1.2 / 0.9, 1.0], rtol=1e-6)
    # log: task 0 log 2, log 4 -> mean 1.5 log 2 -> 2/3, 4/3; task 1 log 11, log 21, log 31 over their mean
    lg = np.asarray(duration.duration_weights(d, "log", task_ids=tasks))
    l1 = np.log([11.0, 21.0, 31.0]) / np.log([11.0, 21.0, 31.0]).mean()
    np.testing.assert_allclose(lg, [2 / 3, l1[0], 4 / 3, l1[1], 1.0, l1[2], 1.0], rtol=1e-6)
    for weights in (w, c, lg):  # mean 1 within each task
        for k in (0, 1, 2):
            np.testing.assert_allclose(weights[np.asarray(tasks) == k].mean(), 1.0, rtol=1e-6)
    # the floor applies before the task means: task 0's Δt 0 counts as 1 s
    f = np.asarray(
        duration.duration_weights(jnp.array([0.0, 3.0, 10.0]), task_ids=jnp.array([0, 0, 1]), min_duration_s=1)
    )
    np.testing.assert_allclose(f, [0.5, 1.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(core.task_means(d, tasks)), [2, 20, 2, 20, 5, 20, 5], rtol=1e-6)
    with pytest.raises(ValueError, match="task_ids must be"):
        duration.duration_weights(d, task_ids=jnp.zeros(3, jnp.int32))


@pytest.mark.parametrize("mode", ["off", "batch_mean", "clipped", "log"])
def test_duration_weights_of_one_task_are_the_whole_batch_weights_bit_for_bit(mode):
    d = jnp.asarray(np.random.default_rng(4).uniform(0.0, 90.0, size=11), jnp.float32)
    want = np.asarray(duration.duration_weights(d, mode, max_weight=2.0, min_duration_s=1.0))
    got = duration.duration_weights(d, mode, max_weight=2.0, min_duration_s=1.0, task_ids=jnp.full((11,), 3))
    assert np.array_equal(np.asarray(got), want)
    jit_whole = jax.jit(lambda d: duration.duration_weights(d, mode, 2.0, 1.0))
    jit_tasks = jax.jit(lambda d, ids: duration.duration_weights(d, mode, 2.0, 1.0, task_ids=ids))
    assert np.array_equal(np.asarray(jit_tasks(d, jnp.zeros(11, jnp.int32))), np.asarray(jit_whole(d)))
    if mode != "off":  # and the task ids do change the weights once there are two tasks
        two = np.asarray(jit_tasks(d, jnp.arange(11) % 2))
        assert not np.allclose(two, want)


def test_duration_weights_modes():
    d = jnp.array([1.0, 3.0, 8.0])
    np.testing.assert_array_equal(np.asarray(duration.duration_weights(d, "off")), [1, 1, 1])
    np.testing.assert_allclose(np.asarray(duration.duration_weights(d, "batch_mean")), [0.25, 0.75, 2.0], rtol=1e-6)
    c = np.asarray(duration.duration_weights(d, "clipped", max_weight=1.5))
    np.testing.assert_allclose(c, np.array([0.25, 0.75, 1.5]) / (2.5 / 3), rtol=1e-6)
    lg = np.asarray(duration.duration_weights(d, "log"))
    np.testing.assert_allclose(lg, np.log1p([1, 3, 8]) / np.log1p([1, 3, 8]).mean(), rtol=1e-6)
    for mode in ("batch_mean", "clipped", "log"):
        w = np.asarray(duration.duration_weights(jnp.array([0.1, 7.0, 2.5, 40.0]), mode, max_weight=2.0))
        np.testing.assert_allclose(w.mean(), 1.0, rtol=1e-6)
        # all-equal durations: exactly ones, bit for bit
        eq = np.asarray(duration.duration_weights(jnp.full((7,), 0.1), mode, max_weight=2.0))
        assert np.array_equal(eq, np.ones(7, np.float32))
        zero = np.asarray(duration.duration_weights(jnp.zeros(3), mode, max_weight=2.0))
        assert np.array_equal(zero, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="mode"):
        duration.duration_weights(d, "linear")
    with pytest.raises(ValueError, match="max_weight"):
        duration.duration_weights(d, "clipped")


def test_duration_floor_is_applied_before_the_weights():
    d = jnp.array([0.0, 0.5, 4.0])  # a response with no code (never ran), a fast run, a slow run
    w = np.asarray(duration.duration_weights(d, "batch_mean", min_duration_s=1.0))
    np.testing.assert_allclose(w, np.array([1.0, 1.0, 4.0]) / 2.0, rtol=1e-6)
    assert w[0] > 0  # without the floor the no-code sample would get weight 0 and never be pushed away
    assert np.asarray(duration.duration_weights(d, "batch_mean"))[0] == 0.0
    np.testing.assert_array_equal(np.asarray(duration.duration_weights(d, "off", min_duration_s=1.0)), [1, 1, 1])


def test_equal_durations_give_plain_ppo_exactly():
    rng = np.random.default_rng(1)
    b, t = 6, 9
    mask = jnp.asarray(random_masks(rng, b, t))
    new = jnp.asarray(rng.normal(size=(b, t)) * 0.1 - 1.0, jnp.float32)
    old = jnp.asarray(rng.normal(size=(b, t)) * 0.1 - 1.0, jnp.float32)
    adv = jnp.asarray(rng.normal(size=(b, t)), jnp.float32)

    def loss(new_lp, weights):
        return core.policy_loss(new_lp, old, adv, mask, weights, clip_ratio=0.2)[0]

    plain, g_plain = jax.value_and_grad(loss)(new, None)
    w = duration.duration_weights(jnp.full((b,), 37.3), "batch_mean")
    weighted, g_weighted = jax.value_and_grad(loss)(new, w)
    assert float(plain) == float(weighted)
    assert np.array_equal(np.asarray(g_plain), np.asarray(g_weighted))


def test_aggregate_loss_denominator_sums_microbatches():
    rng = np.random.default_rng(2)
    mask = jnp.asarray(random_masks(rng, 8, 10))
    x = jnp.asarray(rng.normal(size=(8, 10)), jnp.float32)
    for mode, denom in (("token-mean", jnp.sum(mask)), ("seq-mean-token-mean", 8.0)):
        full = core.aggregate_loss(x, mask, mode)
        parts = sum(core.aggregate_loss(x[i : i + 2], mask[i : i + 2], mode, denom) for i in range(0, 8, 2))
        np.testing.assert_allclose(float(parts), float(full), rtol=1e-5)


def test_decoupled_loss_without_staleness_is_plain_ppo_loss_and_gradient():
    """π_prox = π_behaviour (nothing stale): every behaviour weight is exactly 1 and the decoupled loss is PPO's,
    value and gradient, bit for bit (duration weights, dual clip and both aggregations included)."""
    rng = np.random.default_rng(3)
    b, t = 4, 7
    mask = jnp.asarray(random_masks(rng, b, t))
    behaviour = jnp.asarray(-rng.uniform(0.5, 3.0, size=(b, t)), jnp.float32) * mask
    lp = behaviour + jnp.asarray(rng.normal(scale=0.3, size=(b, t)), jnp.float32) * mask  # some tokens clip
    adv = jnp.asarray(rng.normal(size=(b, t)), jnp.float32) * mask
    w = jnp.asarray(rng.uniform(0.2, 3.0, size=b), jnp.float32)
    for agg in core.LOSS_AGGS:
        plain = lambda x, agg=agg: core.policy_loss(x, behaviour, adv, mask, w, 0.2, 3.0, agg)  # noqa: E731
        decoupled = lambda x, agg=agg: core.decoupled_policy_loss(x, behaviour, behaviour, adv, mask, w, 0.2, 3.0, agg)  # noqa: E731
        (l_p, m_p), g_p = jax.value_and_grad(plain, has_aux=True)(lp)
        (l_d, m_d), g_d = jax.value_and_grad(decoupled, has_aux=True)(lp)
        assert float(m_p["clipfrac"]) > 0  # the clip is at work in the comparison
        assert float(l_p) == float(l_d) and m_p == m_d
        np.testing.assert_array_equal(np.asarray(g_p), np.asarray(g_d))
    np.testing.assert_array_equal(np.asarray(core.behaviour_weights(behaviour, behaviour)), np.ones((b, t)))


def test_a_stale_token_clipped_by_plain_ppo_keeps_its_gradient_when_decoupled():
    """A token sampled versions ago, when the policy gave it probability 0.05; the policy at the start of the update
    gives it 0.2. With A > 0, plain PPO's ratio against the behaviour policy is 4 > 1 + ε: clipped, zero gradient.
    The decoupled loss clips around the proximal policy (ratio 1) and weights the token by min(4, cap)."""
    behaviour = jnp.log(jnp.array([[0.05]]))
    prox = jnp.log(jnp.array([[0.2]]))
    adv, mask = jnp.array([[1.0]]), jnp.ones((1, 1))
    plain_grad = jax.grad(lambda x: core.policy_loss(x, behaviour, adv, mask)[0])(prox)
    assert float(plain_grad[0, 0]) == 0.0
    for cap, weight in ((5.0, 4.0), (2.0, 2.0)):
        loss = lambda x, cap=cap: core.decoupled_policy_loss(x, prox, behaviour, adv, mask, weight_cap=cap)[0]  # noqa: E731
        grad = jax.grad(loss)(prox)
        # d/dx of -A · w · exp(x - prox) at x = prox: -A · w (w is a stop-gradient constant)
        np.testing.assert_allclose(float(grad[0, 0]), -weight, rtol=1e-5)
    # the weight does not pass a gradient to the proximal logprobs
    w_grad = jax.grad(lambda p: jnp.sum(core.behaviour_weights(p, behaviour)))(prox)
    assert float(w_grad[0, 0]) == 0.0
