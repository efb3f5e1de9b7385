"""One sample's path through the environment: prompt → sampler → instrumenter → executor → grader → reward."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from mle_jax.env.improve_buffer import ImproveBuffer, PreviousSolution
from mle_jax.env.observation import Observation, observation_ids, observe, observe_run
from mle_jax.env.settings import RolloutSettings
from mle_jax.env.task_mix import PromptStream
from mle_jax.executor.fleet import Fleet
from mle_jax.executor.grading import grade_run
from mle_jax.executor.result import ExecResult, error_line, outcome
from mle_jax.instrument.tagging import strip_agent_progress, tag_progress
from mle_jax.models.tokenizer import stop_token_ids
from mle_jax.sampling.protocol import Completion, Sampler
from mle_jax.tasks import prompts as prompt_lib
from mle_jax.tasks.medals import medal
from mle_jax.tasks.progress import new_tag, untag
from mle_jax.tasks.reward import Reward, compute_reward
from mle_jax.tasks.submission_format import FormatCheck
from mle_jax.tasks.task import Task

InstrumentFn = Callable[[list[str]], list[Any]]  # programs -> instrument.Instrumented, one each

# the texts of a sample's record (`Sample.record(output_chars)`): what samples.jsonl drops first when it is over its
# size (infra.metrics.MetricsWriter), keeping the figures
TEXT_FIELDS: tuple[str, ...] = (
    "plan", "program", "instrumenter_lines", "stdout", "stderr", "progress_lines", "observation"
)  # fmt: skip


def terminal_output(result: ExecResult) -> str:
    """What a run printed, as the improve prompt shows it: stdout, then stderr (errors come last)."""
    return (result.stdout_tail or "") + ("\n" + result.stderr_tail if result.stderr_tail else "")


def previous_output(result: ExecResult, output_chars: int, tag: str | None = None) -> str:
    """The part of a run's terminal output an improve prompt receives: its last `output_chars` characters,
    with the instrumenter's per-run tag removed."""
    text = terminal_output(result)
    return (untag(text, tag) if tag else text)[-output_chars:]


@dataclass
class PromptItem:
    kind: str  # "scratch" | "improve"
    prompt_ids: list[int]
    parent: PreviousSolution | None = None
    task: str = ""  # the id of the task it asks about ("": the environment's first task)


@dataclass
class Sample:
    """Everything known about one sample; filled in as it moves through the boxes."""

    uid: int
    prompt: PromptItem
    completion: Completion
    plan: str
    code: str | None  # None: the response had no code block (total failure, never executed)
    # the samples of one prompt sampled together (sampler.group_size) share it: the uid of the group's first
    # member; -1 (default): the sample is its own group
    group: int = -1
    # the id of the task whose prompt this sample answers (a run may mix several tasks; config.tasks);
    # "" in code that builds samples by hand for one task
    task: str = ""
    instrumented_code: str | None = None
    instrument_path: str = "off"
    tag: str | None = None  # per-run marker of the instrumenter's prints (only those earn credit)
    future: Future | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    result: ExecResult | None = None
    reward: Reward | None = None
    # episodes (env/episodes.py): the uid of the episode's first turn (-1: its own, a one-turn episode), this turn's
    # number (from 1), what the agent observes of the run, and, once a next turn follows, the text it was shown and
    # (conversation context) the tokens appended after this turn's response
    episode: int = -1
    turn: int = 1
    observation: Observation | None = None
    observation_text: str | None = None
    observation_ids: list[int] | None = None
    grade_reason: str = ""  # the grader's reason when the submission is invalid (executor.grading.grade_run)

    def __post_init__(self) -> None:
        if self.group < 0:
            self.group = self.uid
        if self.episode < 0:
            self.episode = self.uid

    @property
    def version(self) -> int:
        return self.completion.version

    @property
    def done(self) -> bool:
        return self.reward is not None or (self.result is not None and self.result.infra_failure)

    @property
    def duration_s(self) -> float:
        return 0.0 if self.result is None else float(self.result.duration_s)

    @property
    def raw_output(self) -> str:
        return "" if self.result is None else terminal_output(self.result)

    @property
    def output(self) -> str:
        """The terminal output as the paper shows it (progress prints untagged)."""
        return untag(self.raw_output, self.tag) if self.tag else self.raw_output

    def record(self, output_chars: int | None = None) -> dict:
        """The sample as one JSON line (samples.jsonl, evaluation.json): for analysis of kinds, lags, Δt.

        Its figures, the program's outcome (executor.result.OUTCOMES), the line that says why it failed, the
        grader's reason when its submission is invalid and its MLE-bench medal. With `output_chars`, also its texts
        (TEXT_FIELDS): the plan, the instrumented program with the instrumenter's lines (1-based), and the last
        `output_chars` characters of stdout and of stderr with the lines of stdout the instrumenter's prints wrote."""
        r = self.reward
        valid = bool(r is not None and r.valid)
        rec = {
            "uid": self.uid,
            "group": self.group,
            "version": self.version,
            "server": self.completion.server or None,  # the vLLM server that sampled it (None: in process)
            "prompt": self.prompt.kind,
            "task": self.task,
            "duration_s": round(self.duration_s, 3),
            "status": None if self.result is None else str(self.result.status),
            "reward": None if r is None else r.total,
            "valid": None if r is None else r.valid,
            "score": None if r is None else r.score,
            "prints": None if r is None else r.n_prints,
            "instrument": self.instrument_path,
            "code": self.code,
            "episode": self.episode,
            "turn": self.turn,
            "submission_format_ok": None if self.observation is None else self.observation.submission_ok,
            "outcome": None if r is None else outcome(self.result, valid),
            "error": error_line(self.result),
            "grader_reason": None if r is None or valid else (self.grade_reason or None),
            "medal": _medal(self.task, r.score) if valid else None,
        }
        if output_chars is not None:
            rec.update(self.texts(output_chars))
        return rec

    def texts(self, output_chars: int) -> dict:
        """TEXT_FIELDS of `record`: the instrumenter's tag is removed from the program and the output, and the lines
        that carried it are listed instead."""
        program, marked = untag_program(self.instrumented_code, self.tag)
        stdout, printed = tail_lines(self.result.stdout_tail if self.result else "", self.tag, output_chars)
        stderr, _ = tail_lines(self.result.stderr_tail if self.result else "", self.tag, output_chars)
        # observation: the text the agent was shown after this turn (None: none was)
        return {"plan": self.plan, "program": program, "instrumenter_lines": marked, "stdout": stdout,
                "stderr": stderr, "progress_lines": printed, "observation": self.observation_text}  # fmt: skip


