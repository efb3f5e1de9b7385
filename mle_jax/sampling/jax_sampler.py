"""In-process JAX sampler: each distinct prompt prefilled once, then its samples decoded together over a split
KV cache (mle_jax.models.split_cache), in jitted `lax.while_loop`s.

A call's rows (prompts x n) are laid out as grids of U distinct prompts x n samples (`plan_grids`). Each prompt's
prefill (left-padded to a length bucket) runs once; its keys and values become the prefix of its n rows, read once
per step for all of them, and each row's generated tokens' keys fill its own suffix. The decode runs in phases
(`phase_sizes`): each phase's steps read a suffix of a fixed length, masked to its filled slots, and the suffix
grows between phases, so a step reads about as many slots as are filled, with static shapes (no slicing copies).
One compiled prefill per prompt bucket and one program per decode phase of each (U bucket, n bucket, prompt bucket,
max-tokens bucket); temperature, top-p, top-k and max_tokens are traced arguments, so changing them never
recompiles (`warm_up` compiles them ahead). The decode exits as soon as every row has produced a stop token; it
returns to the host once per phase, never per token.

Logprobs: for each sampled token, log_softmax(logits / temperature) (the full, untruncated
distribution: PPO's behaviour logprobs); with temperature == 0 (greedy), log_softmax(logits).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mle_jax.kernels import cpu_decode
from mle_jax.models.decoding import sample_token
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.models.split_cache import SplitCache, empty_suffix, grow
from mle_jax.models.tokenizer import stop_token_ids
from mle_jax.sampling.protocol import Completion, SamplingSettings, check_completion

SUFFIX_PHASE = 256  # suffix slots of a decode's first phase (`phase_sizes`)


def _bucket(n: int, minimum: int) -> int:
    """Smallest power of two >= max(n, minimum)."""
    return max(minimum, 1 << max(0, int(n) - 1).bit_length())


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _prefill(graphdef, state, tokens: jax.Array, mask: jax.Array):
    """One prompt, tokens/mask [1, P] left-padded -> (logits [V] of its next token, per-layer keys
    [1, Hkv, Dh, P] and values [1, Hkv, P, Dh], valid [1, P] bool, length [1] int32)."""
    model = nnx.merge(graphdef, state)
    h, cache = model.hidden_states(tokens, attention_mask=mask, cache=model.init_cache(1, tokens.shape[1]))
    logits = model.logits_from_hidden(h[:, -1:])  # left padding: the last slot is the last token
    return logits[0, 0], cache.k, cache.v, cache.valid, cache.positions


def phase_sizes(max_new: int, first: int | None = SUFFIX_PHASE) -> list[int]:
    """The suffix lengths of the phases of a decode of up to `max_new` tokens: `first` slots, growing by `first`
    up to 4 * first, then doubling, up to max_new. A phase's steps read its whole suffix (masked to the filled
    slots), so a step reads at most `first` slots more than it needs up to 4 * first, and at most twice the filled
    ones past that; each size is one compiled program (4 for 1024 tokens, 5 for 2048). first None: one phase of
    max_new slots (one program, every step reading the whole budget)."""
    if first is None:
        return [max_new]
    if first < 1:
        raise ValueError(f"the first decode phase needs at least one slot, got {first}")
    sizes = [min(max_new, first)]
    while sizes[-1] < max_new:
        step = first if sizes[-1] < 4 * first else sizes[-1]
        sizes.append(min(max_new, sizes[-1] + step))
    return sizes


@functools.partial(jax.jit, static_argnames=("n", "max_new", "size", "stop_ids", "pad_id"))
def _start(
    prefix_k: tuple[jax.Array, ...],
    prefix_v: tuple[jax.Array, ...],
    prefix_valid: jax.Array,
    prefix_len: jax.Array,
    first_logits: jax.Array,
    live: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    *,
    n: int,
    max_new: int,
    size: int,
    stop_ids: tuple[int, ...],
    pad_id: int,
) -> tuple[jax.Array, ...]:
    """The decode's first token of each row, drawn from its prompt's prefill logits (first_logits [U, V]), and
    the carry of `_phase`: (step, tok [R], suffix keys and values of `size` empty slots per row, index, positions
    [R], out tokens [R, max_new], out logprobs [R, max_new], done [R], lengths [R], key). live [R] bool: False
    rows (grid padding) count as stopped."""
    r = live.shape[0]
    cache = empty_suffix(prefix_k, prefix_v, prefix_valid, prefix_len, n, size)
    stops = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)
    key, sub = jax.random.split(key)
    tok, lp = sample_token(jnp.repeat(first_logits, n, axis=0), sub, temperature, top_p, top_k)
    out_tok = jnp.full((r, max_new), pad_id, jnp.int32).at[:, 0].set(tok)
    out_lp = jnp.zeros((r, max_new), jnp.float32).at[:, 0].set(lp)
    done = jnp.isin(tok, stops) | ~live
    lengths = live.astype(jnp.int32)
    step = jnp.ones((), jnp.int32)
    return (step, tok, cache.k, cache.v, cache.index, cache.positions, out_tok, out_lp, done, lengths, key)


@functools.partial(jax.jit, static_argnames=("size",))
def _grow(carry: tuple[jax.Array, ...], *, size: int) -> tuple[jax.Array, ...]:
    """The carry (`_start`) with its suffix keys and values padded to `size` slots per row (split_cache.grow)."""
    return (*carry[:2], *grow(carry[2], carry[3], size), *carry[4:])


@functools.partial(jax.jit, static_argnames=("graphdef", "stop_ids", "pad_id", "kernels"), donate_argnames=("carry",))
def _phase(
    graphdef,
    state,
    prefix_k: tuple[jax.Array, ...],
    prefix_v: tuple[jax.Array, ...],
    prefix_valid: jax.Array,
    carry: tuple[jax.Array, ...],
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    max_tokens: jax.Array,
    *,
    stop_ids: tuple[int, ...],
    pad_id: int,
    kernels: bool = False,
) -> tuple[jax.Array, ...]:
    """One phase of the decode: tokens drawn in a `lax.while_loop` until the carry's suffix (`_start`, `_grow`) is
    full, every row has stopped, or max_tokens are out -> the carry (updated in place: it is donated). kernels: the
    step's matmuls and attention by mle_jax.kernels.cpu_decode where it is available."""
    model = nnx.merge(graphdef, state)
    step, tok, k, v, index, positions, *rest = carry
    cache = SplitCache(prefix_k, prefix_v, prefix_valid, k, v, index, positions)
    sampling = (temperature, top_p, top_k, max_tokens, stop_ids, pad_id)
    # the kernels' weights packed here, once per phase, outside the loop
    with cpu_decode.enabled(kernels), cpu_decode.packed_weights(lambda: model.decode(tok, cache)):
        return _phase_steps(model, cache, (step, tok, *rest), *sampling)


