"""In-process JAX sampler: batched prefill + decode over a preallocated KV cache, in one jit.

Prompts are LEFT-padded to a length bucket so every row writes the same cache slot each step
(per-row RoPE positions and valid-slot masks live in the cache, see mle_jax.models.qwen2). One
compiled program per (batch bucket, prompt bucket, max-tokens bucket); temperature, top-p, top-k
and max_tokens are traced arguments, so changing them never recompiles. The decode loop is a
`jax.lax.while_loop` that exits as soon as every row has produced a stop token.

Logprobs: for each sampled token, log_softmax(logits / temperature) (the full, untruncated
distribution: PPO's behaviour logprobs); with temperature == 0 (greedy), log_softmax(logits).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mle_jax.models.decoding import sample_token
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.tokenizer import stop_token_ids
from mle_jax.sampling.protocol import Completion, SamplingSettings, check_completion


def _bucket(n: int, minimum: int) -> int:
    """Smallest power of two >= max(n, minimum)."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new", "stop_ids", "pad_id"))
def _generate(
    graphdef,
    state,
    tokens: jax.Array,
    mask: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    max_tokens: jax.Array,
    *,
    max_new: int,
    stop_ids: tuple[int, ...],
    pad_id: int,
):
    """tokens/mask [B, P] left-padded -> (out tokens [B, max_new], logprobs [B, max_new], lengths [B],
    stopped [B] bool). Rows whose mask is all zero are batch padding and count as stopped."""
    model = nnx.merge(graphdef, state)
    b, p = tokens.shape
    cache = model.init_cache(b, p + max_new)
    h, cache = model.hidden_states(tokens, attention_mask=mask, cache=cache)
    logits = model.logits_from_hidden(h[:, -1:])  # left padding: the last slot is every row's last token
    stops = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)

    def pick(logits, key):
        return sample_token(logits, key, temperature, top_p, top_k)

    key, sub = jax.random.split(key)
    tok, lp = pick(logits[:, -1], sub)
    out_tok = jnp.full((b, max_new), pad_id, jnp.int32).at[:, 0].set(tok)
    out_lp = jnp.zeros((b, max_new), jnp.float32).at[:, 0].set(lp)
    done = jnp.isin(tok, stops) | ~mask.any(axis=1)
    lengths = jnp.where(mask.any(axis=1), 1, 0).astype(jnp.int32)

    def cond(carry):
        step, _, _, _, _, done, _, _ = carry
        return (step < max_tokens) & ~jnp.all(done)

    def body(carry):
        step, tok, cache, out_tok, out_lp, done, lengths, key = carry
        logits, cache = model(tok[:, None], attention_mask=jnp.ones((b, 1), jnp.int32), cache=cache)
        key, sub = jax.random.split(key)
        new, lp = pick(logits[:, 0], sub)
        new = jnp.where(done, pad_id, new)
        lp = jnp.where(done, 0.0, lp)
        out_tok = jax.lax.dynamic_update_slice(out_tok, new[:, None], (0, step))
        out_lp = jax.lax.dynamic_update_slice(out_lp, lp[:, None], (0, step))
        lengths = lengths + (~done).astype(jnp.int32)
        done = done | jnp.isin(new, stops)
        return step + 1, new, cache, out_tok, out_lp, done, lengths, key

    carry = (jnp.ones((), jnp.int32), tok, cache, out_tok, out_lp, done, lengths, key)
    _, _, _, out_tok, out_lp, done, lengths, _ = jax.lax.while_loop(cond, body, carry)
    stopped = jnp.isin(jnp.take_along_axis(out_tok, jnp.maximum(lengths - 1, 0)[:, None], 1)[:, 0], stops)
    return out_tok, out_lp, lengths, stopped & (lengths > 0)


