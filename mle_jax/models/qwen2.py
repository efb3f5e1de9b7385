"""Qwen2 / Llama decoder in Flax NNX: RMSNorm, RoPE, grouped-query attention, SwiGLU.

One network for both families (they differ only in which projections carry a bias): Qwen2 has q/k/v
biases; Llama has none, or, with `attention_bias`, q/k/v/o biases, and with `mlp_bias` biases on the
three MLP projections. `Qwen2Config.model_type` remembers the family so that a saved folder is the
family it was loaded from. Matches transformers' `Qwen2ForCausalLM` and `LlamaForCausalLM` numerically
(tests/models/test_qwen2.py, tests/models/test_llama.py). Every weight is an
`nnx.Param` whose `out_sharding` metadata holds logical axis names from `LOGICAL_AXES`; a mesh and a
rules table turn them into `PartitionSpec`s (see `mle_jax.infra.sharding.param_shardings`).

Padding: `attention_mask` [B, T] (1 = real token) works with right padding (training) and left
padding (the sampler prefills left-padded prompts so that every row writes the same cache slot).
Default positions are `cumsum(mask) - 1`, i.e. each row counts its own real tokens.

Decoding: `init_cache(batch, max_len)` preallocates a `KVCache` of `max_len` slots per row; calling
the model with `cache=` writes the T new tokens at slots [cache.index, cache.index + T) and returns
`(logits, new_cache)`. Each row keeps its own next position (`cache.positions`) and its own valid
slots (`cache.valid`), so rows of different prompt lengths share one cache.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx, struct

from mle_jax.models import ops
from mle_jax.models.config import REMAT_POLICIES, Qwen2Config, remat_policy
from mle_jax.models.split_cache import SplitCache, split_cache_attention

Array = jax.Array
LOGICAL_AXES = ("vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp", "norm")
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: a fully masked (padding) query row stays NaN-free


# ----------------------------------------------------------------------------------------------------------- Parameters


def _param(rngs: nnx.Rngs, init, shape: tuple[int, ...], axes: tuple[str, ...], dtype) -> nnx.Param:
    """A Param with logical axis names in its `out_sharding` metadata. Not eagerly sharded: the names are
    logical, a mesh and rules turn them into shardings at load / jit time (sharding.param_shardings)."""
    assert len(shape) == len(axes), (shape, axes)
    return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=axes, eager_sharding=False)


def _normal(std: float = 0.02):
    return lambda key, shape, dtype: std * jax.random.normal(key, shape, dtype)


def _ones(_key, shape, dtype):
    return jnp.ones(shape, dtype)


def _zeros(_key, shape, dtype):
    return jnp.zeros(shape, dtype)


# ------------------------------------------------------------------------------------------------------------ Pure math


def rope_cos_sin(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
    """positions [B, T] int -> cos, sin [B, T, head_dim] float32 (HF 'rotate_half' layout)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """x [B, T, H, Dh], cos/sin [B, T, Dh] -> x rotated, in x's dtype."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    out = xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


def gqa_attention(q: Array, k: Array, v: Array, mask: Array, causal_block: int | None = None) -> Array:
    """Grouped-query attention: q [B, T, Hq, Dh], k/v [B, S, Hkv, Dh], mask [B, T, S] bool (True = may attend)
    -> [B, T, Hq, Dh]; `gqa_attention_heads_first` with k/v transposed to its layout (scores, softmax in float32)."""
    return gqa_attention_heads_first(q, k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3), mask, causal_block)


def gqa_attention_heads_first(q: Array, kt: Array, vt: Array, mask: Array, causal_block: int | None = None) -> Array:
    """Grouped-query attention with k/v already laid out heads-first (the KV cache's layout).

    q [B, T, Hq, Dh], kt [B, Hkv, Dh, S] (keys transposed: q @ kt is a plain matmul), vt [B, Hkv, S, Dh],
    mask [B, T, S] bool (True = may attend) -> [B, T, Hq, Dh]. Scores and softmax in float32.

    The G = Hq / Hkv query heads that share a kv head are folded into the query axis, so each kv head
    is one [T*G, Dh] x [Dh, S] matmul (no repeated k/v, no transposes of the scores).
    causal_block: when the mask is causal in a shared index space (query t never sees key s > t, as in
    training, where S == T), queries are processed in blocks of this many rows and block [a, b) only
    scores keys [0, b): about half the work of the full T x S square, with the same result.
    """
    b, t, hq, dh = q.shape
    hkv = kt.shape[1]
    g = hq // hkv
    qg = q.reshape(b, t, hkv, g, dh).transpose(0, 2, 1, 3, 4)  # [B, K, T, G, Dh]
    if causal_block is None or causal_block >= t:
        bounds = [(0, t, kt.shape[3])]
    else:
        bounds = [(a, min(a + causal_block, t), min(a + causal_block, t)) for a in range(0, t, causal_block)]
    outs = []
    for start, stop, keys in bounds:
        n = stop - start
        qi = qg[:, :, start:stop].reshape(b, hkv, n * g, dh)
        scores = jnp.einsum("bkqd,bkds->bkqs", qi, kt[..., :keys], preferred_element_type=jnp.float32)
        scores = scores * (dh**-0.5)
        m = jnp.broadcast_to(mask[:, None, start:stop, None, :keys], (b, 1, n, g, keys)).reshape(b, 1, n * g, keys)
        scores = jnp.where(m, scores, _NEG)
        # softmax(s) @ v = (exp(s - max) @ v) / sum(exp(s - max)): normalising the [.., Dh] output rather
        # than the [.., S] probabilities saves an elementwise pass forward and backward. The max is a
        # constant shift that cancels exactly, so it carries no gradient.
        peak = jax.lax.stop_gradient(scores.max(axis=-1, keepdims=True))
        unnorm = jnp.exp(scores - peak)
        denom = unnorm.sum(axis=-1, keepdims=True)
        o = jnp.einsum("bkqs,bksd->bkqd", unnorm.astype(vt.dtype), vt[:, :, :keys], preferred_element_type=jnp.float32)
        outs.append((o / denom).astype(vt.dtype).reshape(b, hkv, n, g, dh))
    out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=2)
    return out.transpose(0, 2, 1, 3, 4).reshape(b, t, hq, dh)


def dot_product_attention(q: Array, k: Array, v: Array, lengths: Array) -> Array:
    """Causal grouped-query attention by `jax.nn.dot_product_attention` over right-padded rows.

    q [B, T, Hq, Dh], k/v [B, T, Hkv, Dh], lengths [B] int32 (each row's real tokens, which come first)
    -> [B, T, Hq, Dh]. Query t sees keys s <= t with s < lengths[b]: on every position the same keys as
    `gqa_attention` under `causal & attention_mask`. cuDNN's flash attention where the backend is a GPU and
    the dtype half precision (it never writes the T x S scores), XLA's implementation elsewhere.
    """
    gpu = jax.default_backend() == "gpu" and q.dtype in (jnp.bfloat16, jnp.float16)
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=True, key_value_seq_lengths=lengths, implementation="cudnn" if gpu else None
    )


def default_positions(attention_mask: Array | None, batch: int, length: int) -> Array:
    """[B, T] positions: each row counts its own real tokens (cumsum(mask) - 1, clipped at 0)."""
    if attention_mask is None:
        return jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    return jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=1) - 1, 0)


# ------------------------------------------------------------------------------------------------------------- KV cache


@struct.dataclass
class KVCache:
    """Preallocated decoding cache.

    k:         per layer [B, Hkv, Dh, S] (S = max_len slots; keys transposed, the layout attention reads)
    v:         per layer [B, Hkv, S, Dh]
    valid:     [B, S] bool, slots that hold a real token
    index:     [] int32, next slot to write (shared by all rows)
    positions: [B] int32, next RoPE position of each row
    """

    k: tuple[Array, ...]
    v: tuple[Array, ...]
    valid: Array
    index: Array
    positions: Array

    @property
    def max_len(self) -> int:
        return self.valid.shape[1]


# -------------------------------------------------------------------------------------------------------------- Modules


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, *, rngs: nnx.Rngs, dtype, param_dtype):
        self.scale = _param(rngs, _ones, (dim,), ("norm",), param_dtype)
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        xf = x.astype(jnp.float32)
        normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(self.dtype) * normed.astype(self.dtype)


class Attention(nnx.Module):
    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs, dtype, param_dtype):
        d, hq, hkv, dh = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        init = _normal()
        self.q_proj = _param(rngs, init, (d, hq, dh), ("embed", "q_heads", "head_dim"), param_dtype)
        self.k_proj = _param(rngs, init, (d, hkv, dh), ("embed", "kv_heads", "head_dim"), param_dtype)
        self.v_proj = _param(rngs, init, (d, hkv, dh), ("embed", "kv_heads", "head_dim"), param_dtype)
        self.o_proj = _param(rngs, init, (hq, dh, d), ("q_heads", "head_dim", "embed"), param_dtype)
        if cfg.attention_bias:
            self.q_bias = _param(rngs, _zeros, (hq, dh), ("q_heads", "head_dim"), param_dtype)
            self.k_bias = _param(rngs, _zeros, (hkv, dh), ("kv_heads", "head_dim"), param_dtype)
            self.v_bias = _param(rngs, _zeros, (hkv, dh), ("kv_heads", "head_dim"), param_dtype)
        if cfg.attention_out_bias:  # added after the heads are summed: replicated, like a norm scale
            self.o_bias = _param(rngs, _zeros, (d,), ("norm",), param_dtype)
        self.qkv_bias, self.out_bias = cfg.attention_bias, cfg.attention_out_bias
        self.num_heads, self.num_kv_heads = hq, hkv
        self.head_dim = dh
        self.rope_theta = cfg.rope_theta
        self.attn_block = cfg.attn_block or None
        self.dtype = dtype

    def _qkv(self, x: Array) -> tuple[Array, Array, Array]:
        """x [B, T, D] -> q [B, T, Hq, Dh], k, v [B, T, Hkv, Dh], biases (if any) added.

        Three `dense` GEMMs rather than one over concatenated weights: with heads sharded over `tensor`, a
        concatenation would reshard the weights every step, and on CPU the fused form measured no faster.
        """
        dt = self.dtype
        b, t, d = x.shape

        def proj(w: nnx.Param, h: int, bias: nnx.Param | None) -> Array:
            out = ops.dense(x, ops.weight(w, dt, (d, h * self.head_dim)))
            if bias is not None:
                out = out + bias[...].astype(dt).reshape(-1)
            return out.reshape(b, t, h, self.head_dim)

        qb, kb, vb = (self.q_bias, self.k_bias, self.v_bias) if self.qkv_bias else (None, None, None)
        return (
            proj(self.q_proj, self.num_heads, qb),
            proj(self.k_proj, self.num_kv_heads, kb),
            proj(self.v_proj, self.num_kv_heads, vb),
        )

    def __call__(
        self, x: Array, positions: Array, mask: Array, cache_kv: tuple[Array, Array] | None, index: Array | None
    ) -> tuple[Array, tuple[Array, Array] | None]:
        """x [B, T, D], positions [B, T], mask [B, T, S] bool, or [B] int32 real-token counts of right-padded rows
        (`attention="dot_product"`, training only) -> [B, T, D] (+ updated (k, v) cache)."""
        dt = self.dtype
        x = x.astype(dt)
        q, k, v = self._qkv(x)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        new_kv = None
        if cache_kv is not None:  # no query blocks: cache slots and query positions are different index spaces
            ck, cv = cache_kv
            ck = jax.lax.dynamic_update_slice(ck, k.transpose(0, 2, 3, 1).astype(ck.dtype), (0, 0, 0, index))
            cv = jax.lax.dynamic_update_slice(cv, v.transpose(0, 2, 1, 3).astype(cv.dtype), (0, 0, index, 0))
            new_kv = (ck, cv)
            out = gqa_attention_heads_first(q, ck.astype(dt), cv.astype(dt), mask)
        elif mask.ndim == 1:  # "dot_product": the mask is each row's count of real (leading) tokens
            out = dot_product_attention(q, k, v, mask)
        else:
            out = gqa_attention(q, k, v, mask, self.attn_block)
        return self._out(out), new_kv

    def _out(self, out: Array) -> Array:
        """The heads' outputs [B, T, Hq, Dh] -> [B, T, D] (o_proj, + its bias if any)."""
        dt = self.dtype
        b, t, hq, dh = out.shape
        out = ops.dense(out.reshape(b, t, hq * dh), ops.weight(self.o_proj, dt, (hq * dh, self.o_proj.shape[-1])))
        if self.out_bias:
            out = out + self.o_bias[...].astype(dt)
        return out

    def decode(self, x: Array, cache: SplitCache, layer: int) -> tuple[Array, tuple[Array, Array]]:
        """One new token per row against a SplitCache: x [R, 1, D] -> [R, 1, D], this layer's suffix (k, v) with
        the token written at slot cache.index (its RoPE position: cache.positions)."""
        dt = self.dtype
        q, k, v = self._qkv(x.astype(dt))
        cos, sin = rope_cos_sin(cache.positions[:, None], self.head_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        ck, cv = cache.k[layer], cache.v[layer]
        ck = jax.lax.dynamic_update_slice(ck, k.transpose(0, 2, 3, 1).astype(ck.dtype), (0, 0, 0, cache.index))
        cv = jax.lax.dynamic_update_slice(cv, v.transpose(0, 2, 1, 3).astype(cv.dtype), (0, 0, cache.index, 0))
        pk, pv = cache.prefix_k[layer].astype(dt), cache.prefix_v[layer].astype(dt)
        out = split_cache_attention(q[:, 0], pk, pv, cache.prefix_valid, ck.astype(dt), cv.astype(dt), cache.index + 1)
        return self._out(out[:, None]), (ck, cv)


class MLP(nnx.Module):
    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs, dtype, param_dtype):
        d, f = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = _param(rngs, _normal(), (d, f), ("embed", "mlp"), param_dtype)
        self.up_proj = _param(rngs, _normal(), (d, f), ("embed", "mlp"), param_dtype)
        self.down_proj = _param(rngs, _normal(), (f, d), ("mlp", "embed"), param_dtype)
        if cfg.mlp_bias:  # Llama's mlp_bias
            self.gate_bias = _param(rngs, _zeros, (f,), ("mlp",), param_dtype)
            self.up_bias = _param(rngs, _zeros, (f,), ("mlp",), param_dtype)
            self.down_bias = _param(rngs, _zeros, (d,), ("norm",), param_dtype)
        self.has_bias = cfg.mlp_bias
        self.dtype = dtype

    def __call__(self, x: Array) -> Array:
        dt = self.dtype
        gate = ops.dense(x, ops.weight(self.gate_proj, dt))
        up = ops.dense(x, ops.weight(self.up_proj, dt))
        if self.has_bias:
            gate, up = gate + self.gate_bias[...].astype(dt), up + self.up_bias[...].astype(dt)
        out = ops.dense(jax.nn.silu(gate) * up, ops.weight(self.down_proj, dt))
        return out + self.down_bias[...].astype(dt) if self.has_bias else out


class DecoderLayer(nnx.Module):
    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs, dtype, param_dtype):
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.attn = Attention(cfg, **kw)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)
        self.mlp = MLP(cfg, **kw)

    def __call__(self, x, positions, mask, cache_kv=None, index=None):
        h, new_kv = self.attn(self.input_layernorm(x), positions, mask, cache_kv, index)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, new_kv

    def decode(self, x: Array, cache: SplitCache, layer: int) -> tuple[Array, tuple[Array, Array]]:
        """x [R, 1, D] -> [R, 1, D] and this layer's new suffix (k, v) (Attention.decode)."""
        h, new_kv = self.attn.decode(self.input_layernorm(x), cache, layer)
        x = x + h
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, new_kv


