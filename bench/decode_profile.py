"""Where one decode step of the JAX sampler spends its time, and the memory bandwidth it is bound by: the `profile`
stage of bench/smollm2_pizza.py (imported from there; bench/ is on sys.path when a bench runs as a script).

Every time is the best of a few calls of one compiled program on inputs already on the device (compile excluded).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mle_jax.models.decoding import sample_token
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.split_cache import empty_suffix
from mle_jax.sampling.jax_sampler import _prefill as prefill

GB = 1e9


def best_ms(fn: Callable[..., Any], *args: Any, calls: int = 5) -> float:
    """Milliseconds of the fastest of `calls` runs of fn(*args) (after one warm-up call)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)


def memory_bandwidth() -> dict[str, float]:
    """Read bandwidth of this machine in GB/s: a sum over 1 GiB of float32, by XLA (all cores) and by numpy (one)."""
    x = np.ones(2**28, np.float32)
    on_device = jnp.asarray(x)
    total = jax.jit(jnp.sum)
    return {
        "xla_sum_gbs": round(x.nbytes / best_ms(total, on_device) / 1e-3 / GB, 1),
        "numpy_sum_gbs": round(x.nbytes / best_ms(np.sum, x) / 1e-3 / GB, 1),
    }


def kv_bytes_per_token(model: Qwen2ForCausalLM) -> int:
    """Bytes of keys and values one token holds in the cache (all layers)."""
    c = model.config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * jnp.dtype(model.dtype).itemsize


def weight_bytes(model: Qwen2ForCausalLM) -> dict[str, int]:
    """Bytes of the weights a decode step reads: all of them (`total`), of which the tied embedding that the
    LM head reads (`lm_head`)."""
    params = nnx.state(model, nnx.Param)
    total = sum(x.nbytes for x in jax.tree.leaves(params))
    return {"total": int(total), "lm_head": int(model.model.embed_tokens[...].nbytes)}


