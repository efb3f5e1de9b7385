"""The policy-gradient math every objective shares, as small pure functions (verl's core_algos, in jnp); the paper's
duration weights are in rl/duration.py.

Layout: every [B, T] array is aligned with `tokens[B, T]` (prompt + response, right-padded). A value
at [b, t] belongs to the token tokens[b, t]: its logprob was computed from the logits at t - 1 and
its value from the critic's output at t - 1 (the state before the token was generated). Only
positions where `response_mask` is 1 take part in any loss: one span per row, or one per response of an episode's
conversation (env/episodes.py), the observation tokens between them masked out (GAE carries across them).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import Array

from mle_jax.models.ops import dense, head_matmul, head_matmul_backward
from mle_jax.rl import groups

KL_ESTIMATORS = ("k1", "k3")
LOSS_AGGS = ("token-mean", "seq-mean-token-mean")


def masked_sum(x: Array, mask: Array, axis: int | None = None) -> Array:
    """sum(x * mask) over `axis` (all axes when None)."""
    return jnp.sum(x * mask, axis=axis)


def masked_mean(x: Array, mask: Array, axis: int | None = None) -> Array:
    """Mean of x over positions where mask is 1; 0 where the mask is empty."""
    total = jnp.sum(mask, axis=axis)
    return masked_sum(x, mask, axis) / jnp.maximum(total, 1)


def masked_whiten(x: Array, mask: Array, shift_mean: bool = True, eps: float = 1e-8) -> Array:
    """[B, T] -> [B, T]: (x - mean) / std over masked positions (unbiased variance, as verl).

    With shift_mean False the mean is added back (only the scale changes). Masked-out positions
    are returned as 0.
    """
    mean = masked_mean(x, mask)
    n = jnp.sum(mask)
    var = masked_sum(jnp.square(x - mean), mask) / jnp.maximum(n - 1, 1)
    out = (x - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out * mask


def task_means(x: Array, task_ids: Array | None) -> Array:
    """[B] values, [B] task ids -> [B]: each sample's task mean of x (over the samples with its id).

    task_ids None, or all equal: jnp.mean(x) at every position, bit for bit the whole batch's mean.
    """
    x = jnp.asarray(x, jnp.float32)
    whole = jnp.broadcast_to(jnp.mean(x), x.shape)
    if task_ids is None:
        return whole
    return jnp.where(groups.one_id(task_ids), whole, groups.id_mean(x, groups.same_id(task_ids)))


def task_masked_whiten(
    x: Array, mask: Array, task_ids: Array | None, shift_mean: bool = True, eps: float = 1e-8
) -> Array:
    """[B, T] x, [B, T] mask, [B] task ids -> [B, T]: `masked_whiten` within each task.

    Each task's masked tokens are shifted by that task's mean and divided by that task's std (unbiased, over the
    task's masked tokens), so a task whose returns spread by 0.01 (an AUC) gets advantages of the same scale as one
    spread by 10 (a failure against a score) in the same batch. shift_mean False adds each task's mean back; a task
    with fewer than two masked tokens gets 0 (as masked_whiten); masked-out positions are 0. task_ids None, or all
    equal: exactly masked_whiten(x, mask) (the whole batch's sums, so single-task PPO does not move by a rounding).
    """
    if task_ids is None:
        return masked_whiten(x, mask, shift_mean, eps)
    same = groups.same_id(task_ids)
    tokens = jnp.sum(mask, axis=1)  # [B] each row's masked tokens: the task's statistics pool them
    mean = groups.pooled_mean(masked_sum(x, mask, axis=1), tokens, same)
    centred = x - mean[:, None]
    var = groups.pooled_var(masked_sum(jnp.square(centred), mask, axis=1), tokens, same)
    out = centred * jax.lax.rsqrt(var + eps)[:, None]
    if not shift_mean:
        out = out + mean[:, None]
    return jnp.where(groups.one_id(task_ids), masked_whiten(x, mask, shift_mean, eps), out * mask)


def last_token_index(response_mask: Array) -> Array:
    """[B, T] 0/1 -> [B] index of the last response token (0 for an empty row)."""
    t = jnp.arange(response_mask.shape[-1])
    return jnp.max(jnp.where(response_mask > 0, t, 0), axis=-1)


def place_terminal_reward(rewards: Array, response_mask: Array) -> Array:
    """[B] scalar rewards -> [B, T] token rewards: reward on each row's last response token, 0 elsewhere."""
    last = last_token_index(response_mask)
    onehot = jax.nn.one_hot(last, response_mask.shape[-1], dtype=jnp.float32)
    has_response = jnp.any(response_mask > 0, axis=-1, keepdims=True)
    return rewards.astype(jnp.float32)[:, None] * onehot * has_response


def kl_penalty(logprobs: Array, ref_logprobs: Array, estimator: str = "k1") -> Array:
    """[B, T] per-token KL(π || π_ref) estimate from sampled tokens (Schulman's k1 / k3).

    k1 = log π - log π_ref (unbiased, can be negative); k3 = exp(-k1) - 1 + k1 (>= 0, low variance).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    k1 = logprobs - ref_logprobs
    if estimator == "k1":
        return k1
    # clip as verl does: exp of a large negative log-ratio would overflow in low precision
    log_ratio = jnp.clip(-k1, -20.0, 20.0)
    return jnp.clip(jnp.exp(log_ratio) - 1.0 - log_ratio, -10.0, 10.0)


def token_rewards(
    rewards: Array,
    response_mask: Array,
    logprobs: Array,
    ref_logprobs: Array,
    kl_coef: float,
    estimator: str = "k1",
) -> tuple[Array, Array]:
    """Scalar rewards [B] -> token rewards [B, T] = terminal reward - kl_coef * KL, and the KL [B, T].

    `logprobs` are the behaviour logprobs of the sampled tokens (the policy that produced them),
    `ref_logprobs` the frozen reference's; both are zeroed outside the response.
    """
    kl = kl_penalty(logprobs, ref_logprobs, estimator) * response_mask
    return place_terminal_reward(rewards, response_mask) - kl_coef * kl, kl


def gae(
    token_rewards: Array, values: Array, response_mask: Array, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Array, Array]:
    """Generalised advantage estimation over response tokens.

    token_rewards, values, response_mask: [B, T]. Positions outside the mask are skipped: the
    recursion carries the next response token's value and advantage through them, and the value
    after the last response token is 0 (the episode ends there).
        δ_t = r_t + γ V_{t'} - V_t,  A_t = δ_t + γλ A_{t'}   (t' = next response position)
    Returns (advantages [B, T], returns [B, T] = advantages + values), both 0 outside the mask.
    """
    mask = response_mask.astype(jnp.float32)
    r = token_rewards.astype(jnp.float32)
    v = values.astype(jnp.float32)

    def step(carry, xs):
        next_value, next_adv = carry
        r_t, v_t, m_t = xs
        delta = r_t + gamma * next_value - v_t
        adv = delta + gamma * lam * next_adv
        next_value = m_t * v_t + (1.0 - m_t) * next_value
        next_adv = m_t * adv + (1.0 - m_t) * next_adv
        return (next_value, next_adv), adv

    zeros = jnp.zeros(r.shape[0], jnp.float32)
    _, adv_rev = jax.lax.scan(step, (zeros, zeros), (r.T, v.T, mask.T), reverse=True)
    advantages = adv_rev.T * mask
    returns = (advantages + v) * mask
    return advantages, returns


def aggregate_loss(
    loss_mat: Array, mask: Array, mode: str = "token-mean", denominator: Array | float | None = None
) -> Array:
    """[B, T] per-token losses -> scalar.

    token-mean: sum over all response tokens / number of response tokens.
    seq-mean-token-mean: mean over sequences of each sequence's token mean.
    `denominator` replaces the count (tokens, or sequences with a response) so that micro-batches of one
    mini-batch can be summed into exactly the mini-batch's loss (gradient accumulation).
    """
    if mode == "token-mean":
        total = masked_sum(loss_mat, mask)
        n = jnp.sum(mask) if denominator is None else denominator
        return total / jnp.maximum(n, 1)
    if mode == "seq-mean-token-mean":
        seq = masked_sum(loss_mat, mask, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1)
        n = jnp.sum(jnp.any(mask > 0, axis=-1)) if denominator is None else denominator
        return jnp.sum(seq) / jnp.maximum(n, 1)
    raise ValueError(f"loss aggregation must be one of {LOSS_AGGS}, got {mode!r}")


def clip_active(ratio: Array, advantages: Array, clip_ratio: float) -> Array:
    """[B, T] 1.0 where PPO's clip decides the token's loss (its gradient is cut off), else 0.0.

    ratio, advantages: [B, T]. The clipped term -A·clip(r, 1-ε, 1+ε) is the larger one: r left the trust region
    on the side the advantage pushes towards.
    """
    loss1 = -advantages * ratio
    loss2 = -advantages * jnp.clip(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    return (loss2 > loss1).astype(jnp.float32)


def policy_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    response_mask: Array,
    sample_weights: Array | None = None,
    clip_ratio: float = 0.2,
    dual_clip: float = 0.0,
    loss_agg: str = "token-mean",
    denominator: Array | float | None = None,
    token_weights: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Clipped PPO surrogate, each sample's token losses scaled by its weight.

    logprobs, old_logprobs, advantages, response_mask: [B, T]; sample_weights: [B] (duration
    weights; None = ones); token_weights: [B, T] (the decoupled loss's behaviour weights; None = ones).
    Per token: max(-A·r, -A·clip(r, 1-ε, 1+ε)) with r = exp(logπ - logπ_old);
    with dual_clip c > 1 the loss of tokens with A < 0 is capped at -A·c (Ye et al. 2020).
    Returns (scalar loss, metrics: clipfrac, approx_kl (k1 of old vs new), ratio mean).
    """
    log_ratio = jnp.clip(logprobs - old_logprobs, -20.0, 20.0)
    ratio = jnp.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * jnp.clip(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    clipped = jnp.maximum(loss1, loss2)
    if dual_clip:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or 0 for off), got {dual_clip}")
        clipped = jnp.where(advantages < 0, jnp.minimum(clipped, -advantages * dual_clip), clipped)
    if token_weights is not None:
        clipped = clipped * token_weights
    if sample_weights is not None:
        clipped = clipped * sample_weights[:, None]
    loss = aggregate_loss(clipped, response_mask, loss_agg, denominator)
    metrics = {
        "clipfrac": masked_mean(clip_active(ratio, advantages, clip_ratio), response_mask),
        "approx_kl": masked_mean(-log_ratio, response_mask),
        "ratio": masked_mean(ratio, response_mask),
    }
    return loss, metrics


def behaviour_weights(prox_logprobs: Array, behaviour_logprobs: Array, cap: float = 5.0) -> Array:
    """[B, T] stop_gradient(min(π_prox / π_behaviour, cap)): the decoupled loss's importance weight of each token.

    prox_logprobs: [B, T] logprobs under the proximal policy (the parameters at the start of the update);
    behaviour_logprobs: [B, T] under the policy that sampled the token (versions behind, for a slow program).
    Exactly 1 where the two are equal (no staleness).
    """
    log_w = jnp.clip(prox_logprobs - behaviour_logprobs, -20.0, 20.0)
    return jax.lax.stop_gradient(jnp.minimum(jnp.exp(log_w), cap))


def decoupled_policy_loss(
    logprobs: Array,
    prox_logprobs: Array,
    behaviour_logprobs: Array,
    advantages: Array,
    response_mask: Array,
    sample_weights: Array | None = None,
    clip_ratio: float = 0.2,
    dual_clip: float = 0.0,
    loss_agg: str = "token-mean",
    denominator: Array | float | None = None,
    weight_cap: float = 5.0,
) -> tuple[Array, dict[str, Array]]:
    """AReaL's decoupled PPO (Fu et al. 2025): the trust region around the proximal policy, not the behaviour one.

    logprobs, prox_logprobs, behaviour_logprobs, advantages, response_mask: [B, T]; sample_weights: [B].
    Per token: behaviour_weights(prox, behaviour, cap) x max(-A·r, -A·clip(r, 1-ε, 1+ε)) with
    r = exp(logπ - logπ_prox). A stale token (sampled versions ago) is corrected by its importance weight instead of
    being clipped away against the old policy. With prox == behaviour it is `policy_loss`, loss and gradient.
    Returns (scalar loss, metrics as policy_loss's, the ratio taken against the proximal policy).
    """
    w = behaviour_weights(prox_logprobs, behaviour_logprobs, weight_cap)
    return policy_loss(
        logprobs, prox_logprobs, advantages, response_mask, sample_weights,
        clip_ratio, dual_clip, loss_agg, denominator, token_weights=w,
    )  # fmt: skip


def value_loss(
    values: Array,
    old_values: Array,
    returns: Array,
    response_mask: Array,
    value_clip: float = 0.5,
    loss_agg: str = "token-mean",
    denominator: Array | float | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Clipped value loss 0.5 · max((V - R)², (clip(V, V_old ± c) - R)²); all inputs [B, T].

    Returns (scalar loss, metrics: vf_clipfrac).
    """
    clipped_values = old_values + jnp.clip(values - old_values, -value_clip, value_clip)
    l1 = jnp.square(values - returns)
    l2 = jnp.square(clipped_values - returns)
    loss = 0.5 * aggregate_loss(jnp.maximum(l1, l2), response_mask, loss_agg, denominator)
    return loss, {"vf_clipfrac": masked_mean((l2 > l1).astype(jnp.float32), response_mask)}


def entropy_from_logits(logits: Array) -> Array:
    """[..., V] logits -> [...] entropy of softmax(logits) = logsumexp(l) - Σ p·l."""
    logits = logits.astype(jnp.float32)
    p = jax.nn.softmax(logits, axis=-1)
    return jax.nn.logsumexp(logits, axis=-1) - jnp.sum(p * logits, axis=-1)


def token_logprobs(logits: Array, tokens: Array, temperature: float = 1.0) -> Array:
    """logits [B, T, V] (position t predicts t+1), tokens [B, T] -> [B, T] log p(tokens[b, t]).

    Aligned with tokens: out[:, t] comes from logits[:, t-1]; out[:, 0] is 0 (no prediction for the
    first token). Temperature divides the logits as the sampler did.
    """
    # Next tokens by roll rather than slicing logits[:, :-1]: slicing the [B, T, V] logits costs a copy
    # forward and a pad backward; the rolled-in last column is dropped after the pick, on [B, T] only.
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    nxt = jnp.roll(tokens, -1, axis=1).astype(jnp.int32)
    picked = jnp.take_along_axis(logp, nxt[..., None], axis=-1)[..., 0]
    return shift_right(picked)


def _scaled_logprobs(h: Array, w: Array, temperature: float) -> tuple[Array, Array]:
    """h [b, c, D], w [D, V] -> (log_softmax(h @ w / temperature) [b, c, V] float32, its logsumexp [b, c])."""
    z = dense(h, w, preferred_element_type=jnp.float32) / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    return z - lse[..., None], lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def fused_logprob_entropy(h: Array, w: Array, nxt: Array, temperature: float) -> tuple[Array, Array]:
    """The logprob of `nxt` and the entropy under softmax(h @ w / temperature), with a hand-written backward.

    h [b, c, D], w [D, V] (the head, compute dtype), nxt [b, c] int -> (logprob [b, c], entropy [b, c]) float32.

    Autodiff of the same math keeps (or, rematerialised, recomputes and then differentiates) every vocabulary-wide
    intermediate: log_softmax, exp, the products of the entropy, each a [b, c, V] float32 pass over memory. This
    backward keeps only the [b, c] logsumexp and entropy, recomputes the logits with one GEMM and forms their
    cotangent in one elementwise pass:
        d logprob / dz = onehot(nxt) - p,    d entropy / dz = -p (log p + entropy),    z = logits / temperature,
    cast to the compute dtype before the two GEMMs of the head's backward (float32 accumulation), as
    `ops.head_matmul` does.
    """
    return _fused_fwd(h, w, nxt, temperature)[0]


def _fused_fwd(h: Array, w: Array, nxt: Array, temperature: float):
    logp, lse = _scaled_logprobs(h, w, temperature)
    picked = jnp.take_along_axis(logp, nxt[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    return (picked, entropy), (h, w, nxt, lse, entropy)


def _fused_bwd(temperature: float, res, g):
    h, w, nxt, lse, entropy = res
    g_lp, g_ent = g
    logp = dense(h, w, preferred_element_type=jnp.float32) / temperature - lse[..., None]
    p = jnp.exp(logp)
    onehot = jnp.arange(w.shape[-1], dtype=nxt.dtype) == nxt[..., None]
    dz = g_lp[..., None] * (onehot - p) - g_ent[..., None] * p * (logp + entropy[..., None])
    return (*head_matmul_backward(h, w, dz / temperature), None)


fused_logprob_entropy.defvjp(_fused_fwd, _fused_bwd)


def chunked_logprobs_entropy(
    hidden: Array,
    tokens: Array,
    w: Array,
    temperature: float = 1.0,
    chunk: int = 512,
    fused: bool = True,
) -> tuple[Array, Array]:
    """token_logprobs and entropy of softmax(hidden @ w / temperature), without the [B, T, V] logits ever live.

    hidden [B, T, D] (final-normed hidden states), tokens [B, T], w [D, V] (the model's head in its compute dtype;
    logits accumulate in float32). Returns (logprobs [B, T], entropy [B, T]), aligned with tokens as `token_logprobs`
    and `shift_right(entropy_from_logits(logits / temperature))` are: out[:, t] comes from position t-1.

    The sequence is cut into chunks of `chunk` positions (padded up to a multiple); a scan computes each
    chunk's logits, logprobs and entropy, and its backward recomputes that chunk's logits, so the backward pass also
    holds one [B, chunk, V] block at a time instead of the whole [B, T, V] (8 x 2048 x 151936 fp32 = 10 GB
    for the paper's micro-batch). chunk <= 0 or >= T: one block (the direct computation).
    fused: each block is `fused_logprob_entropy` (its hand-written backward); False: autodiff of the same math, the
    block rematerialised (`ops.head_matmul`'s backward), the reference the fused backward is tested against.
    """
    b, t, d = hidden.shape
    nxt = jnp.roll(tokens, -1, axis=1).astype(jnp.int32)  # the rolled-in last column is dropped by shift_right

    def autodiff_block(h: Array, nx: Array) -> tuple[Array, Array]:
        logits = head_matmul(h, w).astype(jnp.float32) / temperature
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, nx[..., None], axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
        return picked, entropy

    def fused_block(h: Array, nx: Array) -> tuple[Array, Array]:
        return fused_logprob_entropy(h, w, nx, temperature)

    block = fused_block if fused else autodiff_block
    if chunk <= 0 or chunk >= t:
        picked, entropy = block(hidden, nxt)
        return shift_right(picked), shift_right(entropy)
    n = -(-t // chunk)
    pad = n * chunk - t
    h = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0))).reshape(b, n, chunk, d).swapaxes(0, 1)
    nx = jnp.pad(nxt, ((0, 0), (0, pad))).reshape(b, n, chunk).swapaxes(0, 1)
    step = block if fused else jax.checkpoint(block)  # the fused backward already recomputes only the logits
    _, (picked, entropy) = jax.lax.scan(lambda c, xs: (c, step(*xs)), None, (h, nx))
    picked = picked.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    entropy = entropy.swapaxes(0, 1).reshape(b, n * chunk)[:, :t]
    return shift_right(picked), shift_right(entropy)


def shift_right(x: Array) -> Array:
    """[B, T, ...] -> [B, T, ...] with out[:, t] = x[:, t-1] and out[:, 0] = 0 (align per-position outputs
    such as values and entropies with the token they produce)."""
    pad = [(0, 0), (1, 0)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x[:, :-1], pad)
