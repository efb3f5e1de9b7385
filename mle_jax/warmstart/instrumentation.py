"""Warm-start SFT examples that teach the instrumentation task (the paper's C.3 prompt), so that the frozen
copy of the initial policy can insert the progress prints, as the paper's frozen Qwen2.5-3B does.

A tiny model trained from scratch has never seen the C.3 prompt. Its targets come from the deterministic AST
instrumenter (`instrument.fallback.ast_instrument`): for a program P, the prompt is
`instrument_messages(P)` and the response is P with the seven prints inserted, in one fenced block. The
programs are grid programs of the task (`warmstart.programs`); the ones left out are the held-out set on
which `heldout_instrumentation` measures how often the frozen model's output passes verification.

Copying a program exactly is what the task needs, and a tiny model that sees only the grid learns the grid's
typical programs instead (it writes back C=0.1 where the prompt said C=3.0). So the training programs are
also shown with their hyperparameter values redrawn at random (`redraw_values`): values it cannot have
memorised, only copied. Those variants need not run; they are never solutions, only texts to instrument.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from typing import Any

from mle_jax.instrument import InstrumentSettings, instrument_batch
from mle_jax.instrument.fallback import ast_instrument
from mle_jax.instrument.placement import Agreement, agreement
from mle_jax.instrument.tagging import strip_agent_progress
from mle_jax.sampling.protocol import Sampler
from mle_jax.tasks.prompts import instrument_messages
from mle_jax.warmstart.corpus import CorpusItem, select_balanced
from mle_jax.warmstart.programs import full_grid

Messages = list[dict[str, str]]


_KEYWORD_NUMBER = re.compile(r"(?<=\w=)(\d+\.\d+|\d+)(?=[,)])")  # `C=0.3,`  `n_estimators=200)`


def redraw_values(code: str, rng: random.Random) -> str:
    """`code` with every number given as a keyword argument (hyperparameters) replaced by a random one of the
    same type; everything else unchanged."""

    def one(m: re.Match) -> str:
        if "." in m.group(0):
            return repr(round(rng.uniform(0.001, 10.0), rng.choice((2, 3))))
        return str(rng.randint(2, 999))

    return _KEYWORD_NUMBER.sub(one, code)


def instrument_target(code: str) -> str:
    """The response the instrumenter should give for `code`: the AST-instrumented program, fenced."""
    return f"```python\n{ast_instrument(code).rstrip()}\n```"


def split_programs(
    task_id: str, packages: Iterable[str], n_train: int, seed: int, first: Sequence[CorpusItem] = ()
) -> tuple[list[str], list[str]]:
    """(training programs, held-out programs) of the task's grid, agent prints stripped as RL strips them.

    Training: the programs of `first` (the SFT corpus: what the policy will write most) then grid programs
    chosen by `seed`, balanced over model families, up to n_train. Held out: the rest of the grid.
    """
    grid = full_grid(task_id, packages)
    chosen = {it.code for it in first}
    rest = [it for it in grid if it.code not in chosen]
    extra = max(0, n_train - len(chosen))
    picked = select_balanced(rest, min(extra, len(rest)), seed) if extra and rest else []
    train = [it.code for it in first] + [it.code for it in picked]
    train_set = set(train)
    held_out = [it.code for it in grid if it.code not in train_set]
    return [strip_agent_progress(c) for c in train[:n_train]], [strip_agent_progress(c) for c in held_out]


def instrument_examples(programs: Sequence[str], redrawn: int = 0, seed: int = 0) -> list[tuple[Messages, str]]:
    """(C.3 prompt about P, P instrumented) SFT examples: one per program, then `redrawn` more about the
    programs with their hyperparameter values redrawn (cycling through `programs`)."""
    rng = random.Random(seed)
    texts = list(programs) + [
        redraw_values(programs[i % len(programs)], rng) for i in range(redrawn if programs else 0)
    ]
    return [(instrument_messages(code), instrument_target(code)) for code in texts]


def heldout_instrumentation(
    sampler: Sampler, tokenizer: Any, programs: Sequence[str], settings: InstrumentSettings
) -> dict[str, float]:
    """How the model behind `sampler` (greedy, the run's budgets and decoding) instruments `programs`:
    `accept`, the share whose output passes verification (`instrument_batch` in mode "lm": accepted, not
    the fallback), and over the accepted ones `print_precision` / `print_recall`, the share of the LM's
    prints in the place the AST instrumenter puts them and of the AST's prints the LM put there too
    (`instrument.placement`)."""
    if not programs:
        return {"accept": float("nan"), "print_precision": float("nan"), "print_recall": float("nan")}
    out = instrument_batch(
        list(programs),
        "lm",
        sampler,
        tokenizer,
        max_tokens=settings.max_tokens,
        max_prompt_tokens=settings.max_prompt_tokens,
        decoding=settings.decoding,
        copy_window=settings.copy_window,
    )
    total = Agreement(0, 0, 0)
    for code, r in zip(programs, out, strict=True):
        if r.path == "lm":
            total = total + agreement(ast_instrument(code), r.code)
    accept = sum(r.path == "lm" for r in out) / len(out)
    return {"accept": accept, "print_precision": total.precision, "print_recall": total.recall}
