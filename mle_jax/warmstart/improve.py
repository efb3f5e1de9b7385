"""Warm-start SFT examples for the RL self-improvement prompt (the paper's C.2 prompt).

In RL a share of the prompts (`prompt.improve_fraction`) shows a previous plan + code and its terminal
output and asks for a better solution. A model fine-tuned on the scratch prompt alone has never seen
such a prompt and writes broken programs on it. So part of the SFT set is built from pairs of verified
corpus programs (A, B): the prompt is `improve_messages(task, packages, plan_A, code_A, output_A)` with
output_A the terminal output of A's instrumented verification run (exactly what RL would show after
running A), and the response is B, a different verified program that scores better than A where one
does, its plan opened by a sentence that names what changes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from mle_jax.tasks.prompts import improve_messages, parse_response
from mle_jax.warmstart.corpus import CorpusItem, VerifiedItem

Messages = list[dict[str, str]]


def improve_count(n_scratch: int, improve_fraction: float) -> int:
    """How many improve examples make `improve_fraction` of an SFT set that has n_scratch scratch ones."""
    if not 0.0 <= improve_fraction < 1.0:
        raise ValueError(f"warmstart.improve_fraction must be in [0, 1), got {improve_fraction}")
    return round(n_scratch * improve_fraction / (1.0 - improve_fraction))


def _better(a: float, b: float, lower_is_better: bool) -> bool:
    return b < a if lower_is_better else b > a


def kind_means(verified: Sequence[VerifiedItem], kind_of: Callable[[CorpusItem], str]) -> dict[str, float]:
    """The mean score of each kind of solution among the verified programs."""
    scores: dict[str, list[float]] = {}
    for v in verified:
        scores.setdefault(kind_of(v.item), []).append(v.score)
    return {k: sum(s) / len(s) for k, s in scores.items()}


def improve_pairs(
    verified: Sequence[VerifiedItem],
    n: int,
    seed: int,
    lower_is_better: bool,
    kind_of: Callable[[CorpusItem], str] | None = None,
) -> list[tuple[VerifiedItem, VerifiedItem]]:
    """n (source A, target B) pairs of different verified programs, chosen deterministically by seed.

    Sources go round the verified programs (reshuffled each round), so each is a source about
    n / len(verified) times. B is drawn uniformly from the programs that score better than A; for the
    best program(s), from all the others (RL shows the best ones too, and the model must still answer).
    With `kind_of` (a program's kind of solution, e.g. `programs.solution_kind`), B is drawn first from the
    programs that score better than A and are of a kind whose mean score beats A's kind's (a worse kind of
    solution to a better one), then as above when there is none.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n and len({v.item.code for v in verified}) < 2:
        raise ValueError("improve examples need at least two different verified programs")
    rng = random.Random(seed)
    means = kind_means(verified, kind_of) if kind_of is not None else {}
    pairs: list[tuple[VerifiedItem, VerifiedItem]] = []
    order: list[VerifiedItem] = []
    while len(pairs) < n:
        if not order:
            order = list(verified)
            rng.shuffle(order)
        a = order.pop()
        others = [b for b in verified if b.item.code != a.item.code]
        better = [b for b in others if _better(a.score, b.score, lower_is_better)]
        if kind_of is not None:
            a_kind = means[kind_of(a.item)]
            better = [b for b in better if _better(a_kind, means[kind_of(b.item)], lower_is_better)] or better
        pairs.append((a, rng.choice(better or others)))
    return pairs


def change_sentence(a: CorpusItem, b: CorpusItem) -> str:
    """One sentence naming what B changes relative to A (grid meta: model family, feature set, hparams)."""
    parts = []
    if a.meta["model"] != b.meta["model"]:
        parts.append("the model")
    if a.meta["features"] != b.meta["features"]:
        parts.append("the features")
    if not parts:
        parts.append("the hyperparameters")
    what = parts[0] if len(parts) == 1 else " and ".join(parts)
    return f"To improve on the previous solution, I change {what}."


def improve_response(a: VerifiedItem, b: VerifiedItem) -> str:
    """The SFT target for an improve prompt about A: B's plan, opened by what changes, then B's code."""
    return CorpusItem(f"{change_sentence(a.item, b.item)} {b.item.plan}", b.item.code, b.item.meta).response()


def previous_solution(v: VerifiedItem) -> tuple[str, str, str]:
    """(plan, code, output) of a verified program as RL would hold it after sampling and running it:
    plan and code parsed back out of its response, the output of its instrumented run."""
    parsed = parse_response(v.item.response())
    return parsed.plan, parsed.code or "", v.output


def improve_prompt(task: Any, packages: Sequence[str], source: VerifiedItem) -> Messages:
    """The RL improve chat about a verified program (needs its captured output)."""
    if not source.output:
        raise ValueError(f"verified program {source.item.key} has no captured output: re-verify it")
    plan, code, output = previous_solution(source)
    return improve_messages(task, list(packages), plan, code, output)


def improve_examples(
    task: Any,
    packages: Sequence[str],
    verified: Sequence[VerifiedItem],
    n: int,
    seed: int,
    kind_of: Callable[[CorpusItem], str] | None = None,
) -> list[tuple[Messages, str]]:
    """n (improve prompt about A, response B) SFT examples from `improve_pairs` (kind_of: targets of a better
    kind of solution where there is one)."""
    prompts: dict[str, Messages] = {}
    out = []
    for a, b in improve_pairs(verified, n, seed, bool(task.lower_is_better), kind_of):
        if a.item.code not in prompts:
            prompts[a.item.code] = improve_prompt(task, packages, a)
        out.append((prompts[a.item.code], improve_response(a, b)))
    return out
