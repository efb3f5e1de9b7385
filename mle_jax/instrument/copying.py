"""Copy-constrained decoding for the LM instrumenter: the model decides where the progress prints go and
what they say; the program's own lines are copied from the source, never rewritten.

The paper's frozen Qwen2.5-3B copies a program verbatim while it inserts the prints. A model too small to
copy (the tiny warm-started Qwen2 of `:cpu` writes the grid's typical line where the program has another,
and verification rightly rejects that) can still know where a print belongs. This decoding keeps the C.3
prompt and the fenced response, and drives the model line by line:

- the response so far is "```python\n" followed by the lines decided so far; the model continues it
  (greedy, `window` tokens per call, all programs of the batch in one `generate` call);
- each complete line it writes is compared with the next source line: the same line is accepted; a line
  that is a progress print statement (`verify.progress_print_text`) is inserted, at most `max_inserts`
  in one gap; anything else is a divergence: the source line is written in its place and the model is
  asked again from there (what it wrote after a wrong line is conditioned on it);
- the model ends the program with the closing fence after the last source line (or writes something other
  than a print there).

So the program text can only change by inserted lines, and every inserted line is one the model wrote.
Verification still judges the result (a print placed where it breaks a block or an expression is
rejected), and the AST fallback still stands behind it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mle_jax.instrument import pyast
from mle_jax.instrument.verify import progress_print_text
from mle_jax.sampling.protocol import Sampler

FENCE_OPEN = "```python\n"


def is_progress_print_line(line: str) -> bool:
    """True when `line` (with its indentation) is exactly one progress print statement."""
    try:
        body = pyast.parse(line.strip()).body
    except SyntaxError:
        return False
    return len(body) == 1 and progress_print_text(body[0]) is not None


@dataclass
class CopyState:
    """One program's decoding: `source` lines, the `out` lines decided so far, the next source line `j`."""

    source: list[str]
    out: list[str] = field(default_factory=list)
    j: int = 0
    inserted_in_gap: int = 0
    done: bool = False
    calls: int = 0

    @classmethod
    def of(cls, code: str) -> CopyState:
        return cls(source=code.strip("\n").split("\n"))

    def prefix(self) -> str:
        """The response so far. It ends at the end of the last decided line, without its newline, so that the
        model writes the newline itself (and its tokenization of the boundary is the one it was trained on)."""
        return FENCE_OPEN + "\n".join(self.out)

    def response(self) -> str:
        return FENCE_OPEN + "\n".join(self.out) + "\n```"

    def _copy_next(self) -> None:
        self.out.append(self.source[self.j])
        self.j += 1
        self.inserted_in_gap = 0


def advance(state: CopyState, text: str, finished: bool, max_inserts: int = 2) -> CopyState:
    """Consume one continuation `text` of `state.prefix()` (`finished`: the model stopped by itself, so
    the last piece of `text` is a complete line too). Decides at least one line unless the state is done.

    Returns the same (mutated) state."""
    if state.done:
        return state
    state.calls += 1
    if state.out:
        if not text.startswith("\n"):  # it went on writing the last decided line: a divergence
            text = ""
        else:
            text = text[1:]
    pieces = text.split("\n")
    lines = pieces if finished else pieces[:-1]
    for k, line in enumerate(lines):
        if line.strip().startswith("```") or (finished and k == len(lines) - 1 and not line.strip()):
            if state.j == len(state.source):  # closed after the last source line: finished
                state.done = True
                return state
            break  # closed (or stopped) early: a divergence
        if state.j < len(state.source) and line.rstrip() == state.source[state.j].rstrip():
            state._copy_next()
            continue
        if state.inserted_in_gap < max_inserts and is_progress_print_line(line):
            state.out.append(line.rstrip())
            state.inserted_in_gap += 1
            continue
        break  # neither the source's next line nor a print: a divergence
    else:
        if lines:
            return state  # every complete line was decided; the model continues from there
    # a divergence (or nothing complete was written): the source line goes in; past the end, the program is done
    if state.j < len(state.source):
        state._copy_next()
    else:
        state.done = True
    return state


def copy_decode(
    prompts: Sequence[Sequence[int]],
    codes: Sequence[str],
    sampler: Sampler,
    tokenizer: Any,
    window: int = 48,
    max_inserts: int = 2,
    temperature: float = 0.0,
) -> list[CopyState]:
    """Copy-constrained decoding of one instrumented program per (C.3 prompt token ids, source code); see the
    module docstring. Returns each program's final state (`.response()` is the fenced program)."""
    states = [CopyState.of(c) for c in codes]
    # every call decides at least one line per active program, and at most max_inserts prints fill a gap
    limit = max((len(s.source) + 1) * (max_inserts + 1) + 1 for s in states) if states else 0
    for _ in range(limit):
        active = [i for i, s in enumerate(states) if not s.done]
        if not active:
            break
        rows = [list(prompts[i]) + tokenizer.encode(states[i].prefix(), add_special_tokens=False) for i in active]
        outs = sampler.generate(rows, n=1, temperature=temperature, top_p=1.0, max_tokens=window)
        for i, c in zip(active, outs, strict=True):
            advance(states[i], c.text, finished=c.finish_reason == "stop", max_inserts=max_inserts)
    for s in states:  # only a sampler that never stops and never diverges gets here unfinished
        while not s.done:
            advance(s, "", finished=True, max_inserts=max_inserts)
    return states
