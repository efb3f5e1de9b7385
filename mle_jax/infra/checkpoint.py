"""Checkpoints: an orbax CheckpointManager over named items (array pytrees and JSON dicts).

A step is written to a temporary folder and renamed when complete (orbax's atomic commit), so a
process killed at any moment leaves either the previous steps or the new one, never half a step.
`keep` bounds how many steps stay on disk. Resume: `latest_step()` then `restore(step, targets)`,
where targets are the live structures (e.g. `Learner.state_dict()`) whose shapes, dtypes and
shardings the restored arrays take. The loop's `--config.resume`:

    ckpt = Checkpointer(workdir / "checkpoints", keep=cfg.checkpoint.keep)
    found = ckpt.restore_latest({"learner": learner.state_dict()}) if cfg.resume else None
    if found:
        step, items = found
        learner.load_state_dict(items["learner"]); loop_state = items["loop"]
    ...
    ckpt.save(step, {"learner": learner.state_dict(), "loop": loop_state})  # loop_state: JSON-able dict

The learner is built from the initial model first, so its frozen reference stays the initial policy.

A resume reads back every item of the step it picks: a step that does not read back whole (a truncated array
file, a torn JSON item) is moved aside to `<directory>.unreadable/` (never deleted), with a one-line warning, and
the resume goes on from the newest step that reads back. When none does, CheckpointError says so in one line.
Half-written `*.orbax-checkpoint-tmp*` folders of a killed save never count as steps; orbax deletes them
(cleanup_tmp_directories) before the next save. A save that fails (a full disk) removes its own at once and raises
CheckpointWriteError, naming the folder; `is_disk_full` tells a full disk from other failures.
"""

from __future__ import annotations

import errno
import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

TMP_MARK = ".orbax-checkpoint-tmp"  # in the name of a step folder orbax has not finished writing
_KINDS_ITEM = "_kinds"  # records which items are arrays and which are JSON, so restore needs no schema
UNREADABLE_SUFFIX = ".unreadable"  # <directory><this>/<step>: where a step that does not read back is moved

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """No checkpoint step reads back; the message is one line and names the folder."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (orbax's error is the cause); its half-written folder has been removed."""

    def __init__(self, directory: Path, error: BaseException):
        super().__init__(f"a checkpoint could not be written to {directory}: {_first_line(error)}")
        self.directory = directory


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or one it was raised from or during, is a full disk: an OSError ENOSPC (or EDQUOT), or
    tensorstore's error for it, which orbax raises as a ValueError naming the OS error code."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if f"os_error_code='{errno.ENOSPC}'" in str(error) or "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _first_line(error: BaseException, limit: int = 200) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:limit] if text else ''}".rstrip(": ")


def _is_json_able(x: Any) -> bool:
    if isinstance(x, Mapping):
        return all(isinstance(k, str) and _is_json_able(v) for k, v in x.items())
    if isinstance(x, list | tuple):
        return all(_is_json_able(v) for v in x)
    return x is None or isinstance(x, str | bool | int | float)


