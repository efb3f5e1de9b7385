"""Where one decode step of the JAX sampler spends its time, and the memory bandwidth it is bound by: the `profile`
stage of bench/smollm2_pizza.py (imported from there; bench/ is on sys.path when a bench runs as a script).

Every time is the best of a few calls of one compiled program on inputs already on the device (compile excluded).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mle_jax.kernels import cpu_decode
from mle_jax.models import qwen2
from mle_jax.models.decoding import sample_token
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.split_cache import empty_suffix
from mle_jax.sampling.jax_sampler import _prefill as prefill
from mle_jax.sampling.jax_sampler import phase_sizes

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


@contextlib.contextmanager
def attention_without(part: str) -> Iterator[None]:
    """While tracing inside this block, the model's split-cache attention skips its `part` ("suffix": reads one slot
    of each row's generated keys; "prefix": one slot of the prompt's; "both": no attention at all), for ablations:
    a step's time with and without a part is that part's cost."""
    full = qwen2.split_cache_attention

    def ablated(q, pk, pv, pvalid, kt, vt, filled):
        if part == "both":
            return q + 0 * (kt[:, :1, :1, :1].sum() + pk[:, :1, :1, :1].sum())
        if part == "suffix":  # the kernel reads the filled slots only: none; XLA's attention reads a 1-slot suffix
            if cpu_decode.active():
                return full(q, pk, pv, pvalid, kt, vt, jnp.zeros_like(filled))
            return full(q, pk, pv, pvalid, kt[..., :1], vt[:, :, :1], filled)
        return full(q, pk[..., :1], pv[:, :, :1], pvalid[:, :1], kt, vt, filled)

    qwen2.split_cache_attention = ablated
    try:
        yield
    finally:
        qwen2.split_cache_attention = full


def per_step_ms(
    graphdef: Any, state: Any, cache: Any, tok: jax.Array, steps: int = 16, ablate: str = "", kernels: bool = False
) -> float:
    """Milliseconds per decode step of `cache` (the sampler's loop: each step's greedy token fed to the next, the
    cache carried in place): (time of steps + 1 steps - time of 1 step) / steps, so that the copy of the
    undonated input cache that each call makes cancels out. ablate: a part of the attention to skip
    (`attention_without`). kernels: the step on mle_jax.kernels.cpu_decode, its weights packed before the loop
    (as the sampler's decode runs it); otherwise XLA's own ops."""

    @functools.partial(jax.jit, static_argnums=3)
    def run(state, cache, tok, k):
        model = nnx.merge(graphdef, state)

        def body(_, carry):
            tok, cache = carry
            logits, cache = model.decode(tok, cache)
            return jnp.argmax(logits, -1).astype(jnp.int32), cache

        with cpu_decode.enabled(kernels), cpu_decode.packed_weights(lambda: model.decode(tok, cache)):
            return jax.lax.fori_loop(0, k, body, (tok, cache))

    with attention_without(ablate) if ablate else contextlib.nullcontext():
        long, short = best_ms(run, state, cache, tok, steps + 1, calls=5), best_ms(run, state, cache, tok, 1, calls=5)
    return (long - short) / steps


def head_ms(graphdef: Any, state: Any, h: jax.Array, kernels: bool = False) -> float:
    """Milliseconds of the LM head alone (logits of every row of h [rows, 1, D] over the vocabulary); kernels: by
    the packed-weight kernel (packing excluded: it is done once per decode phase, as in the sampler)."""

    def logits(state, h):
        model = nnx.merge(graphdef, state)
        return model.logits_from_hidden(h)

    if not kernels:
        return best_ms(jax.jit(logits), state, h)
    model = nnx.merge(graphdef, state)
    panels = jax.jit(cpu_decode.pack)(model.head_weight())
    vocab = model.config.vocab_size
    return best_ms(jax.jit(lambda p, h: cpu_decode.dense(h[:, 0], cpu_decode.Packed(p, vocab))), panels, h)


def step_profile(model: Qwen2ForCausalLM, rows: int, prompt: int, budget: int, kernels: bool = False) -> dict:
    """One decode step of `rows` samples of one prompt of `prompt` slots with up to `budget` generated tokens, in ms
    (kernels: on mle_jax.kernels.cpu_decode, as the sampler runs it where the library is built; otherwise XLA's ops):

    phase_step_ms: a step in each of the sampler's decode phases (`phase_sizes(budget)`: a suffix of that many
      slots per row, half filled), the cache updated in place as in the sampler's loop (`per_step_ms`);
    last_phase_without_ms: a step of the last phase without its suffix attention, without its prefix attention,
      and without either (the weights, the LM head, norms and the token's sampling): what each part costs;
    lm_head_ms: the LM head alone (logits of every row over the vocabulary);
    sample_ms: drawing the tokens from [rows, V] logits (T = 0.7, and with top-p 0.95, which sorts the vocabulary);
    prefill_ms: the prompt through the model once (the sampler's prefill of a distinct prompt);
    host_round_trip_ms: one jitted call and a device_get of a [rows] array: what a decode loop that went back to
      the host for every token would pay per step (the sampler's loop is a lax.while_loop: it pays it once a phase).
    """
    graphdef, state = nnx.split(model)
    cfg = model.config
    tok = jnp.ones((rows,), jnp.int32)
    shape_k = (1, cfg.num_key_value_heads, cfg.head_dim, prompt)
    shape_v = (1, cfg.num_key_value_heads, prompt, cfg.head_dim)
    pk = tuple(jnp.full(shape_k, 0.01, model.dtype) for _ in range(cfg.num_hidden_layers))
    pv = tuple(jnp.ones(shape_v, model.dtype) for _ in range(cfg.num_hidden_layers))

    def cache(size: int):
        c = empty_suffix(pk, pv, jnp.ones((1, prompt), bool), jnp.full((1,), prompt), rows, size)
        return c.replace(index=jnp.int32(size // 2))

    sizes = phase_sizes(budget)
    out: dict[str, Any] = {"rows": rows, "prompt_slots": prompt, "budget_slots": budget, "phases": sizes}
    out["cpu_kernels"] = kernels
    out["phase_step_ms"] = [round(per_step_ms(graphdef, state, cache(n), tok, kernels=kernels), 1) for n in sizes]
    out["last_phase_without_ms"] = {
        part: round(per_step_ms(graphdef, state, cache(sizes[-1]), tok, ablate=part, kernels=kernels), 1)
        for part in ("suffix", "prefix", "both")
    }
    h = jnp.ones((rows, 1, cfg.hidden_size), model.dtype)
    out["lm_head_ms"] = round(head_ms(graphdef, state, h, kernels), 1)
    logits = jax.random.normal(jax.random.key(0), (rows, cfg.vocab_size))
    for name, top_p in (("sample_ms", 1.0), ("sample_top_p_ms", 0.95)):
        draw = jax.jit(lambda lg, k, p=top_p: sample_token(lg, k, jnp.float32(0.7), jnp.float32(p), jnp.int32(-1)))
        out[name] = round(best_ms(draw, logits, jax.random.key(1)), 2)
    tokens, mask = jnp.ones((1, prompt), jnp.int32), jnp.ones((1, prompt), jnp.int32)
    out["prefill_ms"] = round(best_ms(prefill, graphdef, state, tokens, mask, calls=2), 1)
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
    ap.add_argument("--kernels", action="store_true", help="the step on mle_jax.kernels.cpu_decode (make kernels)")
    a = ap.parse_args()
    if a.path:
        model = from_pretrained(a.path)
    else:
        model = Qwen2ForCausalLM(Qwen2Config.from_model_config(base.tiny_model()), nnx.Rngs(0))
    out = {"bandwidth": memory_bandwidth(), "weight_bytes": weight_bytes(model),
           "kv_bytes_per_token": kv_bytes_per_token(model),
           **step_profile(model, a.rows, a.prompt, a.budget, a.kernels)}  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
