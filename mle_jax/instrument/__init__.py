"""Instrumentation: progress prints by a frozen LM, verification, and the deterministic AST fallback.

instrument(code, mode, sampler=None, tokenizer=None, ...) -> Instrumented(code, path, reason)
  mode "lm":  the frozen LM inserts the prints; rejected output -> AST fallback (path "fallback"); a program
              Python cannot parse is left as it is (path "unparsed": no instrumenter can place a print in it)
  mode "ast": the AST instrumenter only (path "ast")
  mode "off": the code unchanged (path "off")
In mode "lm", decoding "free" lets the model write the whole program (the paper's); "copy" copies the
program's lines from the source and lets the model write only the inserted lines (`instrument.copying`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mle_jax.instrument import pyast
from mle_jax.instrument.fallback import ast_instrument
from mle_jax.instrument.lm import DECODINGS, lm_instrument_batch
from mle_jax.instrument.verify import Verdict, verify
from mle_jax.sampling.protocol import Sampler
from mle_jax.tasks.progress import PROGRESS_PRINTS, count_progress

MODES = ("lm", "ast", "off")
PATHS = ("lm", "fallback", "unparsed", "ast", "off")


@dataclass(frozen=True)
class InstrumentSettings:
    """The `instrument` section of the run config."""

    mode: str = "lm"  # "lm" (frozen initial model, verified, fallback on reject) | "ast" | "off"
    max_tokens: int = 1536
    max_prompt_tokens: int = 4096
    temperature: float = 0.0
    vllm_url: str = ""  # vLLM server with the frozen initial weights (never synced)
    decoding: str = "free"  # "free" (the paper's: the model writes the program) | "copy" (lines copied)
    copy_window: int = 48  # decoding "copy": most tokens the model writes per call

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"instrument.mode must be one of {MODES}, got {self.mode!r}")
        if self.decoding not in DECODINGS:
            raise ValueError(f"instrument.decoding must be one of {DECODINGS}, got {self.decoding!r}")
        if self.copy_window < 1:
            raise ValueError(f"instrument.copy_window must be >= 1, got {self.copy_window}")


@dataclass(frozen=True)
class Instrumented:
    code: str
    path: str  # which route produced `code`: one of PATHS
    reason: str = ""  # for "fallback": why the LM's output was rejected


def instrument_batch(
    codes: Sequence[str],
    mode: str,
    sampler: Sampler | None = None,
    tokenizer: Any = None,
    max_tokens: int = 1536,
    max_prompt_tokens: int = 4096,
    temperature: float = 0.0,
    decoding: str = "free",
    copy_window: int = 48,
) -> list[Instrumented]:
    """instrument() for many programs; in "lm" mode the LM sees them in one generate call."""
    if mode not in MODES:
        raise ValueError(f"instrument mode must be one of {MODES}, got {mode!r}")
    if mode == "off":
        return [Instrumented(c, "off") for c in codes]
    if mode == "ast":
        return [Instrumented(ast_instrument(c), "ast") for c in codes]
    if sampler is None or tokenizer is None:
        raise ValueError("instrument mode 'lm' needs the frozen model's sampler and tokenizer")
    parsed = [_parses(c) for c in codes]
    todo = [c for c, ok in zip(codes, parsed, strict=True) if ok]
    attempts = iter(
        lm_instrument_batch(todo, sampler, tokenizer, max_tokens, max_prompt_tokens, temperature, decoding, copy_window)
        if todo
        else []
    )
    out = []
    for code, ok in zip(codes, parsed, strict=True):
        attempt = next(attempts) if ok else None
        if attempt is None:
            out.append(Instrumented(code, "unparsed", "the program does not parse"))
        elif attempt.code is not None:
            out.append(Instrumented(attempt.code, "lm"))
        else:
            out.append(Instrumented(ast_instrument(code), "fallback", attempt.reason))
    return out


def _parses(code: str) -> bool:
    try:
        pyast.parse(code)
    except (SyntaxError, ValueError):  # ValueError: a null byte in the source
        return False
    return True


def instrument(
    code: str,
    mode: str,
    sampler: Sampler | None = None,
    tokenizer: Any = None,
    max_tokens: int = 1536,
    max_prompt_tokens: int = 4096,
    temperature: float = 0.0,
) -> Instrumented:
    """Insert the seven progress prints into one program (see the module docstring for modes and paths)."""
    return instrument_batch([code], mode, sampler, tokenizer, max_tokens, max_prompt_tokens, temperature)[0]


__all__ = [
    "MODES",
    "PATHS",
    "PROGRESS_PRINTS",
    "InstrumentSettings",
    "Instrumented",
    "Verdict",
    "ast_instrument",
    "count_progress",
    "instrument",
    "instrument_batch",
    "verify",
]


@dataclass(frozen=True)
class Instrumenter:
    """`instrument_batch` with a run's settings bound: the environment's instrument_fn (codes -> Instrumented each).
    sampler: the frozen LM's in mode "lm" (what the run holds for it), else None."""

    mode: str
    sampler: Sampler | None = None
    tokenizer: Any = None
    max_tokens: int = 1536
    max_prompt_tokens: int = 4096
    temperature: float = 0.0
    decoding: str = "free"
    copy_window: int = 48

    def __call__(self, codes: Sequence[str]) -> list[Instrumented]:
        return instrument_batch(
            codes, self.mode, self.sampler, self.tokenizer, self.max_tokens, self.max_prompt_tokens,
            self.temperature, self.decoding, self.copy_window,
        )  # fmt: skip