def _abstract(target: Any) -> Any:
    """Concrete arrays -> ShapeDtypeStructs with their shardings (what orbax restores into)."""

    def leaf(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        return x  # numpy leaves stay numpy: orbax restores them as numpy arrays

    return jax.tree.map(leaf, target)


class Checkpointer:
    """Save/restore dicts of named items under `directory`, keeping the last `keep` steps.

    items: name -> pytree of arrays (policy/critic params, optimizer states, step, RNG key) or a
    JSON-able dict (loop state: counters, buffers of previous solutions, the prompt stream position).
    """

    def __init__(self, directory: str | Path, keep: int = 3, async_save: bool = True, read_only: bool = False):
        """read_only: only read a folder another process may be writing (how far a run got): nothing is created,
        saved, deleted or cleaned up, so that its saves in flight (orbax's temporary step folders) are left alone."""
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.directory = Path(directory).absolute()
        self.read_only = read_only
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None if read_only else keep,
            create=not read_only,
            cleanup_tmp_directories=not read_only,  # leftovers of a save killed mid-write
            enable_async_checkpointing=async_save,
            read_only=read_only,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def save(self, step: int, items: Mapping[str, Any], force: bool = False) -> bool:
        """Write `items` as step `step` (asynchronously when enabled; `wait()` blocks until on disk).

        Returns whether a save was started (False when the step already exists and not `force`).
        """
        if _KINDS_ITEM in items:
            raise ValueError(f"item name {_KINDS_ITEM!r} is reserved")
        if not items:
            raise ValueError("save needs at least one item")
        kinds, args = {}, {}
        for name, value in items.items():
            if _is_json_able(value):
                kinds[name] = "json"
                args[name] = ocp.args.JsonSave(json.loads(json.dumps(value)))
            else:
                leaves = jax.tree.leaves(value)
                bad = [
                    type(x).__name__
                    for x in leaves
                    if not isinstance(x, jax.Array | np.ndarray | np.generic | int | float)
                ]
                if bad:
                    raise TypeError(
                        f"item {name!r} mixes arrays with non-array leaves {sorted(set(bad))}; "
                        "pass JSON state as its own item"
                    )
                kinds[name] = "arrays"
                args[name] = ocp.args.StandardSave(value)
        args[_KINDS_ITEM] = ocp.args.JsonSave(kinds)
        try:  # an asynchronous save's failure surfaces here, at the next save, or in wait()/close()
            return self._manager.save(int(step), args=ocp.args.Composite(**args), force=force)
        except Exception as e:
            raise self._write_failed(e) from e

    def item_dir(self, step: int, item: str) -> Path:
        """The folder of one item of a step (e.g. the learner's arrays, which the vLLM sampler can load)."""
        return self.directory / str(step) / item

    def wait(self) -> None:
        """Block until pending asynchronous saves are committed."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            raise self._write_failed(e) from e

    def _write_failed(self, error: Exception) -> CheckpointWriteError:
        """Removes the half-written step folders a failed save leaves (no save is in flight once orbax has raised
        its error: it raises when it waits for the save), so that a full disk keeps only whole steps."""
        if jax.process_index() == 0:
            for tmp in self.directory.glob(f"*{TMP_MARK}*"):
                shutil.rmtree(tmp, ignore_errors=True)
        return CheckpointWriteError(self.directory, error)

    def _whole(self, step: int) -> bool:
        """A step counts only with its item index and orbax's metadata: a process killed while orbax
        deletes an old step (keep-k) leaves a step folder with some of its items and neither of these."""
        d = self.directory / str(step)
        return (d / _KINDS_ITEM).exists() and (d / "_CHECKPOINT_METADATA").exists()

    def latest_step(self) -> int | None:
        """The newest fully written step, or None when there is none."""
        steps = self.all_steps()
        return max(steps) if steps else None

    def all_steps(self) -> list[int]:
        """Whole steps, oldest first."""
        self._manager.reload()
        return sorted(s for s in self._manager.all_steps() if self._whole(s))

    def restore(self, step: int | None = None, targets: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Load every item of `step` (default: the latest).

        targets: name -> live pytree (concrete or abstract arrays) to restore that item into, with the
        same structure, dtypes and shardings. Array items without a target come back as saved
        (numpy-like arrays in nested dicts).
        """
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if step not in self.all_steps():
            raise FileNotFoundError(f"no checkpoint step {step} in {self.directory} (have {self.all_steps()})")
        kinds = self._manager.restore(step, args=ocp.args.Composite(**{_KINDS_ITEM: ocp.args.JsonRestore()}))
        kinds = kinds[_KINDS_ITEM]
        targets = dict(targets or {})
        unknown = set(targets) - set(kinds)
        if unknown:
            raise KeyError(f"targets {sorted(unknown)} not in checkpoint step {step} (items: {sorted(kinds)})")
        args = {}
        for name, kind in kinds.items():
            if kind == "json":
                args[name] = ocp.args.JsonRestore()
            elif name in targets:
                args[name] = ocp.args.StandardRestore(_abstract(targets[name]))
            else:
                args[name] = ocp.args.StandardRestore()
        restored = self._manager.restore(step, args=ocp.args.Composite(**args))
        return {name: restored[name] for name in kinds}

    def json_item(self, step: int, name: str) -> dict[str, Any]:
        """One JSON item of a whole step (the loop's state, say), without reading its arrays: for reports of how far
        a run got while it runs."""
        if step not in self.all_steps():
            raise FileNotFoundError(f"no checkpoint step {step} in {self.directory} (have {self.all_steps()})")
        return self._manager.restore(step, args=ocp.args.Composite(**{name: ocp.args.JsonRestore()}))[name]

    def restore_latest(self, targets: Mapping[str, Any] | None = None) -> tuple[int, dict[str, Any]] | None:
        """(step, items) of the newest checkpoint that reads back whole, or None when the directory has none (a
        fresh run).

        Newer steps that fail to read are moved aside (one warning line each) once an older one has read back, so
        that the resumed run can write their step numbers again (read_only: left where they are); when none reads
        back, nothing is moved and CheckpointError names the folder (the targets may be what is wrong: a different
        model).
        """
        failed: list[tuple[int, str]] = []
        for step in reversed(self.all_steps()):
            try:
                items = self.restore(step, targets)
            except Exception as e:  # orbax and tensorstore raise ValueError, OSError, JSONDecodeError, ... alike
                failed.append((step, _first_line(e)))
                continue
            for bad, why in failed:
                if self.read_only:  # another process's folder: its own resume moves the step aside
                    log.warning("checkpoint step %d in %s is unreadable (%s): read step %d", bad, self.directory, why,
                                step)  # fmt: skip
                    continue
                moved = self.move_aside(bad)
                log.warning(
                    "checkpoint step %d in %s is unreadable (%s): moved to %s; resuming from step %d",
                    bad, self.directory, why, moved, step,
                )  # fmt: skip
            return step, items
        if failed:
            reasons = "; ".join(f"step {s}: {why}" for s, why in failed)
            raise CheckpointError(f"no checkpoint in {self.directory} reads back ({reasons})")
        return None

    def move_aside(self, step: int) -> Path:
        """Moves a step's folder to <directory>.unreadable/<step>[.n] (out of orbax's sight, kept for a look). In a
        multi-process run process 0 moves it (the processes share the folder)."""
        aside = self.directory.with_name(self.directory.name + UNREADABLE_SUFFIX)
        dest, n = aside / str(step), 1
        while dest.exists():
            dest, n = aside / f"{step}.{n}", n + 1
        if jax.process_index() == 0:
            aside.mkdir(parents=True, exist_ok=True)
            (self.directory / str(step)).rename(dest)
        self._manager.reload()
        return dest

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
