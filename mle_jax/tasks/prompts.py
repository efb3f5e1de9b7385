"""Prompts of the paper's appendix C (our wording, the same instructions) and the response parser.

Three chats: solve from scratch (C.1), improve a previous solution (C.2), insert progress prints (C.3).
A chat is a list of {"role", "content"} dicts; the ones built here also know how to rebuild themselves
with less variable text (data snippet, previous output, previous solution), which `render_prompt` uses to
fit a token budget without ever cutting the instructions.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mle_jax.tasks.progress import PROGRESS_PRINTS
from mle_jax.tasks.task import Task

# Where the sandbox mounts a task's public folder (read-only); the agent is told to read data from here.
DATA_MOUNT = "/workdir/{task_id}/prepared/public/"
SUBMISSION_PATH = "./submission.csv"

SYSTEM_PROMPT = (
    "You are given a machine learning task. You must solve the task by training a model and running the "
    "model on the test set to produce a submission file."
)
ANSWER_FORMAT = (
    "First outline your proposed solution in natural language (3-5 sentences), followed by a single "
    "markdown code block (wrapped in ```) which implements this solution."
)
SAMPLE_LINES = 3
SAMPLE_LINE_CHARS = 300


IMPROVE_SEEDS = ("", "corpus")


@dataclass(frozen=True)
class PromptSettings:
    """The `prompt` section of the run config: budgets of the RL prompts and the share of improve prompts."""

    max_prompt_tokens: int = 1024
    improve_fraction: float = 0.5  # share of prompts that ask to improve an earlier solution
    snippet_chars: int = 1200  # data snippet of the task's files in the prompt
    output_tail_chars: int = 1500  # the end of a previous run's output an improve prompt shows
    code_extraction: str = "first"  # which of a response's code blocks is its program (CODE_EXTRACTIONS)
    # what the improve prompts show before the policy has a solution of its own (IMPROVE_SEEDS): "" nothing (the
    # paper); "corpus" the task's verified warm-start corpus programs with their output, so that a prompted model
    # that writes no working program from scratch is asked to revise working ones from the first step
    improve_seed: str = ""

    def __post_init__(self) -> None:
        if self.improve_seed not in IMPROVE_SEEDS:
            raise ValueError(f"prompt.improve_seed={self.improve_seed!r}: one of {IMPROVE_SEEDS}")
        if self.code_extraction not in CODE_EXTRACTIONS:
            raise ValueError(f"prompt.code_extraction={self.code_extraction!r}: one of {', '.join(CODE_EXTRACTIONS)}")
        if not 0.0 <= self.improve_fraction <= 1.0:
            raise ValueError(f"prompt.improve_fraction must be in [0, 1], got {self.improve_fraction}")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"prompt.max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")


def data_mount(task_id: str) -> str:
    return DATA_MOUNT.format(task_id=task_id)


class Messages(list):
    """A chat (list of {"role", "content"}) that can be rebuilt with smaller budgets for its variable parts.

    budgets: part name -> character budget, in the order parts are shrunk (first = shrunk first).
    """

    def __init__(self, build: Callable[[dict[str, int]], list[dict[str, str]]], budgets: dict[str, int]):
        self._build = build
        self.budgets = dict(budgets)
        super().__init__(build(self.budgets))

    def rebuilt(self, budgets: dict[str, int]) -> Messages:
        return Messages(self._build, budgets)

    def __reduce__(self):  # pickles/copies as the plain chat it is (the builder is a closure)
        return (list, (list(self),))


def _truncate_head(text: str, limit: int, marker: str = " ...") -> str:
    if len(text) <= limit:
        return text
    return text[: max(0, limit)] + marker if limit > 0 else ""


# terminal control in a program's output: ANSI escape sequences (CSI such as colours and cursor moves, OSC such as
# window titles and links, and two-character escapes) and the other C0 control characters but tab and newline
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def terminal_text(output: str) -> str:
    """A program's terminal output as the model may read it: ANSI escape sequences removed, a carriage return as a
    line break, any other control character (NUL, a bare ESC, ...) written as its escape `\\xNN`; the rest kept."""
    out = _ANSI.sub("", output).replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", out)


def _truncate_middle(text: str, limit: int) -> str:
    """Keep the head and the tail (progress prints come first, errors last)."""
    if len(text) <= limit:
        return text
    if limit <= 0:
        return ""
    head = limit // 3
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters elided ...]\n{text[len(text) - tail :]}"


def _read_head(path: Path, limit: int) -> str:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            return f.read(limit + 1)
    except OSError:
        return ""


def _snippet_source(task: Task) -> tuple[str, str]:
    """(file name, its first characters) of the first public data file that is a file."""
    for name in task.spec.data_files:
        path = task.public_dir / name
        if path.is_file():
            return name, _read_head(path, 8192)
    return "", ""


def _sample_format(task: Task) -> str:
    head = _read_head(task.sample_submission_path, SAMPLE_LINES * (SAMPLE_LINE_CHARS + 200))
    lines = head.splitlines()[:SAMPLE_LINES]
    return "\n".join(_truncate_head(line, SAMPLE_LINE_CHARS) for line in lines)


def _packages_line(packages: Sequence[str]) -> str:
    names = ", ".join(f"`{p}`" for p in packages)
    return f"You can use pre-installed packages such as: {names}." if names else ""


def _task_notes(task: Task, packages: Sequence[str]) -> list[str]:
    mount = data_mount(task.id)
    files = " and ".join(task.spec.data_files)
    notes = [
        f"Datasets {files} are available in `{mount}` (read-only).",
        f"You MUST produce a submission file at `{SUBMISSION_PATH}` by running your model on the test split.",
        task.spec.statement,
        _packages_line(packages),
        "You can't access the internet, so don't use any pre-trained models that need downloading.",
        f"`{SUBMISSION_PATH}` should have the following format (as `{mount}{task.spec.sample_submission}`):\n"
        f"```\n{_sample_format(task)}\n```",
    ]
    return [f"- {n}" for n in notes if n]


def scratch_messages(task: Task, packages: Sequence[str], snippet_chars: int = 1200) -> Messages:
    """System + user prompt that asks for a plan and one code block solving `task` from scratch (C.1)."""
    notes = "\n".join(_task_notes(task, packages))
    snippet_file, snippet_text = _snippet_source(task)
    mount = data_mount(task.id)

    def build(budgets: dict[str, int]) -> list[dict[str, str]]:
        user = f"{ANSWER_FORMAT} Note:\n{notes}"
        snippet = _truncate_head(snippet_text, budgets["snippet"])
        if snippet_file and snippet:
            user += f"\n\nData snippet:\n-> {mount}{snippet_file}:\n{snippet}"
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    return Messages(build, {"snippet": snippet_chars})


def improve_messages(
    task: Task,
    packages: Sequence[str],
    plan: str,
    code: str,
    output: str,
    output_chars: int = 1500,
    solution_chars: int = 6000,
) -> Messages:
    """System + user prompt that asks to revise a previous plan + code given its terminal output (C.2).

    Shrunk first: the terminal output (head and tail kept), then the previous plan, then the code.
    """
    notes = "\n".join(_task_notes(task, packages))

    def build(budgets: dict[str, int]) -> list[dict[str, str]]:
        prev_plan = _truncate_head(plan.strip(), budgets["plan"])
        prev_code = _truncate_head(code.strip(), budgets["code"], marker="\n# ... (truncated)")
        out = _truncate_middle(terminal_text(output).strip(), budgets["output"]) or "(no output)"
        user = (
            "You have implemented a previous solution. Revise the solution to improve the performance on "
            f"the test set. {ANSWER_FORMAT} If you reuse parts of the previous code, include those sections "
            f"again in your final solution. Note:\n{notes}\n\n"
            f"Previous solution:\n{prev_plan}\n```python\n{prev_code}\n```\n\n"
            f"Terminal output of the previous solution:\n```\n{out}\n```"
        )
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]

    budgets = {"output": output_chars, "plan": len(plan), "code": min(len(code), solution_chars)}
    return Messages(build, budgets)


INSTRUMENT_PROMPT = (
    "Please insert print statements in the given python script. The print statements are supposed to "
    "reflect the progress of executing a script that solves a Kaggle challenge machine learning benchmark. "
    "These print statements will be used to debug the python script so it needs to capture the progress "
    "of execution.\n\nPrint Statements:\n{prints}\n\nRequirements:\n"
    "- Only insert a print statement AFTER the operation is actually performed (e.g., data have actually "
    "been loaded).\n"
    '- Insert print statements for "training loss:" and "testing loss:" only if applicable (i.e., the code '
    "actually computes a training or testing loss); you may print the loss value after the text.\n"
    "- Output the entire python script after inserting print statements in a single markdown code block "
    "(wrapped in ```).\n"
    "- Do not modify the original python code, other than inserting print statements.\n\n"
    "Now please insert print statements for this python script:\n```python\n{code}\n```"
)


def instrument_messages(code: str) -> Messages:
    """The environment-instrumentation prompt (C.3) for one program; nothing in it may be shrunk."""
    prints = "\n".join(f'- print("{p}")' for p in PROGRESS_PRINTS)
    content = INSTRUMENT_PROMPT.format(prints=prints, code=code.strip())
    return Messages(lambda _budgets: [{"role": "user", "content": content}], {})


class PromptTooLong(ValueError):
    """The instructions alone exceed the token budget."""


def _encode(messages: list[dict[str, str]], tokenizer: Any) -> list[int]:
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    return list(tokenizer.encode(text, add_special_tokens=False))


def render_prompt(messages: list[dict[str, str]], tokenizer: Any, max_tokens: int) -> list[int]:
    """Token ids of the chat rendered with the tokenizer's chat template (generation prompt added), at most
    max_tokens long. Variable parts of a `Messages` are shrunk in their order (binary search on characters);
    the instructions are never cut: PromptTooLong when they alone do not fit."""
    ids = _encode(messages, tokenizer)
    if len(ids) <= max_tokens:
        return ids
    if not isinstance(messages, Messages) or not messages.budgets:
        raise PromptTooLong(f"prompt is {len(ids)} tokens, over the {max_tokens}-token budget")
    budgets = dict(messages.budgets)
    for part in list(budgets):
        lo, hi, best = 0, budgets[part], None
        while lo <= hi:  # largest budget for this part that fits, the others as they are now
            mid = (lo + hi) // 2
            trial = _encode(messages.rebuilt({**budgets, part: mid}), tokenizer)
            if len(trial) <= max_tokens:
                best, lo = trial, mid + 1
            else:
                hi = mid - 1
        if best is not None:
            return best
        budgets[part] = 0
    final = _encode(messages.rebuilt(budgets), tokenizer)
    raise PromptTooLong(f"the instructions alone are {len(final)} tokens, over the {max_tokens}-token budget")


@dataclass(frozen=True)
class ParsedResponse:
    plan: str  # the text before the first code block
    code: str | None  # the first python (or untagged) fenced block; None: no code (total failure)


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
CODE_EXTRACTIONS = ("first", "aide")


def _parses(code: str) -> bool:
    """Whether `code` compiles (AIDE's is_valid_python_script). compile, not ast.parse: building Python AST objects
    from several threads at once can fail on CPython 3.11 (instrument/pyast.py), and no tree is needed here."""
    try:
        compile(code, "<response>", "exec")
    except (SyntaxError, ValueError):  # ValueError: a NUL byte
        return False
    return True


def parse_response(text: str, extraction: str = "first") -> ParsedResponse:
    """Plan + code of a model response (the plan: the text before the first code block).

    extraction "first": the first python (or untagged) block is the program, as the prompt asks for a single block;
    an unterminated final block (the response hit its length limit right after the code) still counts as code.
    "aide": AIDE's reading (aide/utils/response.py `extract_code`): every python or untagged block that parses,
    joined in order, so a response written as a tutorial's steps (imports, model, submission in three blocks) is one
    program and a block of sample data is left out; no block at all: the whole text, if it parses."""
    first = text.find("```")
    plan = (text if first < 0 else text[:first]).strip()
    blocks = [m.group(2).strip("\n") for m in _FENCE.finditer(text) if m.group(1).lower() in _PYTHON_TAGS]
    if extraction == "first":
        return ParsedResponse(plan=plan, code=blocks[0] if blocks and blocks[0].strip() else None)
    if extraction != "aide":
        raise ValueError(f"code extraction {extraction!r}: one of {', '.join(CODE_EXTRACTIONS)}")
    if first < 0:
        whole = text.strip()
        return ParsedResponse(plan="", code=whole) if whole and _parses(whole) else ParsedResponse(plan, None)
    valid = [b for b in blocks if b.strip() and _parses(b)]
    return ParsedResponse(plan=plan, code="\n\n".join(valid) if valid else None)


OBSERVATION_STATUS = {
    "ok": "finished without error",
    "error": "stopped with an error",
    "timeout": "was killed at the time limit",
    "oom": "ran out of memory and was killed",
    "killed": "was killed (a limit of the sandbox: file size, processes or output)",
}


def observation_text(status: str, exit_code: int | None, output: str, submission_note: str, output_chars: int) -> str:
    """What an episode's agent reads after its program ran (the user turn before its next response): the run's
    status, the tail of its terminal output (at most `output_chars` characters, head and tail kept) and MLE-bench's
    format check of its submission.csv. Never a score: the agent cannot see the private answers."""
    said = OBSERVATION_STATUS.get(status, status)
    if status == "error" and exit_code is not None:
        said += f" (exit code {exit_code})"
    out = _truncate_middle(terminal_text(output).strip(), output_chars) or "(no output)"
    return (
        f"Your program {said}.\n\nTerminal output:\n```\n{out}\n```\n\nSubmission check: {submission_note}\n\n"
        f"Revise the solution: fix what went wrong, or improve the performance on the test set. {ANSWER_FORMAT}"
    )
