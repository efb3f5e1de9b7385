"""Our Flax Qwen2 against transformers' torch Qwen2ForCausalLM, and KV-cache decoding."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from configs import base
from mle_jax.models import hf
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.split_cache import empty_suffix, grow, split_cache_attention
from tests.models.reference import TINY, jax_logits, numpy_random_model, torch_logits, torch_qwen2

pytestmark = pytest.mark.model

CASES = {
    "untied-gqa2": dict(tie_word_embeddings=False, num_key_value_heads=2),
    "tied-gqa1": dict(tie_word_embeddings=True, num_key_value_heads=4),
    "tied-gqa4": dict(tie_word_embeddings=True, num_key_value_heads=1),
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    """(torch model, our model loaded from the torch model's save_pretrained folder)."""
    tm = torch_qwen2(seed=len(request.param), **CASES[request.param])
    path = tmp_path_factory.mktemp(request.param)
    tm.save_pretrained(path)
    return tm, hf.from_pretrained(path)


def test_num_parameters_counts_what_the_model_holds(pair):
    """Qwen2Config.num_parameters (preflight's description of a path-less model) against the torch model's count."""
    tm, ours = pair
    assert ours.config.num_parameters() == sum(p.numel() for p in tm.parameters())


def test_logits_match_transformers(pair):
    tm, ours = pair
    tokens = np.random.RandomState(0).randint(0, TINY["vocab_size"], (3, 13))
    ref = torch_logits(tm, tokens)
    got = jax_logits(ours, tokens)
    assert got.shape == (3, 13, TINY["vocab_size"]) and got.dtype == np.float32
    assert np.abs(got - ref).max() <= 1e-4


def test_right_padded_rows_match_unpadded(pair):
    tm, ours = pair
    rng = np.random.RandomState(1)
    tokens = rng.randint(0, TINY["vocab_size"], (2, 10))
    mask = np.ones((2, 10), np.int32)
    mask[1, 6:] = 0  # row 1 has 6 real tokens
    got = jax_logits(ours, tokens, mask)
    ref_short = torch_logits(tm, tokens[1:, :6])
    assert np.abs(got[1, :6] - ref_short[0]).max() <= 1e-4
    assert np.abs(got[0] - torch_logits(tm, tokens[:1])[0]).max() <= 1e-4


def test_left_padded_rows_match_unpadded(pair):
    _, ours = pair
    rng = np.random.RandomState(2)
    tokens = rng.randint(0, TINY["vocab_size"], (1, 7))
    padded = np.concatenate([np.zeros((1, 3), int), tokens], axis=1)
    mask = np.concatenate([np.zeros((1, 3), np.int32), np.ones((1, 7), np.int32)], axis=1)
    fwd = nnx.jit(lambda m, t, mk: m(t, attention_mask=mk))
    got = np.asarray(fwd(ours, jnp.asarray(padded, jnp.int32), jnp.asarray(mask)))
    ref = np.asarray(fwd(ours, jnp.asarray(tokens, jnp.int32), jnp.ones((1, 7), jnp.int32)))
    assert np.abs(got[:, 3:] - ref).max() <= 1e-5


def _set_attn_block(model: Qwen2ForCausalLM, block: int | None) -> None:
    for layer in model.model.layers:
        layer.attn.attn_block = block


@pytest.mark.parametrize("variant", [4, 5, 13, "dot_product"])
def test_training_attention_matches_transformers_and_unblocked(pair, variant):
    """Query blocks that only score their key prefix (block 4, 5, 13), and attention="dot_product"
    (jax.nn.dot_product_attention over each row's real-token count: XLA's on CPU, the same call cuDNN serves on a
    GPU), give torch's logits on real positions, with right padding and T not a multiple of the block, and the
    one-block loss and gradients over every position (pad queries see the same keys)."""
    tm, ours = pair
    rng = np.random.RandomState(4)
    tokens = rng.randint(0, TINY["vocab_size"], (2, 13))
    mask = np.ones((2, 13), np.int32)
    mask[1, 9:] = 0
    w = jnp.asarray(rng.randn(2, 13, TINY["vocab_size"]), jnp.float32)

    def loss(m):
        return jnp.sum(m(jnp.asarray(tokens, jnp.int32), attention_mask=jnp.asarray(mask)) * w)

    grad = nnx.jit(nnx.value_and_grad(loss))
    config = ours.model.config
    try:
        _set_attn_block(ours, None)
        ref_loss, ref_grads = grad(ours)
        if variant == "dot_product":
            ours.model.config = dataclasses.replace(config, attention="dot_product")
        else:
            _set_attn_block(ours, variant)
        got = jax_logits(ours, tokens, mask)
        got_loss, got_grads = grad(ours)
    finally:
        _set_attn_block(ours, Qwen2Config().attn_block)
        ours.model.config = config
    assert np.abs(got[0] - torch_logits(tm, tokens[:1])[0]).max() <= 1e-4
    assert np.abs(got[1, :9] - torch_logits(tm, tokens[1:, :9])[0]).max() <= 1e-4
    assert abs(float(got_loss) - float(ref_loss)) <= 1e-3 * max(1.0, abs(float(ref_loss)))
    for a, b in zip(jax.tree.leaves(got_grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


def test_an_unknown_attention_is_refused():
    with pytest.raises(ValueError, match="attention='flash' is not one of"):
        dataclasses.replace(Qwen2Config(), attention="flash")


def test_kv_cache_decoding_equals_full_recompute(pair):
    """Left-padded prefill, then one token at a time: every step's logits equal a full forward."""
    _, ours = pair
    rng = np.random.RandomState(3)
    b, p, steps = 3, 6, 5
    lengths = np.array([6, 3, 1])
    prompt = rng.randint(1, TINY["vocab_size"], (b, p))
    pmask = (np.arange(p)[None] >= (p - lengths)[:, None]).astype(np.int32)
    prompt = prompt * pmask
    new = rng.randint(1, TINY["vocab_size"], (b, steps))
    full = np.concatenate([prompt, new], axis=1)
    fmask = np.concatenate([pmask, np.ones((b, steps), np.int32)], axis=1)
    ref = jax_logits(ours, full, fmask)

    step = nnx.jit(lambda m, t, mk, c: m(t, attention_mask=mk, cache=c))
    cache = ours.init_cache(b, 16)
    logits, cache = step(ours, jnp.asarray(prompt, jnp.int32), jnp.asarray(pmask), cache)
    real = pmask.astype(bool)
    assert np.abs(np.asarray(logits)[real] - ref[:, :p][real]).max() <= 1e-4
    for i in range(steps):
        tok = jnp.asarray(new[:, i : i + 1], jnp.int32)
        logits, cache = step(ours, tok, jnp.ones((b, 1), jnp.int32), cache)
        assert np.abs(np.asarray(logits)[:, 0] - ref[:, p + i]).max() <= 1e-4
    np.testing.assert_array_equal(np.asarray(cache.positions), lengths + steps)


def test_split_cache_decoding_equals_full_recompute(pair):
    """Two left-padded prompts prefilled once each, two rows continuing each with tokens of their own, the suffix
    grown when full (2 slots, then 4, then 8, as the sampler's phases): every step's logits equal a full forward of
    the row."""
    _, ours = pair
    rng = np.random.RandomState(4)
    u, n, p, steps = 2, 2, 6, 5
    lengths = np.array([6, 2])
    prompt = rng.randint(1, TINY["vocab_size"], (u, p)) * (np.arange(p)[None] >= (p - lengths)[:, None])
    pmask = (prompt > 0).astype(np.int32)
    new = rng.randint(1, TINY["vocab_size"], (u * n, steps))
    rows = np.repeat(prompt, n, axis=0)
    full = np.concatenate([rows, new], axis=1)
    ref = jax_logits(ours, full, np.concatenate([np.repeat(pmask, n, axis=0), np.ones_like(new)], axis=1))

    _, pre = nnx.jit(lambda m, t, mk: m(t, attention_mask=mk, cache=m.init_cache(u, p)))(ours, prompt, pmask)
    cache = empty_suffix(pre.k, pre.v, pre.valid, pre.positions, n, 2)
    step = nnx.jit(lambda m, t, c: m.decode(t, c))
    for i in range(steps):
        if i == cache.max_len:
            cache = cache.replace(**dict(zip(("k", "v"), grow(cache.k, cache.v, 2 * i), strict=True)))
        logits, cache = step(ours, jnp.asarray(new[:, i], jnp.int32), cache)
        assert np.abs(np.asarray(logits) - ref[:, p + i]).max() <= 1e-4
    np.testing.assert_array_equal(np.asarray(cache.positions), np.repeat(lengths, n) + steps)


def test_split_cache_attention_is_one_softmax_over_prefix_and_filled_suffix():
    """Against softmax over the concatenated keys, for one filled slot, some and every slot."""
    rng = np.random.RandomState(0)
    u, n, hkv, g, dh, p, m = 2, 3, 2, 2, 8, 5, 8
    q = rng.randn(u * n, hkv * g, dh).astype(np.float32)
    pk, pv = rng.randn(u, hkv, p, dh).astype(np.float32), rng.randn(u, hkv, p, dh).astype(np.float32)
    sk, sv = rng.randn(u * n, hkv, m, dh).astype(np.float32), rng.randn(u * n, hkv, m, dh).astype(np.float32)
    valid = np.arange(p)[None] >= np.array([[0], [3]])  # prompt 1 is left-padded by 3
    for filled in (1, 4, 6, 8):
        got = split_cache_attention(
            jnp.asarray(q), pk.transpose(0, 1, 3, 2), pv, valid, sk.transpose(0, 1, 3, 2), sv, filled
        )
        for r in range(u * n):
            keys = np.concatenate([pk[r // n][:, valid[r // n]], sk[r, :, :filled]], axis=1)  # [Hkv, S, Dh]
            values = np.concatenate([pv[r // n][:, valid[r // n]], sv[r, :, :filled]], axis=1)
            for h in range(hkv * g):
                w = np.asarray(jax.nn.softmax(keys[h // g] @ q[r, h] / np.sqrt(dh)))
                np.testing.assert_allclose(np.asarray(got[r, h]), w @ values[h // g], rtol=1e-5, atol=1e-5)


def test_params_carry_logical_axes():
    cfg = Qwen2Config(**{k: v for k, v in TINY.items()})
    model = nnx.eval_shape(lambda: Qwen2ForCausalLM(cfg, nnx.Rngs(0)))
    flat = nnx.to_flat_state(nnx.state(model, nnx.Param))
    allowed = {"vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp", "norm"}
    for path, var in flat:
        axes = var.get_metadata()["out_sharding"]
        assert len(axes) == var.get_value().ndim, path
        assert set(axes) <= allowed, (path, axes)
    axes = {tuple(p): v.get_metadata()["out_sharding"] for p, v in flat}
    assert axes[("model", "layers", 0, "attn", "q_proj")] == ("embed", "q_heads", "head_dim")
    assert axes[("lm_head",)] == ("embed", "vocab")


def test_bf16_and_remat_run_and_differentiate():
    cfg = dataclasses.replace(Qwen2Config(**TINY), remat=True, num_hidden_layers=1)
    model = numpy_random_model(Qwen2ForCausalLM, cfg, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16)
    assert model.model.embed_tokens[...].dtype == jnp.bfloat16
    tokens = jnp.arange(12, dtype=jnp.int32).reshape(2, 6)

    def loss(m):
        logits = m(tokens)
        return -jnp.mean(jax.nn.log_softmax(logits[:, :-1]) * jax.nn.one_hot(tokens[:, 1:], cfg.vocab_size))

    grads = nnx.jit(nnx.grad(loss))(model)
    g = grads["model"]["layers"][0]["mlp"]["down_proj"][...]
    assert g.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(g))) and float(jnp.abs(g).sum()) > 0


@pytest.mark.parametrize("remat", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_scanned_layer_stack_equals_unrolled(remat, dtype):
    """scan_layers (one lax.scan over the stacked layer weights) gives the unrolled loop's logits and gradients;
    the weights keep their per-layer layout, so a scanned model takes the unrolled model's state as is."""
    cfg = dataclasses.replace(Qwen2Config(**TINY), num_hidden_layers=3, remat=remat)
    dt = jnp.dtype(dtype)
    unrolled = numpy_random_model(Qwen2ForCausalLM, cfg, dtype=dt, param_dtype=jnp.float32)
    scanned = numpy_random_model(
        Qwen2ForCausalLM, dataclasses.replace(cfg, scan_layers=True), dtype=dt, param_dtype=jnp.float32
    )
    nnx.update(scanned, nnx.state(unrolled))
    rng = np.random.RandomState(1)
    tokens = jnp.asarray(rng.randint(0, cfg.vocab_size, (2, 11)), jnp.int32)
    mask = jnp.asarray(np.arange(11)[None, :] < np.array([[11], [7]]), jnp.int32)  # one right-padded row

    def loss(m):
        logits = m(tokens, attention_mask=mask)
        return jnp.sum(jax.nn.log_softmax(logits[:, :-1]) * jax.nn.one_hot(tokens[:, 1:], cfg.vocab_size)), logits

    (l_u, logits_u), g_u = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(unrolled)
    (l_s, logits_s), g_s = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(scanned)
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(np.asarray(logits_s), np.asarray(logits_u), rtol=tol, atol=tol)
    flat_u, flat_s = dict(nnx.to_flat_state(g_u)), dict(nnx.to_flat_state(g_s))
    assert flat_u.keys() == flat_s.keys() and ("model", "layers", 2, "mlp", "up_proj") in flat_u
    # against the largest gradient: some are zero in exact arithmetic (a key bias shifts every score of a query
    # equally) and differ only by rounding noise
    scale = max(float(np.abs(np.asarray(g[...], np.float32)).max()) for g in flat_u.values())
    for path, gu in flat_u.items():
        gu, gs = np.asarray(gu[...], np.float32), np.asarray(flat_s[path][...], np.float32)
        assert float(np.abs(gs - gu).max()) <= tol * scale, path
    assert float(np.abs(np.asarray(flat_u[("model", "layers", 0, "attn", "q_proj")][...])).max()) > 0


@pytest.mark.parametrize("scan_layers", [False, True])
def test_remat_policy_dots_keeps_the_projections(scan_layers):
    """remat_policy="dots" keeps the projections' outputs for the backward: the gradients are those of no remat and
    of full remat, and the compiled backward recomputes fewer matmuls than full remat (only attention's)."""
    tokens = jnp.asarray(np.random.RandomState(1).randint(0, TINY["vocab_size"], (2, 11)), jnp.int32)
    dots, grads = {}, {}
    for name, kw in [("none", {}), ("full", {"remat": True}), ("dots", {"remat": True, "remat_policy": "dots"})]:
        cfg = dataclasses.replace(Qwen2Config(**TINY), num_hidden_layers=2, scan_layers=scan_layers, **kw)
        graphdef, state = nnx.split(numpy_random_model(Qwen2ForCausalLM, cfg))

        def loss(st, graphdef=graphdef):
            logits = nnx.merge(graphdef, st)(tokens)
            return jnp.sum(jax.nn.log_softmax(logits[:, :-1]) * jax.nn.one_hot(tokens[:, 1:], TINY["vocab_size"]))

        step = jax.jit(jax.grad(loss))
        dots[name] = step.lower(state).as_text().count("dot_general")
        grads[name] = jax.tree.leaves(step(state))
    assert dots["none"] < dots["dots"] < dots["full"], dots
    for name in ("full", "dots"):
        assert max(float(jnp.abs(a - b).max()) for a, b in zip(grads["none"], grads[name], strict=True)) < 1e-5
    with pytest.raises(ValueError, match="remat_policy"):
        Qwen2Config(**TINY, remat_policy="some")


def test_config_round_trips():
    cfg = Qwen2Config(**TINY)
    assert Qwen2Config.from_hf_dict(cfg.to_hf_dict()) == cfg
    m = ml_collections.ConfigDict({**TINY, "path": "", "dtype": "float32", "remat": True})
    assert Qwen2Config.from_model_config(m) == dataclasses.replace(cfg, remat=True)
    tiny = Qwen2Config.from_model_config(base.tiny_model())
    assert (tiny.hidden_size, tiny.num_key_value_heads, tiny.tie_word_embeddings) == (128, 2, True)
    with pytest.raises(ValueError, match="not a Qwen2 or Llama config"):
        Qwen2Config.from_hf_dict({**cfg.to_hf_dict(), "model_type": "gemma"})
