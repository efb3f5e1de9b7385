"""What an episode's agent observes after a turn's run, and how it joins the conversation's token sequence.

The observation is what an MLE-bench agent may see: the run's status, the tail of its own terminal output (the
instrumenter's tags removed) and whether its submission.csv has the right format (tasks/submission_format.py). Never
the grader's score. In a "conversation" episode it is appended as the tokens of a user turn of the model's chat
template after the response's tokens, which are kept exactly as sampled (token-in/token-out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mle_jax.executor.result import ExecResult
from mle_jax.tasks import prompts as prompt_lib
from mle_jax.tasks.progress import untag
from mle_jax.tasks.submission_format import FormatCheck, check_format
from mle_jax.tasks.task import Task

_PROBE_USER, _PROBE_ANSWER = "U", "A"


@dataclass(frozen=True)
class Observation:
    """A finished turn as its agent sees it. status: "ok" | "error" | "timeout" | "oom" | "killed" | "no code"."""

    status: str
    exit_code: int | None
    output: str  # the whole untagged terminal output kept by the executor (the text shows its tail)
    submission_ok: bool  # MLE-bench's format check passed
    submission_note: str  # the check's one line

    def text(self, output_chars: int) -> str:
        return prompt_lib.observation_text(self.status, self.exit_code, self.output, self.submission_note, output_chars)


def observe(result: ExecResult | None, tag: str | None, check: FormatCheck) -> Observation:
    """The observation of a run (None: the response had no code, nothing ran)."""
    if result is None:
        return Observation("no code", None, "", False, "no program was run: the response had no code block")
    out = (result.stdout_tail or "") + ("\n" + result.stderr_tail if result.stderr_tail else "")
    note = "submission.csv has the right format" if check.ok else check.reason
    return Observation(str(result.status), result.exit_code, untag(out, tag) if tag else out, check.ok, note)


def observe_run(result: ExecResult, tag: str | None, task: Task) -> Observation:
    """The observation of a program's run on `task`: its submission's format checked, and where the executor kept
    none, its reason (not written; a symlink or another file that is not a regular one; over the size cap)."""
    why_none = result.extra.get("submission_reason")
    return observe(result, tag, check_format(task, result.submission_path, why_none))


def _template(tokenizer: Any, messages: list[dict[str, str]], generation: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)


def user_turn_text(tokenizer: Any, content: str, stop_text: str) -> str:
    """The chat template's text that closes an assistant turn and adds a user turn of `content` and the next
    assistant header, without the part of the closing that the sampled response already ended with (`stop_text`, the
    decoded stop token it stopped on; "" when it hit its length limit)."""
    probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_ANSWER}]
    head = _template(tokenizer, probe, False)
    full = _template(tokenizer, [*probe, {"role": "user", "content": content}], True)
    if not full.startswith(head) or _PROBE_ANSWER not in head:
        raise ValueError("the tokenizer's chat template does not extend a conversation by appending a user turn")
    closing = head[head.rindex(_PROBE_ANSWER) + len(_PROBE_ANSWER) :]  # e.g. "<|im_end|>\n"
    if stop_text and closing.startswith(stop_text):
        closing = closing[len(stop_text) :]
    return closing + full[len(head) :]


def observation_ids(
    tokenizer: Any,
    text_of: Callable[[int], str],
    response_ids: Sequence[int],
    stop_ids: Sequence[int],
    output_chars: int,
    max_tokens: int,
) -> tuple[list[int], str]:
    """(token ids, text) of the observation turn appended after `response_ids` in a conversation: the user turn of
    `text_of(chars)` with the largest chars <= output_chars whose tokens fit in max_tokens (binary search; the
    instructions are never cut)."""
    last = int(response_ids[-1]) if len(response_ids) else None
    stop_text = tokenizer.decode([last]) if last is not None and last in set(stop_ids) else ""

    def encode(chars: int) -> tuple[list[int], str]:
        text = text_of(chars)
        return list(tokenizer.encode(user_turn_text(tokenizer, text, stop_text), add_special_tokens=False)), text

    ids, text = encode(output_chars)
    if len(ids) <= max_tokens:
        return ids, text
    lo, hi, best = 0, output_chars, None
    while lo <= hi:
        mid = (lo + hi) // 2
        trial = encode(mid)
        if len(trial[0]) <= max_tokens:
            best, lo = trial, mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise prompt_lib.PromptTooLong(
            f"an observation without output is {len(encode(0)[0])} tokens, over agent.observation_tokens={max_tokens}"
        )
    return best
