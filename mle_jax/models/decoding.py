"""Drawing the next token from logits: the one decoding rule of the in-process sampler, also compiled by the planner
for its decode step (a pure function of logits, so neither needs the other)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def draw_categorical(key: jax.Array, logp: jax.Array) -> jax.Array:
    """logp [B, V] log-probabilities (-inf allowed, unnormalised is fine) -> [B] int32 draws.

    Inverse-CDF sampling: one uniform per row against the running sum of the probabilities. Exactly the
    categorical distribution (a zero-probability token owns an empty interval, so it is never drawn), and
    several times cheaper on CPU than `jax.random.categorical`, which draws V Gumbel variates per row.
    """
    p = jnp.exp(logp - jnp.max(logp, axis=-1, keepdims=True))
    cdf = jnp.cumsum(p, axis=-1)
    u = (1.0 - jax.random.uniform(key, (logp.shape[0], 1))) * cdf[:, -1:]  # in (0, total]
    return jnp.sum(cdf < u, axis=-1).astype(jnp.int32)


def sample_token(
    logits: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array, top_k: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """logits [B, V] float32 -> (token [B] int32, logprob [B] float32).

    temperature == 0: argmax, logprob from log_softmax(logits). Otherwise a draw from softmax(logits / T)
    restricted to the top_k tokens (top_k <= 0: all) and the smallest set with mass >= top_p; the returned
    logprob is log_softmax(logits / T) of the drawn token (untruncated).
    """
    greedy = temperature <= 0.0
    scaled = logits / jnp.where(greedy, 1.0, temperature)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    vocab = logits.shape[-1]

    def argmax() -> jax.Array:
        # The first index holding the max, as jnp.argmax, but as two plain reductions: XLA CPU's fused
        # (value, index) argmax reduction is ~10x slower over a vocabulary.
        top = jnp.max(scaled, axis=-1, keepdims=True)
        return jnp.min(jnp.where(scaled == top, jnp.arange(vocab, dtype=jnp.int32), vocab), axis=-1)

    def truncated() -> jax.Array:
        order = jnp.argsort(-scaled, axis=-1)
        sorted_logp = jnp.take_along_axis(logp, order, axis=-1)
        rank = jnp.arange(vocab)[None, :]
        k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
        mass_before = jnp.cumsum(jnp.exp(sorted_logp), axis=-1) - jnp.exp(sorted_logp)
        keep = (rank < k) & ((mass_before < top_p) | (rank == 0))
        choice = draw_categorical(key, jnp.where(keep, sorted_logp, -jnp.inf))
        return jnp.take_along_axis(order, choice[:, None], axis=-1)[:, 0].astype(jnp.int32)

    def full() -> jax.Array:
        return draw_categorical(key, logp)

    # Only the branch in use runs: greedy draws nothing, and the vocabulary sort only runs when top-p /
    # top-k actually truncate.
    branch = jnp.where(greedy, 0, jnp.where((top_p < 1.0) | (top_k > 0), 2, 1))
    token = jax.lax.switch(branch, (argmax, full, truncated))
    return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
