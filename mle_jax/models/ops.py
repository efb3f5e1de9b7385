"""The model's matmuls, and the one seam where a decode backend plugs in faster ones.

The model (qwen2.py, split_cache.py) takes every dense weight through `weight`, multiplies by it through `dense`
(the output head through `head_matmul`), and attends over a split cache through `split_cache_attention`'s
`backend_attention` hook. Outside `decode_with(backend)` all of it is plain JAX: training, prefill and the learner
never reach a backend. The sampler's decode enters `decode_with` with a `DecodeBackend` (mle_jax.kernels.cpu_decode's
on CPU), which may hand the model its own form of a weight (a `BackendWeight`, e.g. packed panels) and its own
attention; this module knows no backend, and the model imports none.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from mle_jax.models import lora

Array = jax.Array


class BackendWeight(abc.ABC):
    """A dense weight [K, N] in a backend's own form: `matmul` multiplies rows by it."""

    n: int  # output columns

    @abc.abstractmethod
    def matmul(self, x: Array) -> Array:
        """x [M, K] -> [M, N] float32."""


class DecodeBackend(Protocol):
    """What a backend offers a decode step (each may decline with None: the model's own op runs)."""

    def weight(self, param: Any, dtype: Any, shape: tuple[int, ...] | None, transpose: bool) -> BackendWeight | None:
        """The backend's form of `plain_weight(param, dtype, shape, transpose)`, or None."""
        ...

    def split_cache_attention(
        self, q: Array, prefix_kt: Array, prefix_vt: Array, prefix_valid: Array, kt: Array, vt: Array, filled: Array
    ) -> Array | None:
        """`split_cache.split_cache_attention` by the backend, or None."""
        ...


_BACKEND: contextvars.ContextVar[DecodeBackend | None] = contextvars.ContextVar("mle_jax_decode_backend", default=None)


@contextlib.contextmanager
def decode_with(backend: DecodeBackend | None) -> Iterator[None]:
    """Within it (a decode step being traced), the model's weights and attention go through `backend` (None: the
    model's own ops)."""
    token = _BACKEND.set(backend)
    try:
        yield
    finally:
        _BACKEND.reset(token)


def active_backend() -> DecodeBackend | None:
    """The backend `decode_with` installed for the code being traced, if any."""
    return _BACKEND.get()


def plain_weight(param: Any, dtype: Any, shape: tuple[int, ...] | None = None, transpose: bool = False) -> Array:
    """param[...] in `dtype`, transposed (a tied head) and reshaped to the 2-D `shape` [K, N] -> [K, N]."""
    w = param[...].astype(dtype)
    w = w.T if transpose else w
    return w if shape is None else w.reshape(shape)


def weight(param: Any, dtype: Any, shape: tuple[int, ...] | None = None, transpose: bool = False) -> Any:
    """The dense weight of an nnx.Param as the model's matmul takes it: `plain_weight`, or inside `decode_with`,
    the backend's form of it where it offers one."""
    backend = _BACKEND.get()
    if backend is not None:
        w = backend.weight(param, dtype, shape, transpose)
        if w is not None:
            return w
    return plain_weight(param, dtype, shape, transpose)


def backend_attention(*args: Array) -> Array | None:
    """The active backend's split-cache attention of `args` (`DecodeBackend.split_cache_attention`), or None."""
    backend = _BACKEND.get()
    return None if backend is None else backend.split_cache_attention(*args)


def dense(x: Array, w: Any, preferred_element_type: Any = None) -> Array:
    """x [..., K] @ w [K, N] -> [..., N], as one 2-D [prod(...), K] x [K, N] GEMM (w a `BackendWeight`: its own
    matmul, float32; a `lora.LoraWeight`: x W + s (x A) B, never merged).

    Every projection goes through here: with 3-D activations XLA CPU computes the weight gradient by
    materialising transposed activations (fused with the elementwise backward before it), a quarter of
    a training step; the 2-D form needs no transposes.
    """
    x2 = x.reshape(-1, x.shape[-1])
    if isinstance(w, BackendWeight):  # a decode step on a backend (the sampler's CPU kernels)
        return w.matmul(x2).reshape(*x.shape[:-1], w.n)
    if isinstance(w, lora.LoraWeight):  # training with adapters (models/lora.py)
        out = w.apply(x2, lambda a, b: dense(a, b, preferred_element_type))
        return out.reshape(*x.shape[:-1], w.shape[-1])
    out = jnp.matmul(x2, w, preferred_element_type=preferred_element_type)
    return out.reshape(*x.shape[:-1], w.shape[-1])


def head_matmul(h: Array, w: Any) -> Array:
    """The output head: h [..., D] @ w [D, V] -> logits [..., V] float32 (a `BackendWeight`: its matmul; otherwise
    `_head_matmul`, whose backward runs in h's dtype)."""
    return dense(h, w) if isinstance(w, BackendWeight) else _head_matmul(h, w)


@jax.custom_vjp
def _head_matmul(h: Array, w: Array) -> Array:
    """h [..., D] @ w [D, V] -> [..., V] float32, accumulated in float32.

    Its backward casts the float32 cotangent of the logits to h's dtype before the two matmuls: with bf16 weights
    both then run as bf16 GEMMs (float32 accumulation) rather than float32 ones, which on an H100 took 14% of a
    3B-shaped update (bench/objective_step.py --profile). A float32 model's gradients are unchanged.
    """
    return dense(h, w, preferred_element_type=jnp.float32)


def _head_fwd(h: Array, w: Array) -> tuple[Array, tuple[Array, Array]]:
    return _head_matmul(h, w), (h, w)


def _head_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, Array]:
    return head_matmul_backward(*res, g)


def head_matmul_backward(h: Array, w: Array, g: Array) -> tuple[Array, Array]:
    """`head_matmul`'s backward: h [..., D], w [D, V], g [..., V] float32 (the logits' cotangent) -> (dh, dw) in the
    dtypes of h and w, g cast to h's dtype first (bf16 GEMMs with float32 accumulation for a bf16 model)."""
    g = g.astype(h.dtype)
    dh = dense(g, w.T, preferred_element_type=jnp.float32).astype(h.dtype)
    h2, g2 = h.reshape(-1, h.shape[-1]), g.reshape(-1, g.shape[-1])
    dw = jnp.matmul(h2.T, g2, preferred_element_type=jnp.float32).astype(w.dtype)
    return dh, dw


_head_matmul.defvjp(_head_fwd, _head_bwd)