def _medal(task: str, score: float | None) -> str | None:
    """The MLE-bench level of a valid score; None for a task without medal thresholds."""
    try:
        return medal(task, score) if task and score is not None else None
    except KeyError:
        return None


def untag_program(program: str | None, tag: str | None) -> tuple[str | None, list[int]]:
    """An instrumented program (instrument.tagging.tag_progress) without its tag, and the 1-based numbers of the
    lines the tag was on: the instrumenter's progress prints."""
    if program is None or not tag:
        return program, []
    marker = repr(tag) + ", "
    lines = program.split("\n")
    marked = [i + 1 for i, line in enumerate(lines) if marker in line]
    return "\n".join(line.replace(marker, "") for line in lines), marked


def tail_lines(text: str, tag: str | None, chars: int) -> tuple[str, list[int]]:
    """The last `chars` characters of a run's output with the tag removed, and the 1-based numbers (in that tail)
    of the lines that carried it: the ones the instrumenter's prints wrote."""
    lines = (text or "").split("\n")
    if tag:
        prefix = re.compile("^" + re.escape(tag) + " ?")
        marked = [bool(prefix.match(line)) for line in lines]
        lines = [prefix.sub("", line) for line in lines]
    else:
        marked = [False] * len(lines)
    whole = "\n".join(lines)
    cut = max(0, len(whole) - chars)
    dropped = whole.count("\n", 0, cut)  # whole lines before the tail (the first kept one may be cut)
    return whole[cut:], [i + 1 for i, m in enumerate(marked[dropped:]) if m]