def _layer_forward(layer: DecoderLayer, x: Array, positions: Array, mask: Array) -> Array:
    return layer(x, positions, mask)[0]


_remat_layer_forward = {name: nnx.remat(_layer_forward, policy=remat_policy(name)) for name in REMAT_POLICIES}


def scan_layer_stack(
    layers: nnx.List, x: Array, positions: Array, mask: Array, dtype: Any, remat: bool, policy: str = "full"
) -> Array:
    """The decoder layers as one `lax.scan` over their weights stacked on a leading layer axis (MaxText's
    scan_layers): the compiled program holds one layer body instead of L copies, so compile time stops
    growing with depth. Weights stay stored per layer (checkpoints, HF import/export and shardings are
    unchanged); the stack is built inside the traced program, cast to the compute dtype first, as every
    layer casts its weights before use, so the numerics are those of the unrolled loop.

    x [B, T, D], positions [B, T], mask [B, T, S] -> [B, T, D]. remat: recompute each layer in the backward,
    keeping what `policy` (REMAT_POLICIES) names.
    """
    graphdef, _ = nnx.split(layers[0])
    states = [nnx.state(layer) for layer in layers]

    def stack(*xs: Array) -> Array:
        return jnp.stack([v.astype(dtype) if jnp.issubdtype(v.dtype, jnp.floating) else v for v in xs])

    stacked = jax.tree.map(stack, *states)

    def body(h: Array, state: Any) -> tuple[Array, None]:
        return nnx.merge(graphdef, state)(h, positions, mask)[0], None

    x, _ = jax.lax.scan(jax.checkpoint(body, policy=remat_policy(policy)) if remat else body, x, stacked)
    return x