def _phase_steps(model, cache, carry, temperature, top_p, top_k, max_tokens, stop_ids, pad_id):
    """`_phase`'s loop over `cache` (carry: the rest of its carry, the cache's arrays left out)."""
    step, tok, out_tok, out_lp, done, lengths, key = carry
    size = cache.max_len
    stops = jnp.asarray(stop_ids if stop_ids else (-1,), jnp.int32)

    def cond(c):
        step, _, cache, _, _, done, _, _ = c
        return (step < max_tokens) & ~jnp.all(done) & (cache.index < size)

    def body(c):
        step, tok, cache, out_tok, out_lp, done, lengths, key = c
        with cpu_decode.live_rows(~done):  # the kernels skip the rows that have stopped (their tokens are pads)
            logits, cache = model.decode(tok, cache)
        key, sub = jax.random.split(key)
        new, lp = sample_token(logits, sub, temperature, top_p, top_k)
        new = jnp.where(done, pad_id, new)
        lp = jnp.where(done, 0.0, lp)
        out_tok = jax.lax.dynamic_update_slice(out_tok, new[:, None], (0, step))
        out_lp = jax.lax.dynamic_update_slice(out_lp, lp[:, None], (0, step))
        lengths = lengths + (~done).astype(jnp.int32)
        done = done | jnp.isin(new, stops)
        return step + 1, new, cache, out_tok, out_lp, done, lengths, key

    c = jax.lax.while_loop(cond, body, (step, tok, cache, out_tok, out_lp, done, lengths, key))
    step, tok, cache, out_tok, out_lp, done, lengths, key = c
    return (step, tok, cache.k, cache.v, cache.index, cache.positions, out_tok, out_lp, done, lengths, key)


