"""The critic: the Qwen2 backbone with a scalar value head (paper: initialised from the policy's
checkpoint, fresh head)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from mle_jax.models.qwen2 import KVCache, Qwen2Config, Qwen2ForCausalLM, Qwen2Model

Array = jax.Array


class Qwen2ValueModel(nnx.Module):
    """tokens [B, T] -> values [B, T] float32: a linear head on the final-normed hidden states.

    The head is small random (std `head_init_std`), not zero, so the backbone gets a gradient from
    the first step.
    """

    def __init__(
        self,
        config: Qwen2Config,
        rngs: nnx.Rngs,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        head_init_std: float = 0.02,
    ):
        self.config = config
        self.dtype = dtype
        self.model = Qwen2Model(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        w = head_init_std * jax.random.normal(rngs.params(), (config.hidden_size,), jnp.float32)
        self.value_head = nnx.Param(w.astype(param_dtype), out_sharding=("embed",), eager_sharding=False)
        self.value_bias = nnx.Param(jnp.zeros((), param_dtype), out_sharding=(), eager_sharding=False)

    @classmethod
    def from_policy(cls, policy: Qwen2ForCausalLM, rngs: nnx.Rngs, head_init_std: float = 0.02) -> Qwen2ValueModel:
        """A critic whose backbone is a copy of `policy`'s (same dtypes and shardings), with a fresh head."""
        pdtype = policy.model.embed_tokens[...].dtype
        value = nnx.eval_shape(lambda: cls(policy.config, nnx.Rngs(0), dtype=policy.dtype, param_dtype=pdtype))
        graphdef, state = nnx.split(value)
        backbone = jax.tree.map(jnp.copy, nnx.state(policy.model))  # no aliasing: the learner may donate
        state["model"] = backbone
        w = head_init_std * jax.random.normal(rngs.params(), (policy.config.hidden_size,), jnp.float32)
        state["value_head"] = state["value_head"].replace(w.astype(pdtype))
        state["value_bias"] = state["value_bias"].replace(jnp.zeros((), pdtype))
        return nnx.merge(graphdef, state)

    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        attention_mask: Array | None = None,
        cache: KVCache | None = None,
    ) -> Array:
        """tokens [B, T] int32 -> values [B, T] float32."""
        h, _ = self.model(tokens, positions, attention_mask, cache)
        w = self.value_head[...].astype(jnp.float32)
        return jnp.einsum("btd,d->bt", h.astype(jnp.float32), w) + self.value_bias[...].astype(jnp.float32)
