"""Instrumentation by a frozen LM (the paper's §3.2): prompt C.3, greedy decoding, then verification.

decoding "free": the model writes the whole instrumented program (the paper's). "copy": copy-constrained
decoding (`instrument.copying`): the model writes the prints and where they go, the program's lines are
copied from the source; for models too small to copy a program verbatim."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mle_jax.instrument.copying import copy_decode
from mle_jax.instrument.verify import verify
from mle_jax.sampling.protocol import Sampler
from mle_jax.tasks.prompts import PromptTooLong, instrument_messages, parse_response, render_prompt

DECODINGS = ("free", "copy")


@dataclass(frozen=True)
class LMAttempt:
    code: str | None  # the verified instrumented program, None when rejected
    reason: str = ""  # why it was rejected


def lm_instrument_batch(
    codes: Sequence[str],
    sampler: Sampler,
    tokenizer: Any,
    max_tokens: int = 1536,
    max_prompt_tokens: int = 4096,
    temperature: float = 0.0,
    decoding: str = "free",
    copy_window: int = 48,
) -> list[LMAttempt]:
    """One greedy completion per program (all prompts in one generate call; with decoding "copy", one call
    per decided line, each of at most `copy_window` tokens); each is accepted only when verify() finds it
    equal to the original plus inserted progress prints, with at least one inserted."""
    if decoding not in DECODINGS:
        raise ValueError(f"instrument decoding must be one of {DECODINGS}, got {decoding!r}")
    attempts: list[LMAttempt | None] = [None] * len(codes)
    prompts, index = [], []
    for i, code in enumerate(codes):
        try:
            prompts.append(render_prompt(instrument_messages(code), tokenizer, max_prompt_tokens))
            index.append(i)
        except PromptTooLong as e:
            attempts[i] = LMAttempt(None, f"instrumentation prompt too long: {e}")
    if prompts and decoding == "copy":
        states = copy_decode(
            prompts, [codes[i] for i in index], sampler, tokenizer, copy_window, temperature=temperature
        )
        for i, state in zip(index, states, strict=True):
            attempts[i] = _judge(codes[i], state.response(), "stop")
    elif prompts:
        completions = sampler.generate(prompts, n=1, temperature=temperature, top_p=1.0, max_tokens=max_tokens)
        for i, completion in zip(index, completions, strict=True):
            attempts[i] = _judge(codes[i], completion.text, completion.finish_reason)
    return [a if a is not None else LMAttempt(None, "not attempted") for a in attempts]


def _judge(original: str, response: str, finish_reason: str) -> LMAttempt:
    parsed = parse_response(response)
    if parsed.code is None:
        return LMAttempt(None, f"LM response has no code block (finish: {finish_reason})")
    verdict = verify(original, parsed.code)
    if not verdict.ok:
        return LMAttempt(None, f"LM output rejected: {verdict.reason}")
    if verdict.n_inserted <= 0:
        return LMAttempt(None, "LM inserted no progress prints")
    return LMAttempt(parsed.code)
