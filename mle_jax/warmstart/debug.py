"""Warm-start examples of an episode's turn 2 after a failed run: the faulty program's real output -> the fix.

In an episode of several turns (`agent.turns` > 1, env/episodes.py) the agent reads what its program did and writes
the next one. A tiny model trained from scratch has never seen a traceback, so it cannot answer one. The warm start
shows it (`warmstart.debug_fraction` of the solving examples): a verified corpus program with one injected fault
(warmstart/faults.py) is run in the sandbox, and turn 2, shown that run as the RL loop shows it, is taught to answer
with the original program. The prompt is turn 2's prompt in the run's episode context, built as
`Environment.next_turn_prompt` builds it:

- "conversation": the scratch prompt's tokens, the faulty response's tokens (the source's plan and the faulty code,
  fenced, then <|im_end|>), then the observation (env/observation.py: status, output tail, MLE-bench's format check
  of the submission, the revise instruction) as a user turn of the chat template, at most `agent.observation_tokens`
  (its output tail shrinks to fit): `Conversation.render_ids`.
- "state": the improve prompt (C.2) about the faulty program and its output (ML-Agent's step-wise context). A run of
  one turn (`agent.turns` = 1) shows a failed run only there (improve prompts about earlier solutions), so its debug
  examples take this form whatever `agent.context` says (`WarmStartSettings.debug_context`).

`heldout_fixes` measures what this buys: on grid programs outside the SFT set, with injected faults that fail, the
share of turn-2 responses (sampled as RL samples) that run and grade valid.
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from mle_jax.env.observation import Observation, observation_ids
from mle_jax.env.settings import AgentSettings
from mle_jax.models.tokenizer import stop_token_ids
from mle_jax.sampling.protocol import Sampler, SamplingSettings
from mle_jax.tasks.prompts import (
    PromptSettings,
    improve_messages,
    parse_response,
    render_prompt,
    scratch_messages,
)
from mle_jax.warmstart.corpus import parallel_runs
from mle_jax.warmstart.faults import FAULT_KINDS, FaultyRun, ObserveFn
from mle_jax.warmstart.sft import default_render, end_of_turn_id

Messages = list[dict[str, str]]


def debug_count(n_solving: int, debug_fraction: float) -> int:
    """How many debug examples make `debug_fraction` of an SFT set whose other solving examples (scratch and
    improve) number n_solving."""
    if not 0.0 <= debug_fraction < 1.0:
        raise ValueError(f"warmstart.debug_fraction must be in [0, 1), got {debug_fraction}")
    return round(n_solving * debug_fraction / (1.0 - debug_fraction))


class Conversation(list):
    """Turn 2's prompt in a conversation: the chat [system, user (scratch), assistant (turn 1), user (observation)]
    (what the task tokenizer is trained on, and the SFT's cache key), rendered to tokens as the RL loop builds them by
    `render_ids`: the rendered scratch prompt, then the response's tokens and the observation's appended."""

    def __init__(
        self, scratch: Messages, response: str, observation: Observation, output_chars: int, observation_tokens: int
    ):
        self.scratch, self.response, self.observation = scratch, response, observation
        self.output_chars, self.observation_tokens = output_chars, observation_tokens
        turns = [
            {"role": "assistant", "content": response},
            {"role": "user", "content": observation.text(output_chars)},
        ]
        super().__init__([*scratch, *turns])

    def render_ids(self, tokenizer: Any, max_prompt_tokens: int) -> list[int]:
        """The scratch prompt (chat template, `max_prompt_tokens` budget: `render_prompt`) + the response's tokens and
        <|im_end|> (the stop token turn 1 ended on) + `observation_ids` (its output tail shrunk to fit
        observation_tokens): `Environment.next_turn_prompt` with the response tokenized instead of sampled."""
        first = list(render_prompt(self.scratch, tokenizer, max_prompt_tokens))
        response = [*tokenizer.encode(self.response, add_special_tokens=False), end_of_turn_id(tokenizer)]
        observed, _ = observation_ids(
            tokenizer,
            self.observation.text,
            response,
            stop_token_ids(tokenizer),
            self.output_chars,
            self.observation_tokens,
        )
        return first + response + observed

    def __reduce__(self):  # copies and pickles as the plain chat it is
        return (list, (list(self),))


def debug_prompt(
    context: str,
    task: Any,
    packages: Sequence[str],
    prompt: PromptSettings,
    agent: AgentSettings,
    run: FaultyRun,
) -> Messages:
    """Turn 2's prompt after `run` (the faulty program as turn 1's response) in `context`."""
    if context == "conversation":
        scratch = scratch_messages(task, list(packages), prompt.snippet_chars)
        return Conversation(
            scratch, run.response(), run.run.observation, prompt.output_tail_chars, agent.observation_tokens
        )
    if context == "state":
        parsed = parse_response(run.response())  # as the RL loop holds it (rollout.to_previous)
        return improve_messages(task, list(packages), parsed.plan, parsed.code or "", run.run.output)
    raise ValueError(f"context must be 'conversation' or 'state', got {context!r}")


def debug_examples(
    context: str,
    task: Any,
    packages: Sequence[str],
    prompt: PromptSettings,
    agent: AgentSettings,
    runs: Sequence[FaultyRun],
) -> list[tuple[Messages, str]]:
    """(turn 2's prompt after a faulty run, the original program's response) SFT examples, one per run."""
    return [(debug_prompt(context, task, packages, prompt, agent, r), r.source.response()) for r in runs]


def heldout_fixes(
    sampler: Sampler,
    tokenizer: Any,
    prompts: Sequence[Messages],
    runs: Sequence[FaultyRun],
    max_prompt_tokens: int,
    sampling: SamplingSettings,
    observe_fn: ObserveFn,
    workers: int = 1,
    progress: bool = True,
    kind_of: Callable[[str], str] | None = None,
) -> list[dict]:
    """How the policy behind `sampler` answers turn 2 after faulty runs it was not trained on: one response per
    prompt (prompts[i] is turn 2's prompt after runs[i]), sampled with the run's sampling settings in one generate
    call, its code run and graded by `observe_fn` (in the sandbox). One record per run (`fix_metrics` sums them up):
    the fault, the turn-2 code, its run's status and last output line (the error, for one that failed), `fixed` (it
    ran and graded valid), its score, `exact` (the original program written back), `repeat` (the faulty one again),
    `similarity` (difflib's ratio of the turn-2 code to the original program: 1 is the original) and, with `kind_of`
    (code -> its kind of solution, `programs.solution_kind`), `same_solution` (turn 2 kept the original's kind: it
    revised that program rather than writing another)."""
    if len(prompts) != len(runs):
        raise ValueError(f"{len(prompts)} prompts for {len(runs)} runs")
    if not runs:
        return []
    ids = [default_render(p, tokenizer, max_prompt_tokens) for p in prompts]
    completions = sampler.generate(ids, n=1, **sampling.generate_kwargs())
    codes = [parse_response(c.text).code for c in completions]
    runnable = [i for i, code in enumerate(codes) if code is not None]
    observed = parallel_runs([codes[i] for i in runnable], observe_fn, workers, progress, "turn-2 runs")
    by_index = dict(zip(runnable, observed, strict=True))
    records = []
    for i, (run, code) in enumerate(zip(runs, codes, strict=True)):
        turn2 = by_index.get(i)
        records.append(
            {
                "kind": run.fault.kind,
                "fault": run.fault.what,
                "fault_status": run.run.observation.status,
                "fault_submission_ok": run.run.observation.submission_ok,
                "prompt_tokens": len(ids[i]),
                "code": code,
                "status": None if turn2 is None else turn2.observation.status,
                "last_line": None if turn2 is None else _last_line(turn2.observation.output),
                "fixed": bool(turn2 is not None and turn2.valid),
                "score": None if turn2 is None else turn2.score,
                "exact": code is not None and code.strip() == run.source.code.strip(),
                "repeat": code is not None and code.strip() == run.fault.code.strip(),
                "similarity": 0.0 if code is None else _similarity(code, run.source.code),
                "same_solution": None
                if kind_of is None
                else code is not None and kind_of(code) == kind_of(run.source.code),
            }
        )
    return records


def _similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a.strip(), b.strip(), autojunk=False).ratio()


def _last_line(output: str) -> str:
    lines = [x for x in output.strip().splitlines() if x.strip()]
    return lines[-1][-300:] if lines else ""


def fix_metrics(records: Sequence[dict]) -> dict[str, float]:
    """`heldout_fixes` records -> {"n", "fix_share": the share whose turn-2 program ran and graded valid (episodes a
    revising agent would rescue), "fix_<kind>": that share per fault kind, "exact_share": the original program
    written back, "repeat_share": the faulty one again, "no_code_share": no code block, "similarity_mean": the mean
    similarity of turn 2's code to the original; with solution kinds, "same_solution_share": turn 2 of the
    original's kind of solution, "fix_same_solution_share": fixed and of that kind (a fix of that program, not
    another program that happens to run)}."""
    n = len(records)
    if not n:
        return {"n": 0, "fix_share": float("nan")}
    metrics: dict[str, float] = {
        "n": n,
        "fix_share": sum(r["fixed"] for r in records) / n,
        "exact_share": sum(r["exact"] for r in records) / n,
        "repeat_share": sum(r["repeat"] for r in records) / n,
        "no_code_share": sum(r["code"] is None for r in records) / n,
        "similarity_mean": sum(r.get("similarity", 0.0) for r in records) / n,
    }
    if all(r.get("same_solution") is not None for r in records):
        metrics["same_solution_share"] = sum(r["same_solution"] for r in records) / n
        metrics["fix_same_solution_share"] = sum(r["fixed"] and r["same_solution"] for r in records) / n
    kinds = Counter(r["kind"] for r in records)
    for kind in FAULT_KINDS:
        if kinds[kind]:
            metrics[f"fix_{kind}"] = sum(r["fixed"] for r in records if r["kind"] == kind) / kinds[kind]
    return metrics
