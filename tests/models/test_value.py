"""The critic: shape, initialisation from the policy, gradient into the backbone."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.value import Qwen2ValueModel
from tests.models.reference import TINY, numpy_random_model

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def pair():
    policy = numpy_random_model(Qwen2ForCausalLM, Qwen2Config(**TINY), seed=0)
    return policy, Qwen2ValueModel.from_policy(policy, nnx.Rngs(1))


def test_values_shape_and_backbone_copied(pair):
    policy, value = pair
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, TINY["vocab_size"], (3, 7)), jnp.int32)
    mask = jnp.ones((3, 7), jnp.int32).at[2, 4:].set(0)
    v = nnx.jit(lambda m, t, mk: m(t, attention_mask=mk))(value, tokens, mask)
    assert v.shape == (3, 7) and v.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(v)))
    p_state, v_state = nnx.state(policy.model, nnx.Param), nnx.state(value.model, nnx.Param)
    for a, b in zip(jax.tree.leaves(p_state), jax.tree.leaves(v_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Values are the head applied to the policy's own final hidden states.
    h, _ = nnx.jit(lambda m, t: m.hidden_states(t))(policy, tokens)
    expect = h @ value.value_head[...] + value.value_bias[...]
    assert np.abs(np.asarray(nnx.jit(lambda m, t: m(t))(value, tokens)) - np.asarray(expect)).max() < 1e-5
    head = value.value_head[...]
    assert 0 < float(jnp.abs(head).max()) < 0.2  # fresh, small, not zero


def test_gradient_reaches_backbone_and_leaves_policy_alone(pair):
    policy, value = pair
    tokens = jnp.asarray(np.random.RandomState(1).randint(0, TINY["vocab_size"], (2, 6)), jnp.int32)
    before = np.asarray(policy.model.embed_tokens[...]).copy()

    @nnx.jit
    def grads(m):
        return nnx.grad(lambda m: jnp.mean((m(tokens) - 1.0) ** 2))(m)

    g = grads(value)
    for path in [("model", "embed_tokens"), ("model", "layers", 0, "attn", "q_proj"), ("value_head",)]:
        leaf = g
        for p in path:
            leaf = leaf[p]
        assert float(jnp.abs(leaf[...]).sum()) > 0, path
    value.model.embed_tokens[...] = value.model.embed_tokens[...] + 1.0  # no aliasing with the policy
    np.testing.assert_array_equal(np.asarray(policy.model.embed_tokens[...]), before)
