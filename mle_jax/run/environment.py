"""The environment a run's samples pass through, wired in one place from the settings: the prepared task and
the sandbox's packages, the executor fleet, the policy's sampler and the instrumenter (rl/rollout.py
`Environment`).

A run (`run.py`), the evaluate CLI, the experiments and the benchmarks all build theirs here, so that they
sample, instrument, run and grade exactly as a run does; they differ only in the policy and, for an evaluation,
a fresh sampler.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mle_jax.env.rollout import Environment
from mle_jax.executor.fleet import make_fleet
from mle_jax.executor.runtime import sandbox_packages
from mle_jax.models.qwen2 import Qwen2ForCausalLM
from mle_jax.run import builders
from mle_jax.run.settings import RunSettings
from mle_jax.sampling.protocol import Sampler
from mle_jax.tasks.prepare import prepare_task
from mle_jax.tasks.task import Task


def prepare(s: RunSettings) -> tuple[Task, list[str]]:
    """(the run's first task, prepared from its raw data if need be; the packages its sandbox offers, which the
    prompts list)."""
    return prepare_task(s.task), sandbox_packages()


def prepare_mix(s: RunSettings) -> tuple[list[Task], list[str]]:
    """(every task of the run's mix, `s.task` first, each prepared from its raw data if need be; the sandbox's
    packages)."""
    return [prepare_task(t) for t in s.mix], sandbox_packages()


@contextmanager
def open_environment(
    s: RunSettings,
    task: Task | Sequence[Task],
    packages: list[str],
    policy: Qwen2ForCausalLM,
    tokenizer: Any,
    workdir: Path,
    *,
    initial: Qwen2ForCausalLM | None = None,
    sampler: Sampler | None = None,
) -> Iterator[Environment]:
    """The environment of `policy`, its executor fleet closed on exit.

    task: the task, or the tasks of the mix (from `prepare_mix`; weighed by the settings' `mix_weights` when
    they are the run's mix, else equally).

    initial: the model the frozen instrumenter copies in mode "lm" (the policy RL started from; default `policy`).
    sampler: how the policy is sampled (default the run's: `builders.make_sampler`, in process or vLLM); an
    evaluation passes a fresh `JaxSampler`, whose seeds repeat from one evaluation to the next.
    workdir: where a vLLM sampler exports the weights it is synced with.
    """
    fleet = make_fleet(s.executor)
    made = None  # the sampler made here, closed on exit (a vLLM sampler: its watchers and shared-memory weights)
    try:
        if sampler is None:
            sampler = made = builders.make_sampler(s.sampler, policy, tokenizer, workdir)
        instrument_fn = builders.make_instrumenter(s, policy if initial is None else initial, tokenizer, workdir)
        tasks = [task] if isinstance(task, Task) else list(task)
        ids = [t.id for t in tasks]
        weights = s.mix_weights if ids == [t.id for t in s.mix] else ()
        yield Environment(
            s.rollout,
            tasks[0],
            tokenizer,
            packages,
            sampler,
            instrument_fn,
            fleet,
            tasks={t.id: t for t in tasks},
            weights=weights,
            seed=s.seed,
            timeouts_s=dict(zip((t.id for t in s.mix), s.task_timeouts_s, strict=False)),
        )
    finally:
        fleet.close()
        if made is not None and hasattr(made, "close"):
            made.close()
