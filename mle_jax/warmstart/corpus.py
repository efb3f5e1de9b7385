"""A deterministic corpus of verified solution programs for the warm-start SFT stage.

ML-Agent (arXiv 2505.23723) fine-tunes its agent on *diverse* expert trajectories before RL so that
RL can explore. A tiny model trained from scratch has no expert to imitate, so we write the
"experts" by program: a grid over model families × feature sets × hyperparameters, each point
rendered as a short plan (3-5 sentences) plus one complete solution program in the exact format the
RL prompts ask for.

The programs of one task share one skeleton (same imports, same data loading, same variable
names: `features(df)`, `X`, `X_test`, `model`, `pred`), and differ only in the few lines that carry
the choice. That keeps each program short (the tiny model has to learn to write them) and makes a
sampled mixture of two programs likely to still run. The plan names the features and the model
before the code, so the code the model writes is conditioned on a choice it has already stated.

Every program must run and grade before it enters the SFT set: `verify_corpus` runs each one through a
caller-supplied `run_fn` (the real sandbox + grader, see `sandbox_run_fn`) and keeps only valid ones.

The grids themselves live one file per task in `mle_jax/warmstart/programs/` (see its docstring for
how to add one); this module holds what they share: the records, grid helpers, the seeded balanced
selection, and verification in the sandbox.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import shutil
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from rich.progress import Progress

from mle_jax.env.driver import POLL_S, wait_for_runs
from mle_jax.env.rollout import previous_output
from mle_jax.executor.grading import grade_run
from mle_jax.infra import interrupt
from mle_jax.instrument import instrument_batch, pyast
from mle_jax.tasks.graders import GradeResult
from mle_jax.tasks.prompts import data_mount

# ------------------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class CorpusItem:
    """One warm-start example: the plan, the program, and the grid point it came from.

    meta: {"task": id, "model": family, "features": feature set, "hparams": {name: value}}.
    """

    plan: str
    code: str
    meta: dict[str, Any] = field(hash=False, compare=False)

    @property
    def key(self) -> tuple:
        """The grid point: (model, features, sorted hparams). Distinct items have distinct keys."""
        return (self.meta["model"], self.meta["features"], tuple(sorted(self.meta["hparams"].items())))

    def response(self) -> str:
        """The assistant response the RL prompt asks for: the plan, then one fenced python block."""
        return f"{self.plan}\n\n```python\n{self.code}```"


@dataclass(frozen=True)
class VerifiedItem:
    """A corpus item that ran in the sandbox and produced a valid submission with `score`.

    output: the terminal output of that run as an RL improve prompt shows it (the program instrumented
    with progress prints, stdout then stderr, its last `prompt.output_tail_chars` characters).
    """

    item: CorpusItem
    score: float
    duration_s: float
    output: str = ""


class GradeLike(Protocol):
    valid: bool
    score: float | None
    reason: str


# (code) -> (grade, duration_s, terminal output): runs one program on the task and grades its submission.
RunFn = Callable[[str], tuple[GradeLike, float, str]]


def public_dir_in_sandbox(task_id: str) -> str:
    """Where the sandbox mounts the task's public files (what the RL prompt tells the agent)."""
    return data_mount(task_id)


def select_balanced(grid: Sequence[CorpusItem], n: int, seed: int = 0) -> list[CorpusItem]:
    """`n` distinct items of `grid`, chosen deterministically by `seed` and balanced over model families:
    each family's items are shuffled by the seed, then the families are interleaved round-robin, so the
    first n items cover every family before repeating one."""
    if not 0 < n <= len(grid):
        raise ValueError(f"n={n} but the grid has {len(grid)} distinct programs (1..{len(grid)})")
    rng = random.Random(seed)
    by_family: dict[str, list[CorpusItem]] = {}
    for item in grid:
        by_family.setdefault(item.meta["model"], []).append(item)
    families = sorted(by_family)
    rng.shuffle(families)
    for f in families:
        rng.shuffle(by_family[f])
    interleaved = [
        it for group in itertools.zip_longest(*(by_family[f] for f in families)) for it in group if it is not None
    ]
    return interleaved[:n]


def check_parses(items: Sequence[CorpusItem]) -> None:
    """Raises SyntaxError naming the first program that does not parse."""
    for it in items:
        try:
            pyast.parse(it.code)
        except SyntaxError as e:
            raise SyntaxError(f"corpus program {it.key} does not parse: {e}") from e