class JaxSampler:
    """`Sampler` over an in-process Qwen2ForCausalLM.

    model: the policy (its current params are copied at construction; `sync` swaps them).
    tokenizer: optional HF tokenizer (decodes text; its eos and ChatML stop tokens become stop ids).
    eos_ids: explicit stop ids (used instead of the tokenizer's when given; [] = never stop early).
    min_prompt_bucket / min_batch_bucket / min_new_bucket: smallest padded prompt length / batch size /
    max-tokens (all rounded up to powers of two).
    max_batch: most rows decoded together (more are split into consecutive chunks); None = all at once.
    copy_params: keep a private copy of the weights (at construction and on `sync`), so a learner that
    donates or updates its own buffers never invalidates the sampler's. False shares them (saves memory).
    """

    name = "jax"  # its sampler.backend (sampling/registry.py)

    @classmethod
    def from_settings(
        cls,
        settings: Any,
        model: Qwen2ForCausalLM,
        tokenizer: Any,
        workdir: Path,
        url: str | None = None,
        frozen: bool = False,
    ) -> JaxSampler:
        """The in-process sampler of `model` (it reads no field of the sampler section; url is not used). frozen:
        of a clone of `model`, whose weights stay as they are while the policy's change."""
        return cls(nnx.clone(model) if frozen else model, tokenizer)

    @classmethod
    def preflight(cls, settings: Any, instrumenter_url: str | None) -> list[str]:
        """Nothing outside this process: no problems."""
        return []

    @classmethod
    def memory(cls, settings: Any, samplers: int, device_memory_gib: float, decode_gib: float) -> dict[str, Any]:
        """Its device memory: the compiled decode step's peak (XLA's memory analysis)."""
        return {
            "gib": decode_gib,
            "method": "the JAX sampler's decode step (XLA memory analysis: its weights, KV cache, temporaries)",
        }

    def __init__(
        self,
        model: Qwen2ForCausalLM,
        tokenizer: Any = None,
        eos_ids: Sequence[int] | None = None,
        pad_id: int | None = None,
        version: int = 0,
        seed: int = 0,
        min_prompt_bucket: int = 16,
        min_batch_bucket: int = 1,
        min_new_bucket: int = 16,
        copy_params: bool = True,
        max_batch: int | None = None,
    ):
        self.tokenizer = tokenizer
        self.copy_params = copy_params
        self.graphdef, self.state = nnx.split(model)
        if copy_params:
            self.state = jax.tree.map(jnp.copy, self.state)
        self.config = model.config
        self.version = version
        if eos_ids is None:
            eos_ids = stop_token_ids(tokenizer) if tokenizer is not None else []
            if model.config.eos_token_id is not None:
                eos = model.config.eos_token_id
                eos_ids = list(eos_ids) + (list(eos) if isinstance(eos, list | tuple) else [eos])
        self.stop_ids = tuple(sorted({int(i) for i in eos_ids}))
        if pad_id is None:
            pad_id = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        self.pad_id = int(pad_id if pad_id is not None else 0)
        self._key = jax.random.key(seed)
        self.min_prompt_bucket = min_prompt_bucket
        self.min_batch_bucket = min_batch_bucket
        self.min_new_bucket = min_new_bucket
        self.max_batch = max_batch

    def reseed(self, seed: int) -> None:
        """Restarts the stream of sampling keys at `seed` (a fresh sampler's stream starts at 0): runs that differ
        only in their seed then draw different samples from the same policy."""
        self._key = jax.random.key(seed)

    def sync(self, params: Any, version: int) -> None:
        """Takes new weights: an nnx.State of the policy (all of it or its Params) or the module itself."""
        if isinstance(params, nnx.Module):
            params = nnx.state(params)
        if self.copy_params:
            params = jax.tree.map(jnp.copy, params)
        model = nnx.merge(self.graphdef, self.state)
        nnx.update(model, params)
        self.graphdef, self.state = nnx.split(model)
        self.version = int(version)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int = 256,
        top_k: int = -1,
        seed: int | None = None,
    ) -> list[Completion]:
        """len(prompts) * n completions, grouped by prompt (prompt 0's n first)."""
        if not prompts:
            return []
        SamplingSettings(temperature, top_p, top_k, max_tokens)  # validates
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        rows = [list(p) for p in prompts for _ in range(n)]
        if any(len(r) == 0 for r in rows):
            raise ValueError("every prompt needs at least one token")
        vocab = self.config.vocab_size
        bad = [t for r in rows for t in r if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        if seed is None:
            self._key, key = jax.random.split(self._key)
        else:
            key = jax.random.key(seed)
        chunk = self.max_batch or len(rows)
        results = [
            self._generate_rows(rows[i : i + chunk], jax.random.fold_in(key, i), temperature, top_p, top_k, max_tokens)
            for i in range(0, len(rows), chunk)
        ]
        out_tok = [r for res in results for r in res[0]]
        out_lp = [r for res in results for r in res[1]]
        lengths = [r for res in results for r in res[2]]
        stopped = [r for res in results for r in res[3]]
        completions = []
        for i, r in enumerate(rows):
            ids = np.asarray(out_tok[i][: lengths[i]], np.int32)
            text = self.tokenizer.decode(ids.tolist(), skip_special_tokens=True) if self.tokenizer else ""
            completions.append(
                check_completion(
                    Completion(
                        prompt_ids=np.asarray(r, np.int32),
                        token_ids=ids,
                        logprobs=np.asarray(out_lp[i][: lengths[i]], np.float32),
                        text=text,
                        finish_reason="stop" if stopped[i] else "length",
                        version=self.version,
                    )
                )
            )
        return completions

    def _generate_rows(self, rows, key, temperature, top_p, top_k, max_tokens):
        """One compiled call over `rows` (token-id lists) -> numpy (tokens, logprobs, lengths, stopped)."""
        b = _bucket(len(rows), self.min_batch_bucket)
        p = _bucket(max(len(r) for r in rows), self.min_prompt_bucket)
        m = _bucket(max_tokens, self.min_new_bucket)
        tokens = np.full((b, p), self.pad_id, np.int32)
        mask = np.zeros((b, p), np.int32)
        for i, r in enumerate(rows):
            tokens[i, p - len(r) :] = r
            mask[i, p - len(r) :] = 1
        out_tok, out_lp, lengths, stopped = jax.device_get(
            _generate(
                self.graphdef,
                self.state,
                jnp.asarray(tokens),
                jnp.asarray(mask),
                key,
                jnp.float32(temperature),
                jnp.float32(top_p),
                jnp.int32(top_k),
                jnp.int32(max_tokens),
                max_new=m,
                stop_ids=self.stop_ids,
                pad_id=self.pad_id,
            )
        )
        n = len(rows)
        return out_tok[:n], out_lp[:n], lengths[:n], stopped[:n]