def _stack(parts: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """Prefills of U prompts (`_prefill`'s outputs) -> one prefix: logits [U, V], per-layer keys [U, ...] and
    values, valid [U, P], lengths [U]."""
    logits, ks, vs, valid, length = zip(*parts, strict=True)
    layers = len(ks[0])
    return (
        jnp.stack(logits),
        tuple(jnp.concatenate([k[i] for k in ks]) for i in range(layers)),
        tuple(jnp.concatenate([v[i] for v in vs]) for i in range(layers)),
        jnp.concatenate(valid),
        jnp.concatenate(length),
    )


def compiled_programs() -> int:
    """How many programs the sampler has compiled in this process (prefill and decode, every shape)."""
    return sum(f._cache_size() for f in (_prefill, _start, _grow, _phase))


@dataclasses.dataclass(frozen=True)
class Grid:
    """Rows of one decode call laid out as U prompts x n samples: cell u * n + j is sample j of prompt
    `prompts[u]` (an index into the call's distinct prompts) and generates row `cells[u * n + j]` of the
    request."""

    prompts: tuple[int, ...]
    n: int
    cells: tuple[int, ...]


def grid_tokens(prompt_counts: Sequence[int], longest: int, new_tokens: int) -> int:
    """KV positions a grid's decode holds for rows of distinct prompts repeated `prompt_counts` times each: the
    prompts' prefills at `longest` (the padded length of the longest) and `new_tokens` generated slots per row. A
    grid of each prompt the same number of times stacks each prefill once; any other holds one per row (`plan_grids`).
    Times the model's KV bytes per position (2 x layers x kv heads x head dim x bytes: 24 KiB for Qwen2.5-0.5B in
    fp32) it is the cache."""
    rows = sum(prompt_counts)
    prefills = len(prompt_counts) if len(set(prompt_counts)) <= 1 else rows
    return prefills * longest + rows * new_tokens


def _chunks(
    rows: Sequence[Sequence[int]],
    max_batch: int,
    max_grid_tokens: int | None,
    new_tokens: int,
    prompt_len: Callable[[int], int],
) -> list[list[int]]:
    """Consecutive row indices in chunks of at most max_batch rows and (with a budget) max_grid_tokens positions."""
    chunks: list[list[int]] = []
    idx: list[int] = []
    counts: dict[tuple[int, ...], int] = {}
    longest = 0
    for i, r in enumerate(rows):
        key, length = tuple(r), prompt_len(len(r))
        trial = {**counts, key: counts.get(key, 0) + 1}
        over = max_grid_tokens is not None and grid_tokens(list(trial.values()), max(longest, length), new_tokens) > (
            max_grid_tokens
        )
        if idx and (len(idx) == max_batch or over):
            chunks.append(idx)
            idx, trial, longest = [], {key: 1}, 0
        idx.append(i)
        counts, longest = trial, max(longest, length)
    if idx:
        chunks.append(idx)
    return chunks


def plan_grids(
    rows: Sequence[Sequence[int]],
    max_batch: int | None,
    max_grid_tokens: int | None = None,
    new_tokens: int = 0,
    prompt_len: Callable[[int], int] = lambda length: length,
) -> tuple[list[list[int]], list[Grid]]:
    """The distinct prompts of `rows` (token-id lists) and the grids that generate every row once.

    Rows are split into chunks of at most `max_batch` (None: one chunk) in their order, and, with `max_grid_tokens`,
    of at most that many KV positions (`grid_tokens`: each distinct prompt at `prompt_len` of the chunk's longest,
    plus `new_tokens` per row; a row alone is a chunk whatever it costs); a chunk whose distinct
    prompts each repeat the same number of times n is one grid of its U prompts x n (a batch of n samples per
    prompt, or of distinct prompts with n = 1). Any other chunk is a grid of one row per prompt occurrence: a
    prompt's prefill still runs once, its keys copied into each of its rows' prefixes (padding such a chunk to a
    U x n grid would waste rows and add decode shapes, each a compile).
    """
    distinct: dict[tuple[int, ...], int] = {}
    for r in rows:
        distinct.setdefault(tuple(r), len(distinct))
    grids = []
    for idx in _chunks(rows, max_batch or len(rows), max_grid_tokens, new_tokens, prompt_len):
        groups: dict[int, list[int]] = {}
        for i in idx:
            groups.setdefault(distinct[tuple(rows[i])], []).append(i)
        counts = {len(g) for g in groups.values()}
        if len(counts) == 1:
            grids.append(Grid(tuple(groups), counts.pop(), tuple(c for g in groups.values() for c in g)))
        else:
            grids.append(Grid(tuple(distinct[tuple(rows[i])] for i in idx), 1, tuple(idx)))
    return [list(p) for p in distinct], grids


class JaxSampler:
    """`Sampler` over an in-process Qwen2ForCausalLM.

    model: the policy (its current params are copied at construction; `sync` swaps them).
    tokenizer: optional HF tokenizer (decodes text; its eos and ChatML stop tokens become stop ids).
    eos_ids: explicit stop ids (used instead of the tokenizer's when given; [] = never stop early).
    min_prompt_bucket / min_batch_bucket / min_new_bucket: smallest padded prompt length / batch size /
    max-tokens (all rounded up to powers of two).
    max_batch: most rows decoded together (more are split into consecutive chunks); None = all at once.
    max_grid_tokens: most KV positions one decode holds (`grid_tokens`: prompts at their padded length, max_tokens
    per row); a call over more is split into consecutive grids. It bounds the memory of long prompts: 64 three-turn
    conversations of Qwen2.5-0.5B (prompts padded to 8,192) took 21 GB at once. None: no bound.
    prefix_cache: how many prompts' prefills to keep between calls (least recently used dropped first; all dropped
    when `sync` changes the weights): a prompt sampled again, as the scratch prompt is at every refill of an RL
    step, is not prefilled again (vLLM's prefix caching does the same). 0: none kept.
    suffix_phase: generated slots per row of a decode's first phase (`phase_sizes`): a step reads its phase's whole
    suffix, so smaller phases read less and compile more programs (each holds its memory for the run); None: one
    phase of the whole budget.
    cpu_kernels: decode steps on CPU by mle_jax.kernels.cpu_decode (packed-weight matmuls, attention over the
    filled suffix only) where its library is built; False keeps XLA's ops. Prefill always uses XLA's.
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
        """The in-process sampler of `model` (of the sampler section it reads `jax_cpu_kernels` and
        `jax_max_grid_tokens`; url is not used). frozen: of `model`'s weights as they are now, which stay so while
        the policy's change (the instrumenter's, whose prompts, each a different program, are never sampled twice:
        it keeps no prefills between calls)."""
        kernels = bool(getattr(settings, "jax_cpu_kernels", True))
        budget = int(getattr(settings, "jax_max_grid_tokens", 0)) or None
        if frozen:  # one decode phase: its grids (programs x 1) rarely repeat a shape, and each phase is a program
            # the weights as they are now, shared (nnx.clone would copy them): the sampler holds its own split state,
            # which a later nnx.update of `model` does not reach, and nothing syncs a frozen sampler
            return cls(model, tokenizer, prefix_cache=0, suffix_phase=None, cpu_kernels=kernels, copy_params=False,
                       max_grid_tokens=budget)  # fmt: skip
        # the run's learner never donates the model's buffers (it trains copies, or adapters) and hands `sync` weights
        # it will not donate (Learner.policy_state): the sampler shares them rather than holding a copy of its own
        return cls(model, tokenizer, cpu_kernels=kernels, copy_params=False, max_grid_tokens=budget)

    @classmethod
    def for_run(
        cls, settings: Any, model: Qwen2ForCausalLM, tokenizer: Any = None, seed: int = 0, **options
    ) -> JaxSampler:
        """An in-process sampler of a model a caller holds (the warm start's, an experiment's, a bench's) with a run's
        sampler settings (`jax_cpu_kernels`, `jax_max_grid_tokens`; None: their defaults); options are the
        constructor's own (run/builders.local_sampler binds the run's settings)."""
        kernels = bool(getattr(settings, "jax_cpu_kernels", True))
        options.setdefault("max_grid_tokens", int(getattr(settings, "jax_max_grid_tokens", 0)) or None)
        return cls(model, tokenizer, seed=seed, cpu_kernels=kernels, **options)

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
        max_grid_tokens: int | None = None,
        prefix_cache: int = 2,
        suffix_phase: int | None = SUFFIX_PHASE,
        cpu_kernels: bool = True,
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
        self.max_grid_tokens = max_grid_tokens
        self.prefix_cache = prefix_cache
        self.suffix_phase = suffix_phase
        self.cpu_kernels = bool(cpu_kernels) and cpu_decode.available()
        phase_sizes(1, suffix_phase)  # validates
        self._prefills: collections.OrderedDict[tuple[tuple[int, ...], int], Any] = collections.OrderedDict()
        self._keep = 0

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
        self._prefills.clear()  # computed with the old weights

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
        rows = self._rows(prompts, n)
        if seed is None:
            self._key, key = jax.random.split(self._key)
        else:
            key = jax.random.key(seed)
        prompts, grids = self._plan(rows, max_tokens)
        results: list[Any] = [None] * len(rows)
        for g, grid in enumerate(grids):
            parts = self._grid_prefills(prompts, grid)
            out = self._decode_grid(grid, parts, jax.random.fold_in(key, g), temperature, top_p, top_k, max_tokens)
            for cell, row in enumerate(grid.cells):
                results[row] = tuple(x[cell] for x in out)
        self._keep = 0
        self._trim_prefills()
        completions = []
        for r, (tok, lp, length, stopped) in zip(rows, results, strict=True):
            ids = np.asarray(tok[:length], np.int32)
            text = self.tokenizer.decode(ids.tolist(), skip_special_tokens=True) if self.tokenizer else ""
            completions.append(
                check_completion(
                    Completion(
                        prompt_ids=np.asarray(r, np.int32),
                        token_ids=ids,
                        logprobs=np.asarray(lp[:length], np.float32),
                        text=text,
                        finish_reason="stop" if stopped else "length",
                        version=self.version,
                    )
                )
            )
        return completions

    def warm_up(self, prompts: Sequence[Sequence[int]], n: int = 1, max_tokens: int = 256) -> int:
        """Compiles what `generate(prompts, n, max_tokens=max_tokens)` runs: the prompts' prefills and every decode
        phase of each grid (none of which draws a token), so that a timed call holds no compile -> the programs
        compiled by this call."""
        SamplingSettings(max_tokens=max_tokens)
        before = compiled_programs()
        prompts_, grids = self._plan(self._rows(prompts, n), max_tokens)
        for grid in grids:
            parts = self._grid_prefills(prompts_, grid)
            self._decode_grid(grid, parts, jax.random.key(0), 1.0, 1.0, -1, max_tokens, warm=True)
        self._keep = 0
        self._trim_prefills()
        return compiled_programs() - before

    def _plan(self, rows: list[list[int]], max_tokens: int) -> tuple[list[list[int]], list[Grid]]:
        """`plan_grids` with this sampler's bounds: rows per grid, and KV positions at the padded lengths it decodes."""
        new = _bucket(max_tokens, self.min_new_bucket)
        return plan_grids(rows, self.max_batch, self.max_grid_tokens, new, lambda n: _bucket(n, self.min_prompt_bucket))

    def _rows(self, prompts: Sequence[Sequence[int]], n: int) -> list[list[int]]:
        """Each prompt n times (the rows of a call), checked: n >= 1, no empty prompt, ids inside the vocabulary."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        rows = [list(p) for p in prompts for _ in range(n)]
        if any(len(r) == 0 for r in rows):
            raise ValueError("every prompt needs at least one token")
        vocab = self.config.vocab_size
        bad = [t for r in rows for t in r if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} outside the vocabulary [0, {vocab})")
        return rows

    def _grid_prefills(self, prompts: list[list[int]], grid: Grid) -> list[Any]:
        """The prefills of a grid's prompts, left-padded to the bucket of its longest; they stay cached until its
        decode has them all."""
        p = _bucket(max(len(prompts[i]) for i in grid.prompts), self.min_prompt_bucket)
        self._keep = len(set(grid.prompts))
        return [self._prefill(prompts[i], p) for i in grid.prompts]

    def _prefill(self, prompt: Sequence[int], p: int) -> tuple[Any, ...]:
        """One prompt through the model, left-padded to p tokens (`_prefill`'s outputs): computed once per call (a
        prompt repeated in a call's rows or grids) and kept for the next calls (the `prefix_cache` latest)."""
        key = (tuple(prompt), p)
        if key in self._prefills:
            self._prefills.move_to_end(key)
            return self._prefills[key]
        tokens = np.full((1, p), self.pad_id, np.int32)
        mask = np.zeros((1, p), np.int32)
        tokens[0, p - len(prompt) :] = prompt
        mask[0, p - len(prompt) :] = 1
        part = _prefill(self.graphdef, self.state, jnp.asarray(tokens), jnp.asarray(mask))
        self._prefills[key] = part
        self._trim_prefills()
        return part

    def _trim_prefills(self) -> None:
        while len(self._prefills) > max(self.prefix_cache, self._keep):
            self._prefills.popitem(last=False)

    def _decode_grid(self, grid: Grid, parts: list[Any], key, temperature, top_p, top_k, max_tokens, warm=False):
        """The decode of `grid` (parts: the prefills of its prompts, in order), phase by phase (`phase_sizes`) ->
        numpy (tokens, logprobs, lengths, stopped), one row per cell. The grid is padded to U and n buckets (powers
        of two; U * n at least min_batch_bucket): padding prompts hold no valid slot, padding rows count as stopped
        from the start. warm: run every phase for no step (compiles them all) and return nothing."""
        n = _bucket(grid.n, 1)
        u = _bucket(len(grid.prompts), max(1, -(-self.min_batch_bucket // n)))
        m = _bucket(max_tokens, self.min_new_bucket)
        pad = [jax.tree.map(jnp.zeros_like, parts[0])] * (u - len(parts))
        logits, ks, vs, valid, length = _stack(parts + pad)
        live = np.zeros((u, n), bool)
        live[: len(grid.prompts), : grid.n] = True
        sampling = (jnp.float32(temperature), jnp.float32(top_p), jnp.int32(top_k))
        static = dict(stop_ids=self.stop_ids, pad_id=self.pad_id)
        sizes = phase_sizes(m, self.suffix_phase)
        live_rows = jnp.asarray(live.reshape(-1))
        carry = _start(
            ks, vs, valid, length, logits, live_rows, key, *sampling, n=n, max_new=m, size=sizes[0], **static
        )
        for i, size in enumerate(sizes):
            if i:
                carry = _grow(carry, size=size)
            limit = jnp.int32(0 if warm else max_tokens)
            carry = _phase(
                self.graphdef, self.state, ks, vs, valid, carry, *sampling, limit, kernels=self.cpu_kernels, **static
            )
            step, done = jax.device_get((carry[0], carry[8]))
            if not warm and (step >= max_tokens or done.all()):
                break
        if warm:
            return None
        out_tok, out_lp, lengths = jax.device_get((carry[6], carry[7], carry[9]))
        last = np.take_along_axis(out_tok, np.maximum(lengths - 1, 0)[:, None], 1)[:, 0]
        stopped = np.isin(last, self.stop_ids) & (lengths > 0)
        cells = np.arange(u * n).reshape(u, n)[: len(grid.prompts), : grid.n].reshape(-1)
        return tuple(x[cells] for x in (out_tok, out_lp, lengths, stopped))