def verify_corpus(
    items: Sequence[CorpusItem],
    task: Any,
    run_fn: RunFn,
    workers: int = 1,
    progress: bool = True,
    on_result: Callable[[CorpusItem, VerifiedItem | None, str], None] | None = None,
) -> list[VerifiedItem]:
    """Runs every item with `run_fn` and returns those that graded valid, in input order, with score.

    `task` is only used for messages; `run_fn` already knows the task (see `sandbox_run_fn`).
    Invalid programs are dropped (a generator bug: the caller decides whether that is fatal).
    on_result(item, verified or None, reason) is called in this thread as each run finishes (e.g. to cache it);
    reason is the grader's why for an invalid run ("" for a valid one).
    """
    check_parses(items)
    task_id = task if isinstance(task, str) else getattr(task, "id", str(task))

    def one(it: CorpusItem) -> tuple[VerifiedItem | None, str]:
        grade, duration, output = run_fn(it.code)
        if not grade.valid or grade.score is None:
            return None, grade.reason or "graded without a score"
        return VerifiedItem(it, float(grade.score), float(duration), output), ""

    def record(it: CorpusItem, result: tuple[VerifiedItem | None, str]) -> None:
        if on_result is not None:
            on_result(it, *result)

    results = parallel_runs(items, one, workers, progress, f"verify {task_id} corpus", on_result=record)
    return [v for v, _ in results if v is not None]


def parallel_runs(
    items: Sequence[Any],
    fn: Callable[[Any], Any],
    workers: int = 1,
    progress: bool = True,
    label: str = "runs",
    on_result: Callable[[Any, Any], None] | None = None,
) -> list[Any]:
    """[fn(item) for item in items], `workers` at a time in threads (each a sandbox run), in input order.

    on_result(item, result) is called in this thread as each finishes (e.g. to cache it). Ctrl-C (infra.interrupt)
    cancels the queued ones and raises once the running ones end; a progress bar shows `label` when `progress`."""
    results: list[Any] = [None] * len(items)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool, contextlib.ExitStack() as stack:
        index = {pool.submit(fn, it): i for i, it in enumerate(items)}
        bar = None
        if progress:
            bar = stack.enter_context(Progress(transient=True))
            bar_task = bar.add_task(label, total=len(items))
        pending = set(index)
        while pending:
            if interrupt.requested():  # Ctrl-C: queued runs cancelled, running ones end (bounded by their timeout)
                for f in pending:
                    f.cancel()
                raise interrupt.Interrupted(f"stopped while running the warm start's {label} (finished runs are kept)")
            done = wait_for_runs(pending, POLL_S)  # the one wait on runs (env/driver.py)
            pending -= done
            for f in done:
                i = index[f]
                results[i] = f.result()
                if on_result is not None:
                    on_result(items[i], results[i])
                if bar is not None:
                    bar.advance(bar_task)
    return results


def sandbox_run_fn(
    sandbox: Any,
    task: Any,
    limits: Any,
    instrument_mode: str = "ast",
    output_chars: int = 1500,
) -> RunFn:
    """A RunFn over a real sandbox (`make_sandbox(...)`) and the task's grader (`executor.grading.grade_run`).

    The program runs as RL runs it: instrumented with the progress prints (`instrument_mode`: "ast" or
    "off"; the LM instrumenter needs a model, which the warm start is still building), so the returned
    output is what an improve prompt about this program shows (`rollout.previous_output`, the last
    `output_chars` characters). A run that does not exit ok or writes no submission grades invalid, with
    the sandbox's stderr tail in the reason. The run's results folder (its output and submission copy, outside
    the run's workdir) is removed once graded, as a rollout's is.
    """
    if instrument_mode not in ("ast", "off"):
        raise ValueError(f"instrument_mode must be 'ast' or 'off' for corpus verification, got {instrument_mode!r}")

    def run(code: str) -> tuple[GradeLike, float, str]:
        res = sandbox.run(instrument_batch([code], instrument_mode)[0].code, task, limits)
        try:
            graded = grade_run(task, res)
        finally:
            if res.extra.get("results_dir"):
                shutil.rmtree(res.extra["results_dir"], ignore_errors=True)
        if not graded.valid and res.stderr_tail:
            graded = GradeResult(False, None, f"{graded.reason}: {res.stderr_tail[-500:]}")
        return graded, res.duration_s, previous_output(res, output_chars)

    return run


# ------------------------------------------------------------------------------------------------ grid helpers


def fmt(v: Any) -> str:
    """Python literal for a hyperparameter value (floats without trailing noise)."""
    if isinstance(v, float):
        return repr(round(v, 6))
    return repr(v)


def grid(**axes: Sequence[Any]) -> list[dict[str, Any]]:
    names = list(axes)
    return [dict(zip(names, vals, strict=True)) for vals in itertools.product(*(axes[k] for k in names))]