def step_profile(
    model: Qwen2ForCausalLM,
    rows: int,
    prompt: int,
    budget: int,
    fills: tuple[int, ...],
    bf16: Qwen2ForCausalLM | None = None,
) -> dict:
    """One decode step of `rows` samples of one prompt of `prompt` slots with `budget` generated slots, in ms:

    old_step_ms: the sampler before issue 37 (one KVCache of prompt + budget slots per row, every slot read)
      at each fill (generated tokens so far);
    step_ms: the split cache (the prompt once, each row's filled suffix blocks) at each fill;
    layers_ms: the step without its LM head and with a 16-slot prompt at fill 1: the weight reads (and their
      matmuls) alone, and layers_bf16_ms the same with `bf16` (the model in bfloat16, when given); lm_head_ms: the
      LM head alone (logits of every row over the vocabulary);
    sample_ms: drawing the tokens from [rows, V] logits (T = 0.7, and with top-p 0.95, which sorts the vocabulary);
    prefill_ms: the prompt through the model once (the sampler's prefill of a distinct prompt); old_prefill_ms: the
      sampler before issue 37's prefill of all `rows` copies of it into their caches of prompt + budget slots;
    host_round_trip_ms: one jitted call and a device_get of a [rows] array: what a decode loop that went back to
      the host for every token would pay per step (the sampler's loop is a lax.while_loop: it pays it once).
    """
    graphdef, state = nnx.split(model)
    cfg = model.config
    tok = jnp.ones((rows,), jnp.int32)

    def split_cache(prefix_len: int, fill: int):
        shape_k = (1, cfg.num_key_value_heads, cfg.head_dim, prefix_len)
        shape_v = (1, cfg.num_key_value_heads, prefix_len, cfg.head_dim)
        pk = tuple(jnp.full(shape_k, 0.01, model.dtype) for _ in range(cfg.num_hidden_layers))
        pv = tuple(jnp.ones(shape_v, model.dtype) for _ in range(cfg.num_hidden_layers))
        cache = empty_suffix(pk, pv, jnp.ones((1, prefix_len), bool), jnp.full((1,), prefix_len), rows, budget)
        return cache.replace(index=jnp.int32(fill - 1))

    @jax.jit
    def step(state, cache, tok):
        return nnx.merge(graphdef, state).decode(tok, cache)

    @jax.jit
    def layers(state, cache, tok):
        return nnx.merge(graphdef, state).model.decode(tok, cache)

    @jax.jit
    def old_step(state, cache, tok):
        return nnx.merge(graphdef, state)(tok[:, None], attention_mask=jnp.ones((rows, 1), jnp.int32), cache=cache)

    out: dict[str, Any] = {"rows": rows, "prompt_slots": prompt, "budget_slots": budget, "fills": list(fills)}
    out["step_ms"] = [round(best_ms(step, state, split_cache(prompt, f), tok), 1) for f in fills]
    old = []
    for f in fills:
        cache = model.init_cache(rows, prompt + budget)
        cache = cache.replace(index=jnp.int32(prompt + f - 1), valid=jnp.ones((rows, prompt + budget), bool))
        old.append(round(best_ms(old_step, state, cache, tok), 1))
    out["old_step_ms"] = old
    out["layers_ms"] = round(best_ms(layers, state, split_cache(16, 1), tok), 1)
    if bf16 is not None:  # the same weights in bfloat16 (half the bytes), computed in bfloat16
        graphdef16, state16 = nnx.split(bf16)
        cache16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if x.dtype == jnp.float32 else x, split_cache(16, 1))
        step16 = jax.jit(lambda state, cache, tok: nnx.merge(graphdef16, state).model.decode(tok, cache))
        out["layers_bf16_ms"] = round(best_ms(step16, state16, cache16, tok), 1)
    h = jnp.ones((rows, 1, cfg.hidden_size), model.dtype)
    out["lm_head_ms"] = round(best_ms(jax.jit(lambda s, h: nnx.merge(graphdef, s).logits_from_hidden(h)), state, h), 1)
    logits = jax.random.normal(jax.random.key(0), (rows, cfg.vocab_size))
    for name, top_p in (("sample_ms", 1.0), ("sample_top_p_ms", 0.95)):
        draw = jax.jit(lambda lg, k, p=top_p: sample_token(lg, k, jnp.float32(0.7), jnp.float32(p), jnp.int32(-1)))
        out[name] = round(best_ms(draw, logits, jax.random.key(1)), 2)
    tokens, mask = jnp.ones((1, prompt), jnp.int32), jnp.ones((1, prompt), jnp.int32)
    out["prefill_ms"] = round(best_ms(prefill, graphdef, state, tokens, mask, calls=2), 1)

    @jax.jit
    def old_prefill(state, tokens, mask):
        model = nnx.merge(graphdef, state)
        return model.hidden_states(tokens, attention_mask=mask, cache=model.init_cache(rows, prompt + budget))

    tokens, mask = jnp.ones((rows, prompt), jnp.int32), jnp.ones((rows, prompt), jnp.int32)
    out["old_prefill_ms"] = round(best_ms(old_prefill, state, tokens, mask, calls=1), 1)
    bump = jax.jit(lambda x: x + 1)
    out["host_round_trip_ms"] = round(best_ms(lambda x: jax.device_get(bump(x)), tok, calls=50), 3)
    return out


def main() -> None:
    """One decode step of a model, split into its parts, as JSON: an HF folder (`--path`), or by default a tiny random
    Qwen2 (`configs/base.py` tiny_model: what `make bench` runs, in seconds)."""
    import argparse
    import json

    from configs import base
    from mle_jax.models.hf import from_pretrained
    from mle_jax.models.qwen2 import Qwen2Config

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default="", help="an HF model folder (default: a tiny random Qwen2)")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128, help="prompt slots")
    ap.add_argument("--budget", type=int, default=128, help="generated slots")
    a = ap.parse_args()
    if a.path:
        model = from_pretrained(a.path)
    else:
        model = Qwen2ForCausalLM(Qwen2Config.from_model_config(base.tiny_model()), nnx.Rngs(0))
    fills = (1, a.budget // 2, a.budget)
    out = {"bandwidth": memory_bandwidth(), "weight_bytes": weight_bytes(model),
           "kv_bytes_per_token": kv_bytes_per_token(model),
           **step_profile(model, a.rows, a.prompt, a.budget, fills)}  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