class Qwen2Model(nnx.Module):
    """The backbone: embeddings, decoder layers, final norm. Shared by policy and value models."""

    def __init__(self, cfg: Qwen2Config, *, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32):
        self.config = cfg
        self.dtype = dtype
        self.embed_tokens = _param(rngs, _normal(), (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), param_dtype)
        kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.layers = nnx.List([DecoderLayer(cfg, **kw) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, **kw)

    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        attention_mask: Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Array, KVCache | None]:
        """tokens [B, T] int32 -> final hidden states [B, T, D] (after the final norm), new cache."""
        b, t = tokens.shape
        if attention_mask is not None:
            attention_mask = attention_mask.astype(bool)
        if cache is None:
            if positions is None:
                positions = default_positions(attention_mask, b, t)
            if self.config.attention == "dot_product":  # [B] real-token counts: the layers' attention reads these
                real = jnp.ones((b, t), bool) if attention_mask is None else attention_mask
                mask = real.sum(axis=1).astype(jnp.int32)
            else:
                causal = jnp.tril(jnp.ones((t, t), bool))[None]
                mask = causal if attention_mask is None else causal & attention_mask[:, None, :]
                mask = jnp.broadcast_to(mask, (b, t, t))
        else:
            real = jnp.ones((b, t), bool) if attention_mask is None else attention_mask
            if positions is None:
                positions = cache.positions[:, None] + default_positions(real, b, t)
            valid = jax.lax.dynamic_update_slice(cache.valid, real, (0, cache.index))
            slots = jnp.arange(cache.max_len)
            q_slots = cache.index + jnp.arange(t)
            mask = (slots[None, :] <= q_slots[:, None])[None] & valid[:, None, :]
        x = self.embed_tokens[...].astype(self.dtype)[tokens]
        new_k, new_v = [], []
        if cache is None and self.config.scan_layers:
            x = scan_layer_stack(
                self.layers, x, positions, mask, self.dtype, self.config.remat, self.config.remat_policy
            )
        else:  # decoding stays unrolled: the per-layer cache is updated in place
            for i, layer in enumerate(self.layers):
                if cache is None:
                    fwd = _remat_layer_forward[self.config.remat_policy] if self.config.remat else _layer_forward
                    x = fwd(layer, x, positions, mask)
                else:
                    x, (k, v) = layer(x, positions, mask, (cache.k[i], cache.v[i]), cache.index)
                    new_k.append(k)
                    new_v.append(v)
        x = self.norm(x)
        if cache is None:
            return x, None
        new_cache = KVCache(
            k=tuple(new_k),
            v=tuple(new_v),
            valid=valid,
            index=cache.index + t,
            positions=cache.positions + real.sum(axis=1).astype(jnp.int32),
        )
        return x, new_cache

    def decode(self, tokens: Array, cache: SplitCache) -> tuple[Array, SplitCache]:
        """One token per row of a SplitCache: tokens [R] int32 -> final-normed hidden states [R, D], the cache
        with the tokens' keys and values written (index and positions advanced by one)."""
        x = self.embed_tokens[...].astype(self.dtype)[tokens][:, None]
        new_k, new_v = [], []
        for i, layer in enumerate(self.layers):
            x, (k, v) = layer.decode(x, cache, i)
            new_k.append(k)
            new_v.append(v)
        new_cache = cache.replace(k=tuple(new_k), v=tuple(new_v), index=cache.index + 1, positions=cache.positions + 1)
        return self.norm(x)[:, 0], new_cache

    def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        """An empty cache of `max_len` slots per row (dtype defaults to the compute dtype)."""
        cfg = self.config
        dtype = dtype or self.dtype
        shape = (batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        k_shape = (batch, cfg.num_key_value_heads, cfg.head_dim, max_len)
        n = cfg.num_hidden_layers
        return KVCache(
            k=tuple(jnp.zeros(k_shape, dtype) for _ in range(n)),
            v=tuple(jnp.zeros(shape, dtype) for _ in range(n)),
            valid=jnp.zeros((batch, max_len), bool),
            index=jnp.zeros((), jnp.int32),
            positions=jnp.zeros((batch,), jnp.int32),
        )


class Qwen2ForCausalLM(nnx.Module):
    """Qwen2 with a language-model head. `__call__` returns float32 logits [B, T, V] (+ cache)."""

    def __init__(self, config: Qwen2Config, rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32):
        self.config = config
        self.dtype = dtype
        self.model = Qwen2Model(config, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        if not config.tie_word_embeddings:
            self.lm_head = _param(
                rngs, _normal(), (config.hidden_size, config.vocab_size), ("embed", "vocab"), param_dtype
            )

    def hidden_states(
        self,
        tokens: Array,
        positions: Array | None = None,
        attention_mask: Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[Array, KVCache | None]:
        """tokens [B, T] -> final-normed hidden states [B, T, D], new cache (None without cache)."""
        return self.model(tokens, positions, attention_mask, cache)

    def head_weight(self) -> Any:
        """The output head [D, V] in the compute dtype: the input embedding transposed when tied (or a decode
        backend's form of it, inside `ops.decode_with`)."""
        if self.config.tie_word_embeddings:
            return ops.weight(self.model.embed_tokens, self.dtype, transpose=True)
        return ops.weight(self.lm_head, self.dtype)

    def logits_from_hidden(self, h: Array) -> Array:
        """h [B, T, D] -> logits [B, T, V] float32."""
        return ops.head_matmul(h, self.head_weight())

    def __call__(
        self,
        tokens: Array,
        positions: Array | None = None,
        attention_mask: Array | None = None,
        cache: KVCache | None = None,
    ) -> Array | tuple[Array, KVCache]:
        """tokens [B, T] int32 -> logits [B, T, V] float32; with `cache`, (logits, new_cache)."""
        h, new_cache = self.hidden_states(tokens, positions, attention_mask, cache)
        logits = self.logits_from_hidden(h)
        return logits if cache is None else (logits, new_cache)

    def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
        return self.model.init_cache(batch, max_len, dtype)

    def decode(self, tokens: Array, cache: SplitCache) -> tuple[Array, SplitCache]:
        """tokens [R] int32 -> logits [R, V] float32 of the next token of each row of `cache`, the new cache."""
        h, cache = self.model.decode(tokens, cache)
        return self.logits_from_hidden(h[:, None])[:, 0], cache
