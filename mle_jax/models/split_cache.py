"""The decoding cache of a grid of U prompts x n samples each, and attention over it.

A prompt's keys and values are written once, by its prefill, and only read while its n samples decode: the
*prefix* holds them once per prompt, not once per row. Each row's generated tokens' keys and values (the *suffix*)
are its own. Attention of a row's new token is one softmax over its prompt's valid prefix slots and its filled
suffix slots; the prefix scores of the n rows of a prompt are one matmul of their n * G query heads against the
prompt's keys, so the prompt is read once per step for all its rows (as vLLM's prefix caching shares a prompt's
blocks).

The suffix is read whole, masked to its filled slots: one static-shape matmul, which XLA:CPU runs at the speed of
memory. Its length grows with the response (`grow`, in doubling phases: the JAX sampler's decode starts with a
short suffix and pads it when full), so a step early in a 1024-token budget reads a few hundred slots, not 1024.
Reading a filled block at a time instead (a loop over dynamic slices) measured 2-3x slower on CPU: each slice is
a copy.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from mle_jax.models import ops

Array = jax.Array
_NEG = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: a row with no valid slot yet stays NaN-free


@struct.dataclass
class SplitCache:
    """Decoding cache of R = U * n rows: row r = u * n + j is sample j of prompt u.

    prefix_k:     per layer [U, Hkv, Dh, P] (the prompts' keys, transposed: the layout attention reads)
    prefix_v:     per layer [U, Hkv, P, Dh]
    prefix_valid: [U, P] bool, prefix slots that hold a prompt token (prompts are left-padded to P)
    k:            per layer [R, Hkv, Dh, M] (the generated tokens' keys; M = the token budget's bucket)
    v:            per layer [R, Hkv, M, Dh]
    index:        [] int32, suffix slots written (the same for every row: each step writes slot `index`)
    positions:    [R] int32, next RoPE position of each row
    """

    prefix_k: tuple[Array, ...]
    prefix_v: tuple[Array, ...]
    prefix_valid: Array
    k: tuple[Array, ...]
    v: tuple[Array, ...]
    index: Array
    positions: Array

    @property
    def samples_per_prompt(self) -> int:
        return self.positions.shape[0] // self.prefix_valid.shape[0]

    @property
    def max_len(self) -> int:
        """Suffix slots per row (M)."""
        return self.v[0].shape[2]


def empty_suffix(
    prefix_k: tuple[Array, ...],
    prefix_v: tuple[Array, ...],
    prefix_valid: Array,
    prefix_positions: Array,
    n: int,
    max_len: int,
) -> SplitCache:
    """A SplitCache over U prefilled prompts (prefix_* as above, prefix_positions [U] = each prompt's length)
    with n rows per prompt and `max_len` empty suffix slots per row."""
    u, hkv, dh, _ = prefix_k[0].shape
    dtype = prefix_k[0].dtype
    r = u * n
    return SplitCache(
        prefix_k=prefix_k,
        prefix_v=prefix_v,
        prefix_valid=prefix_valid,
        k=tuple(jnp.zeros((r, hkv, dh, max_len), dtype) for _ in prefix_k),
        v=tuple(jnp.zeros((r, hkv, max_len, dh), dtype) for _ in prefix_v),
        index=jnp.zeros((), jnp.int32),
        positions=jnp.repeat(prefix_positions.astype(jnp.int32), n),
    )


def grow(k: tuple[Array, ...], v: tuple[Array, ...], max_len: int) -> tuple[tuple[Array, ...], tuple[Array, ...]]:
    """A suffix (per layer k [R, Hkv, Dh, M], v [R, Hkv, M, Dh]) padded to `max_len` >= M slots per row: the filled
    slots kept, the new ones empty."""
    extra = max_len - v[0].shape[2]
    if extra < 0:
        raise ValueError(f"cannot shrink a suffix of {v[0].shape[2]} slots to {max_len}")
    return (
        tuple(jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, extra))) for x in k),
        tuple(jnp.pad(x, ((0, 0), (0, 0), (0, extra), (0, 0))) for x in v),
    )


def split_cache_attention(
    q: Array,
    prefix_kt: Array,
    prefix_vt: Array,
    prefix_valid: Array,
    kt: Array,
    vt: Array,
    filled: Array,
) -> Array:
    """One query per row against its prompt's prefix and its own suffix.

    q [R, Hq, Dh] (R = U * n rows, row u * n + j continues prompt u), prefix_kt [U, Hkv, Dh, P],
    prefix_vt [U, Hkv, P, Dh], prefix_valid [U, P] bool, kt [R, Hkv, Dh, M], vt [R, Hkv, M, Dh],
    filled [] int32 (suffix slots [0, filled) hold keys) -> [R, Hq, Dh].

    softmax over the valid prefix slots and the filled suffix slots together (scores and sums in float32): the
    prefix part and the suffix part each give a (max, sum, weighted values), merged as in flash attention.
    """
    r, hq, dh = q.shape
    u, hkv = prefix_kt.shape[:2]
    n, g = r // u, hq // hkv
    out = ops.backend_attention(q, prefix_kt, prefix_vt, prefix_valid, kt, vt, filled)  # a decode backend's
    if out is not None:
        return out
    m_len = vt.shape[2]
    scale = dh**-0.5
    # prefix: the n rows' G query heads of each kv head side by side: one [n*G, Dh] x [Dh, P] matmul per (u, kv head)
    qp = q.reshape(u, n, hkv, g, dh).transpose(0, 2, 1, 3, 4).reshape(u, hkv, n * g, dh)
    s = jnp.einsum("ukqd,ukds->ukqs", qp, prefix_kt, preferred_element_type=jnp.float32) * scale
    s = jnp.where(prefix_valid[:, None, None, :], s, _NEG)
    peak = s.max(axis=-1, keepdims=True)
    e = jnp.exp(s - peak)
    acc = jnp.einsum("ukqs,uksd->ukqd", e.astype(prefix_vt.dtype), prefix_vt, preferred_element_type=jnp.float32)

    def rows(x: Array) -> Array:  # [U, Hkv, n*G, X] -> [R, Hkv, G, X]
        return x.reshape(u, hkv, n, g, -1).transpose(0, 2, 1, 3, 4).reshape(r, hkv, g, -1)

    peak, total, acc = rows(peak), rows(e.sum(axis=-1, keepdims=True)), rows(acc)
    # suffix: every slot of each row's own keys, the unfilled ones masked
    s = jnp.einsum("rkgd,rkds->rkgs", q.reshape(r, hkv, g, dh), kt, preferred_element_type=jnp.float32) * scale
    s = jnp.where(jnp.arange(m_len) < filled, s, _NEG)
    new_peak = jnp.maximum(peak, s.max(axis=-1, keepdims=True))
    e = jnp.exp(s - new_peak)
    shrink = jnp.exp(peak - new_peak)
    pv = jnp.einsum("rkgs,rksd->rkgd", e.astype(vt.dtype), vt, preferred_element_type=jnp.float32)
    total = total * shrink + e.sum(axis=-1, keepdims=True)
    acc = acc * shrink + pv
    return (acc / total).astype(vt.dtype).reshape(r, hq, dh)