@dataclass
class Environment:
    """The boxes a sample passes through, and how: prompt → sampler → instrumenter → executor fleet → grader →
    reward. The RL loop and the evaluation both drive one; neither knows how a box works inside.

    A run over a mix of tasks holds them all (`tasks`, `task` the first): the RL loop's prompts follow a seeded
    (task, kind) stream (rl/task_mix.py) drawn by `weights`, each sample carries its task, and its program runs on
    that task's data and is graded by that task's grader."""

    settings: RolloutSettings
    task: Task
    tokenizer: Any
    packages: list[str]
    sampler: Sampler
    instrument_fn: InstrumentFn
    fleet: Fleet
    tasks: dict[str, Task] = field(default_factory=dict)  # every task of the mix by id (default: `task` alone)
    weights: tuple[float, ...] = ()  # each task's sampling weight, in `tasks` order (default: equal)
    seed: int = 0  # of the (task, kind) stream
    timeouts_s: dict[str, float] = field(default_factory=dict)  # a task's own run timeout (default: settings.limits')

    def __post_init__(self) -> None:
        self.tasks = dict(self.tasks) or {self.task.id: self.task}
        self.task = next(iter(self.tasks.values()))
        weights = self.weights or (1.0,) * len(self.tasks)
        self.stream = PromptStream(list(self.tasks), weights, self.settings.prompt.improve_fraction, self.seed)
        self._scratch_ids: dict[str, list[int]] = {}
        self._stop_ids: list[int] | None = None

    def task_of(self, item: Sample | PromptItem | PreviousSolution) -> Task:
        """The task a sample, prompt or earlier solution belongs to."""
        return self.tasks[item.task or self.task.id]

    def prompts(
        self,
        n: int,
        buffer: ImproveBuffer | None,
        rng: np.random.Generator,
        improve_fraction: float | None = None,
        task_id: str | None = None,
    ) -> list[PromptItem]:
        """n prompts. Without `improve_fraction` or `task_id` (the RL loop), the next n (task, kind) draws of the
        run's stream; a draw of kind "improve" shows an earlier solution of its task from `buffer` (when there is
        none, a scratch prompt, and a later scratch draw of the task becomes the improve prompt it owes). With them
        (an evaluation), n prompts of `task_id` (default the first task),
        each an improve prompt with probability improve_fraction (default prompt.improve_fraction)."""
        stream = improve_fraction is None and task_id is None
        if stream:
            draws = self.stream.take(n)
        else:
            task_id = task_id or self.task.id
            fraction = self.settings.prompt.improve_fraction if improve_fraction is None else improve_fraction
            draws = [(task_id, "improve" if rng.random() < fraction else "scratch") for _ in range(n)]
        items = []
        for task_id, kind in draws:
            parent = None
            if buffer is not None and (kind == "improve" or (stream and self.stream.owed.get(task_id))):
                parent = buffer.sample(rng, task=task_id)
            if stream:  # an improve draw with nothing to show is owed to a later scratch draw (PromptStream)
                kind = self.stream.settle(task_id, kind, parent is not None)
            items.append(self.improve_prompt(parent) if kind == "improve" and parent else self.scratch_prompt(task_id))
        return items

    def scratch_prompt(self, task_id: str) -> PromptItem:
        """The prompt that asks for a solution of `task_id` from scratch (the same every time: rendered once)."""
        if task_id not in self._scratch_ids:
            p = self.settings.prompt
            scratch = prompt_lib.scratch_messages(self.tasks[task_id], self.packages, p.snippet_chars)
            self._scratch_ids[task_id] = list(prompt_lib.render_prompt(scratch, self.tokenizer, p.max_prompt_tokens))
        return PromptItem("scratch", list(self._scratch_ids[task_id]), task=task_id)

    def improve_prompt(self, parent: PreviousSolution) -> PromptItem:
        """The prompt that shows `parent` (plan, code, output) and asks for a better solution."""
        task = self.task_of(parent)
        msgs = prompt_lib.improve_messages(task, self.packages, parent.plan, parent.code, parent.output)
        ids = prompt_lib.render_prompt(msgs, self.tokenizer, self.settings.prompt.max_prompt_tokens)
        return PromptItem("improve", ids, parent, task=task.id)

    def memory_parts(self) -> dict[str, Any]:
        """The weights this process holds for sampling (infra.metrics.memory_breakdown): the policy's sampler's and
        the LM instrumenter's (in-process samplers only; a vLLM server holds its own)."""
        frozen = getattr(self.instrument_fn, "sampler", None)  # an instrument.Instrumenter's frozen LM
        return {"sampler": getattr(self.sampler, "state", None), "instrumenter": getattr(frozen, "state", None)}

    def sample(self, prompts: Sequence[PromptItem], first_uid: int, n: int = 1) -> list[Sample]:
        """Generates n responses per prompt (one request of n samples: the sampler's `n`) and parses plan + code.

        Returns len(prompts) * n samples, prompt 0's n first, with uids first_uid, first_uid + 1, ...; the n
        samples of a prompt form a group whose id is the uid of its first member."""
        ids = [p.prompt_ids for p in prompts]
        completions = self.sampler.generate(ids, n=n, **self.settings.sampling.generate_kwargs())
        if len(completions) != len(prompts) * n:
            raise RuntimeError(f"the sampler returned {len(completions)} completions for {len(prompts)} x {n}")
        out = []
        for i, c in enumerate(completions):
            p, group = prompts[i // n], first_uid + (i // n) * n
            parsed = prompt_lib.parse_response(c.text, self.settings.prompt.code_extraction)
            task = p.task or self.task.id
            out.append(
                Sample(
                    uid=first_uid + i,
                    prompt=p,
                    completion=c,
                    plan=parsed.plan,
                    code=parsed.code,
                    group=group,
                    task=task,
                )
            )
        return out

    def submit(self, samples: Sequence[Sample]) -> None:
        """Instruments the samples' code (one batch: the LM instrumenter sees them in one generate call)
        and submits each program to the executor fleet.

        A sample without code never runs: it is finished at once with the total-failure reward.
        """
        reward = self.settings.reward
        runnable = [s for s in samples if s.code is not None]
        for s in samples:
            if s.code is None:
                s.reward = compute_reward(None, "", self.task_of(s).lower_is_better, reward)
                s.observation = observe(None, None, FormatCheck(False, ""))
        # the agent's own progress prints earn nothing: removed before instrumenting, and the
        # instrumenter's prints carry a per-run tag the agent cannot know (tasks/progress.py)
        cleaned = [strip_agent_progress(s.code) for s in runnable]
        for s, inst in zip(runnable, self.instrument_fn(cleaned) if runnable else [], strict=True):
            s.tag = new_tag()
            s.instrumented_code, s.instrument_path = tag_progress(inst.code, s.tag), inst.path
            self.queue(s)

    def queue(self, sample: Sample) -> None:
        """Queues an instrumented sample's program in the executor fleet (again, for one taken back from the queue)."""
        sample.submitted_at = time.monotonic()
        task = self.task_of(sample)
        limits = self.settings.limits
        if task.id in self.timeouts_s:
            limits = replace(limits, timeout_s=self.timeouts_s[task.id])
        sample.future = self.fleet.submit(sample.instrumented_code, task, limits)

    def finish(self, sample: Sample, result: ExecResult) -> Sample:
        """Grades a finished run (outside the sandbox) and computes its reward."""
        reward = self.settings.reward
        sample.result = result
        if result.infra_failure:
            return sample
        task = self.task_of(sample)
        graded = grade_run(task, result)
        sample.grade_reason = graded.reason
        sample.reward = compute_reward(graded, sample.raw_output, task.lower_is_better, reward, tag=sample.tag)
        # what the agent may learn of its run: MLE-bench's format check from public files, never the grade
        sample.observation = observe_run(result, sample.tag, task)
        results_dir = result.extra.get("results_dir")
        if results_dir:  # the run's captured output and submission copy: graded, so no longer needed
            shutil.rmtree(results_dir, ignore_errors=True)
        return sample

    def next_turn_prompt(self, last: Sample) -> PromptItem:
        """The prompt of the turn after `last` (finished) in its episode (env/episodes.py), of the start's kind.

        context "conversation": last's prompt ids, its response's tokens as sampled, then the observation as a user
        turn of the chat template (at most agent.observation_tokens: the output tail shrinks to fit). context
        "state": the improve prompt (C.2) about last's program and its output. Either way the text shown is kept in
        last.observation_text (and the appended tokens in last.observation_ids)."""
        p = self.settings.prompt
        if self.settings.agent.context == "state":
            previous = self.previous(last)
            last.observation_text = previous.output
            item = self.improve_prompt(previous)
            return PromptItem(last.prompt.kind, item.prompt_ids, last.prompt.parent, task=last.task)
        if self._stop_ids is None:
            self._stop_ids = stop_token_ids(self.tokenizer)
        obs = last.observation
        ids, text = observation_ids(
            self.tokenizer,
            obs.text,
            last.completion.token_ids,
            self._stop_ids,
            p.output_tail_chars,
            self.settings.agent.observation_tokens,
        )
        last.observation_ids, last.observation_text = ids, text
        prompt_ids = [*last.prompt.prompt_ids, *(int(t) for t in last.completion.token_ids), *ids]
        return PromptItem(last.prompt.kind, prompt_ids, last.prompt.parent, task=last.task)

    def next_turns(self, lasts: Sequence[Sample], first_uid: int) -> list[Sample]:
        """Samples the next turn of each episode whose turn `lasts[i]` finished (one generate call, the current
        weights), as members of its episode and group; then instruments and submits them like `submit`."""
        prompts = [self.next_turn_prompt(s) for s in lasts]
        out = self.sample(prompts, first_uid)
        for new, last in zip(out, lasts, strict=True):
            new.group, new.episode, new.turn = last.group, last.episode, last.turn + 1
        self.submit(out)
        return out

    def previous(self, sample: Sample) -> PreviousSolution:
        """A finished sample as an improve prompt shows it."""
        return to_previous(sample, self.settings.prompt.output_tail_chars)


def to_previous(sample: Sample, output_chars: int) -> PreviousSolution:
    r = sample.reward
    return PreviousSolution(
        plan=sample.plan,
        code=sample.code or "",
        output="" if sample.result is None else previous_output(sample.result, output_chars, sample.tag),
        reward=float(r.total) if r else 0.0,
        valid=bool(r.valid) if r else False,
        score=None if r is None or r.score is None else float(r.score),
        version=sample.version,
        task=sample.task,
    )
