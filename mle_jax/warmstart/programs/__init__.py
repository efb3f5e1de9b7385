"""The warm-start corpus generators, one module per task.

Adding a task: write `mle_jax/warmstart/programs/<name>.py` with `TASK_ID = "<MLE-bench id>"` and
`def programs(packages: frozenset[str]) -> list[CorpusItem]` that enumerates the task's whole grid
(model families x features x hyperparameters, each a plan + a complete program, see
`mle_jax.warmstart.corpus`), and optionally `KINDS`, (family, regex) pairs that tell a program's model
family from its code (`solution_kind`). Modules here are found by name; nothing else needs registering. A task
defined outside mle_jax registers its generator module with `register`.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from mle_jax.warmstart.corpus import CorpusItem, select_balanced

Generator = Callable[[frozenset[str]], list[CorpusItem]]


_REGISTERED: dict[str, ModuleType] = {}  # generators of tasks defined outside mle_jax (`register`)


def _check(module: ModuleType) -> str:
    """The module's TASK_ID, once checked that it defines TASK_ID and programs(packages)."""
    task_id, fn = getattr(module, "TASK_ID", None), getattr(module, "programs", None)
    if not isinstance(task_id, str) or not callable(fn):
        raise TypeError(f"{module.__name__} must define TASK_ID (str) and programs(packages)")
    return task_id


@functools.cache
def _package_modules() -> dict[str, ModuleType]:
    out: dict[str, ModuleType] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        task_id = _check(module)
        if task_id in out:
            raise ValueError(f"two corpus generators for {task_id!r}")
        out[task_id] = module
    return out


def _modules() -> dict[str, ModuleType]:
    return {**_package_modules(), **_REGISTERED}


def register(module: ModuleType) -> None:
    """The corpus generator of a task defined outside mle_jax (tasks/prepare.define_task): a module like the ones
    here (module doc), wherever it lives."""
    task_id = _check(module)
    if task_id in _modules():
        raise ValueError(f"two corpus generators for {task_id!r}")
    _REGISTERED[task_id] = module


def _generators() -> dict[str, Generator]:
    return {task_id: module.programs for task_id, module in _modules().items()}


def solution_kind(task_id: str, code: str | None) -> str:
    """The model family a program uses, by its task module's KINDS ("no code" for None, "other" if none
    matches or the task has no KINDS)."""
    if code is None:
        return "no code"
    module = _modules().get(task_id)
    for kind, pattern in getattr(module, "KINDS", ()):
        if re.search(pattern, code):
            return kind
    return "other"


def registered_tasks() -> list[str]:
    """Task ids that have a corpus generator."""
    return sorted(_generators())


def full_grid(task_id: str, packages: Iterable[str] | None = None) -> list[CorpusItem]:
    """Every program the generator for `task_id` can write given the sandbox's `packages`
    (None: only the packages every sandbox has: numpy, pandas, scipy, scikit-learn)."""
    generators = _generators()
    if task_id not in generators:
        raise KeyError(f"no warm-start corpus generator for task {task_id!r}; have {registered_tasks()}")
    pkgs = frozenset(p.lower().replace("_", "-") for p in (packages or ()))
    return generators[task_id](pkgs)


def generate_corpus(task: Any, n: int, seed: int = 0, packages: Iterable[str] | None = None) -> list[CorpusItem]:
    """`n` distinct programs for the task (a TaskSpec, Task or id), chosen deterministically by `seed` and
    balanced over model families (`corpus.select_balanced`)."""
    task_id = task if isinstance(task, str) else task.id
    grid = full_grid(task_id, packages)
    if not 0 < n <= len(grid):
        raise ValueError(f"n={n} but the {task_id} grid has {len(grid)} distinct programs (1..{len(grid)})")
    return select_balanced(grid, n, seed)
