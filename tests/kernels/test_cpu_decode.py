"""The CPU decode kernels (mle_jax.kernels.cpu_decode) against XLA's own ops, and the sampler's use of them."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mle_jax.kernels import cpu_decode
from mle_jax.models import ops
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.split_cache import empty_suffix, split_cache_attention
from tests.models.reference import TINY, numpy_random_model

pytestmark = pytest.mark.model


def test_the_library_is_built_and_registered():
    """`make kernels` (a prerequisite of `make test`) built it: every sampler test below runs on it."""
    assert cpu_decode.LIBRARY.exists(), "run `make kernels`"
    assert cpu_decode.available()


# the last: Qwen2.5-Coder-0.5B's LM head (896 x 151,936), 16 rows (the sampler's grid)
@pytest.mark.parametrize("m,k,n", [(1, 64, 32), (5, 48, 50), (16, 576, 1536), (13, 96, 200), (16, 896, 151936)])
def test_packed_dense_equals_xla_dot(m, k, n):
    """Rows not a multiple of the 8-row tile, columns not a multiple of the 32-column panel."""
    rng = np.random.default_rng(m * 1000 + n)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
    panels = cpu_decode.pack(w)
    assert panels.shape == (-(-n // 32), k, 32)
    unpacked = np.asarray(panels).transpose(1, 0, 2).reshape(k, -1)
    np.testing.assert_array_equal(unpacked[:, :n], w)
    assert not unpacked[:, n:].any()
    out = jax.jit(lambda x, p: cpu_decode.dense(x, cpu_decode.Packed(p, n)))(x, panels)
    assert out.shape == (m, n)
    np.testing.assert_allclose(out, np.asarray(x) @ np.asarray(w), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("live", [[1, 0] * 8, [0] * 7 + [1] * 9, [0] * 16, [1] + [0] * 15])
def test_packed_dense_computes_only_the_live_rows(live):
    """A mask of the rows still decoding (`live_rows`): those rows equal x @ w, gathered into tiles of 8 and one of
    the rest; the others are zeros (whatever x holds there)."""
    rng = np.random.default_rng(sum(live))
    x = jnp.asarray(rng.standard_normal((16, 96)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((96, 200)), jnp.float32)
    mask = jnp.asarray(live, bool)
    packed = cpu_decode.Packed(cpu_decode.pack(w), 200)

    def traced(x, p):
        with cpu_decode.live_rows(mask):
            return cpu_decode.dense(x, cpu_decode.Packed(p, 200)), cpu_decode.dense(x[:3], cpu_decode.Packed(p, 200))

    out, other_rows = jax.jit(traced)(x, packed.panels)
    ref = np.asarray(x) @ np.asarray(w)
    on = np.asarray(live, bool)
    np.testing.assert_allclose(np.asarray(out)[on], ref[on], rtol=1e-5, atol=1e-4)
    assert not np.asarray(out)[~on].any()
    # a matmul of another row count inside the context computes every row
    np.testing.assert_allclose(other_rows, ref[:3], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "u,n,hkv,g,dh,p,m",
    [
        (2, 3, 3, 3, 64, 40, 37),  # SmolLM2's heads: 3 query heads per kv head
        (1, 10, 2, 7, 64, 45, 33),  # Qwen2.5-Coder-0.5B's: 7 per kv head, head size 64
        (1, 16, 2, 8, 32, 70, 130),  # Qwen2.5-3B's 8 per kv head; 16 rows: two row blocks
        (3, 9, 1, 1, 16, 20, 20),  # 9 rows: a block of 8 and one of 1
        (1, 4, 2, 2, 8, 9, 5),  # the tiny test models' head size, not a multiple of 16
    ],
)
def test_split_cache_attention_equals_xla(u, n, hkv, g, dh, p, m):
    """Inside `enabled()` the model's split-cache attention runs the kernel, which reads the filled suffix slots
    only; it equals XLA's masked whole-suffix attention for every fill, with invalid prefix slots masked."""
    rng = np.random.default_rng(u * 100 + n)
    r = u * n

    def arr(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    q, pk, pv = arr(r, hkv * g, dh), arr(u, hkv, dh, p), arr(u, hkv, p, dh)
    kt, vt = arr(r, hkv, dh, m), arr(r, hkv, m, dh)
    valid = jnp.asarray(rng.random((u, p)) < 0.7)
    xla = jax.jit(split_cache_attention)

    def kernel(*args):
        with cpu_decode.enabled():
            return split_cache_attention(*args)

    kernel = jax.jit(kernel)
    assert "mle_split_cache_attention" in kernel.lower(q, pk, pv, valid, kt, vt, jnp.int32(1)).as_text()
    assert "mle_split_cache_attention" not in xla.lower(q, pk, pv, valid, kt, vt, jnp.int32(1)).as_text()
    for filled in sorted({0, 1, m // 2, m}):
        args = (q, pk, pv, valid, kt, vt, jnp.int32(filled))
        np.testing.assert_allclose(kernel(*args), xla(*args), rtol=1e-5, atol=2e-6)


def test_a_row_with_nothing_to_attend_to_gives_zeros():
    """A padding prompt (no valid prefix slot) before its first token: zeros, not NaN."""
    q = jnp.ones((2, 2, 16), jnp.float32)
    prefix = jnp.ones((1, 1, 16, 8), jnp.float32)
    suffix = jnp.ones((2, 1, 16, 4), jnp.float32)
    with cpu_decode.enabled():
        out = jax.jit(split_cache_attention)(
            q, prefix, prefix.transpose(0, 1, 3, 2), jnp.zeros((1, 8), bool), suffix, suffix.transpose(0, 1, 3, 2), 0
        )
    np.testing.assert_array_equal(out, np.zeros((2, 2, 16)))


def _while_bodies(hlo: str) -> list[str]:
    names = re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo)
    blocks = {b.split(" ", 1)[0].lstrip("%"): b for b in hlo.split("\n\n") if b.strip()}
    return [blocks[name] for name in names if name in blocks]


def test_a_decode_loop_packs_its_weights_once_outside_the_loop():
    """`packed_weights` packs every dense weight of a decode step (the 7 projections of each layer and the tied
    head) before the loop: the loop's body multiplies by the panels and packs nothing."""
    model = numpy_random_model(Qwen2ForCausalLM, Qwen2Config(**{**TINY, "tie_word_embeddings": True}), seed=3)
    cfg = model.config
    dh, hkv, layers = cfg.head_dim, cfg.num_key_value_heads, cfg.num_hidden_layers
    prefix_k = tuple(jnp.zeros((1, hkv, dh, 8)) for _ in range(layers))
    prefix_v = tuple(jnp.zeros((1, hkv, 8, dh)) for _ in range(layers))

    graphdef, state = nnx.split(model)

    def steps(state, tokens):  # the weights are arguments, as in the sampler's decode (not constants to fold)
        model = nnx.merge(graphdef, state)
        cache = empty_suffix(prefix_k, prefix_v, jnp.ones((1, 8), bool), jnp.array([8]), 4, 16)
        with cpu_decode.enabled(), cpu_decode.packed_weights(lambda: model.decode(tokens, cache)):

            def body(i, c):
                tok, cache = c
                logits, cache = model.decode(tok, cache)
                return jnp.argmax(logits, -1).astype(jnp.int32), cache

            return jax.lax.fori_loop(0, 5, body, (tokens, cache))[0]

    hlo = jax.jit(steps).lower(state, jnp.zeros(4, jnp.int32)).compile().as_text()
    (body,) = _while_bodies(hlo)
    assert body.count('custom_call_target="mle_dense_packed"') == 7 * layers + 1
    assert body.count('custom_call_target="mle_split_cache_attention"') == layers
    packed = {f"f32[{-(-n // 32)},{k},32]" for k, n in _dense_shapes(cfg)}
    made = [m for m in re.findall(r"= (f32\[\d+,\d+,32\])\S* ([\w-]+)\(", hlo) if m[0] in packed]
    in_body = [m for m in re.findall(r"= (f32\[\d+,\d+,32\])\S* ([\w-]+)\(", body) if m[0] in packed]
    assert {op for _, op in made} - {"get-tuple-element", "parameter", "tuple"}, "the weights are packed somewhere"
    assert {op for _, op in in_body} <= {"get-tuple-element", "parameter"}, f"packed inside the loop: {in_body}"


def _dense_shapes(cfg) -> list[tuple[int, int]]:
    d, f, dh = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    return [(d, hq * dh), (d, hkv * dh), (hq * dh, d), (d, f), (f, d), (d, cfg.vocab_size)]


def test_only_a_decode_step_reaches_the_kernels():
    """The model knows no kernels (mle_jax.models.ops is its one seam): a training step of the model, traced with the
    library built, calls no kernel, even inside `enabled()` (the decode loop packs its weights: the test above)."""
    model = numpy_random_model(Qwen2ForCausalLM, Qwen2Config(**TINY), seed=5)
    graphdef, state = nnx.split(model)
    tokens = jnp.ones((2, 6), jnp.int32)

    def loss(state):
        return nnx.merge(graphdef, state)(tokens).mean()

    train = jax.jit(jax.grad(loss)).lower(state).as_text()
    assert "mle_dense_packed" not in train and "mle_split_cache_attention" not in train
    assert ops.active_backend() is None
    with cpu_decode.enabled():
        assert ops.active_backend() is cpu_decode.BACKEND and cpu_decode.active()
        inside = jax.jit(jax.grad(loss)).lower(state).as_text()
    assert "mle_dense_packed" not in inside  # outside `packed_weights` a weight stays the model's own
    assert ops.active_backend() is None
