"""python -m mle_jax.launch --config=configs/pizza.py:cpu [--config.a.b=v ...] [--print_config | --dry_run]

--print_config prints every field of the config as it resolves (the :cpu/:smol presets and the overrides applied)
and exits. --dry_run checks what the run needs and prints what it would start, one line per part (model and its size,
learner, sampler, sandbox backend, fleet, tasks, batch, checkpoint size, devices), then exits: 0 when nothing is
missing, 2 with one `error:` line per missing piece. Neither starts anything or writes to the workdir.

A mistake in the command (an unknown config arg or field, a bad value) or something the run needs that is
missing (a model folder, a Docker daemon, a vLLM server, the task's data, room on the disk for a checkpoint) ends in
one line saying what and how to fix it, before any work starts; a traceback means a bug.

Ctrl-C stops the run at its next safe point (a finished RL or SFT step is checkpointed, the sandboxes and samplers
are closed) and exits with status 130 and one line; a second Ctrl-C exits at once. A disk that fills up during the
run ends in one line naming the path and the space a checkpoint needs, with no half-written checkpoint left. Either
way the same command resumes the run from its last checkpoint.
"""

from __future__ import annotations

import logging as py_logging
import shutil
import sys
from pathlib import Path

import jax
from absl import app, flags, logging

from mle_jax.infra import interrupt
from mle_jax.infra.checkpoint import CheckpointError, CheckpointWriteError, is_disk_full
from mle_jax.run import dry_run, preflight
from mle_jax.run.cli import config_flag, fail, parse_flags
from mle_jax.run.config_docs import flat_config
from mle_jax.run.settings import ConfigError, RunSettings, from_config
from mle_jax.run.stages import run_settings

CONFIG = config_flag()
flags.declare_key_flag("config")  # defined in run/cli.py: listed by --help as this module's own
PRINT_CONFIG = flags.DEFINE_boolean(
    "print_config", False, "print every field of the resolved config (presets and overrides applied) and exit"
)
DRY_RUN = flags.DEFINE_boolean(
    "dry_run",
    False,
    "check what the run needs and print what it would start, one line each, then exit (2 if something is missing)",
)
RESUME = "run the same command to resume from its last checkpoint"
FIRST_CTRL_C = "Ctrl-C: stopping at the next safe point (the finished step is saved); Ctrl-C again stops at once"
SECOND_CTRL_C = f"interrupted: stopped at once, the step in progress is lost; {RESUME}"


def _stop(line: str, status: int) -> None:
    print(line, file=sys.stderr)
    sys.exit(status)


def _written_path(error: BaseException | None, default: Path) -> Path:
    """The checkpoint folder or file a failed write names (the newest such in the chain of errors), else `default`."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, CheckpointWriteError):
            return error.directory
        if isinstance(error, OSError) and error.filename:
            return Path(error.filename)
        error = error.__cause__ or error.__context__
    return default


def disk_full_line(s: RunSettings, error: BaseException) -> str:
    """One line for a write that failed on a full disk: where, how much is free there, what a checkpoint takes."""
    path = _written_path(error, Path(s.workdir)).absolute()
    where = path
    while not where.exists() and where != where.parent:
        where = where.parent
    free, need = shutil.disk_usage(where).free, preflight.checkpoint_bytes(s)
    room = f"make {preflight.size_text(need - free)} more room there" if need > free else "make room there"
    return (
        f"error: no space left on device writing {path}: {preflight.size_text(free)} free there and a checkpoint of "
        f"this run takes {preflight.size_text(need)}; {room}, then {RESUME}"
    )


class _DropDiskFullLogs(py_logging.Filter):
    """orbax logs a failed background save at ERROR, with its traceback, before raising it to the run: the launcher
    reports a full disk in one line of its own."""

    def filter(self, record: py_logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (is_disk_full(error) or "No space left on device" in record.getMessage())


def _drop_closed_loop_callbacks(unraisable: sys.UnraisableHookArgs, default=sys.unraisablehook) -> None:
    """After a failed orbax save, tensorstore completes the save's other writes into the event loop orbax has closed:
    each callback is reported as unraisable, a traceback per array. The failure itself is reported by the run."""
    error = unraisable.exc_value
    if unraisable.object is None and isinstance(error, RuntimeError) and str(error) == "Event loop is closed":
        return
    default(unraisable)


def _dry_run(settings: RunSettings) -> int:
    """Prints what the run would start and what it lacks; the exit status: 0 ready, 2 something missing."""
    devices = [d.platform for d in jax.devices()]  # only here: a real run joins its other processes first
    print("\n".join(dry_run.plan_lines(settings, devices)))
    missing = dry_run.problems(settings, devices)
    for line in missing:
        print(f"error: {line}", file=sys.stderr)
    print("dry run: nothing started" + (f"; {len(missing)} missing, as above" if missing else "; ready to run"))
    return 2 if missing else 0


def main(argv: list[str]) -> None:
    del argv
    if not flags.FLAGS["verbosity"].present:  # orbax logs every checkpoint step at INFO; keep the progress bar readable
        logging.set_verbosity(logging.WARNING)
    for name in ("absl", "asyncio"):  # asyncio: a failed save's other writes, "Future exception was never retrieved"
        py_logging.getLogger(name).addFilter(_DropDiskFullLogs())
    sys.unraisablehook = _drop_closed_loop_callbacks
    cfg = CONFIG.value
    if cfg is None:
        fail("--config is required, e.g. --config=configs/pizza.py:cpu")
    try:
        settings = from_config(cfg)  # --print_config too: it prints a config only when the config holds
        if PRINT_CONFIG.value:
            for name, value in flat_config(cfg).items():
                print(f"{name} = {value!r}")
            if not DRY_RUN.value:  # with --dry_run: the config, then what the run would start
                return
        if DRY_RUN.value:
            sys.exit(_dry_run(settings))
        preflight.check(settings)
    except (ConfigError, preflight.PreflightError) as e:
        fail(str(e).replace("\n", "\nerror: "))
    except KeyboardInterrupt:  # nothing started yet
        _stop("interrupted before the run started", interrupt.EXIT_STATUS)
    try:
        with interrupt.stop_on_sigint(FIRST_CTRL_C, SECOND_CTRL_C):
            run_settings(settings, config_json=cfg.to_json_best_effort(indent=2))
    except Exception as e:
        if is_disk_full(e):  # first: a full disk may also end the stop after a Ctrl-C
            _stop(disk_full_line(settings, e), 1)
        if isinstance(e, interrupt.Interrupted):
            _stop(f"interrupted: {e}; {RESUME}", interrupt.EXIT_STATUS)
        if isinstance(e, CheckpointError):  # --config.resume over checkpoints none of which reads back
            fail(str(e))
        raise


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
