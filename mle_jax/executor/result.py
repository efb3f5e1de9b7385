"""What an executor returns for one run of agent code, the limits it runs under, how a finished run is
classified (the rules every backend applies) and what became of a sample that ran, or did not (its outcome)."""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass, field
from pathlib import Path


class Status(enum.StrEnum):
    OK = "ok"  # exited 0
    ERROR = "error"  # exited non-zero
    TIMEOUT = "timeout"  # wall clock limit; whole process tree killed
    OOM = "oom"  # memory limit hit
    KILLED = "killed"  # killed by a signal / other limit (file size, processes, output)
    INFRA = "infra"  # executor failed (after one retry): not the agent's fault, never trained on


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 600.0
    memory_mb: int = 4096
    cpus: int = 1
    max_procs: int = 256
    max_file_mb: int = 512
    max_output_bytes: int = 64 * 1024  # head and tail kept, middle elided


@dataclass
class ExecResult:
    """One sandboxed run. duration_s is the program's wall time inside the sandbox (Δt)."""

    status: Status
    exit_code: int | None
    duration_s: float
    stdout_tail: str
    stderr_tail: str
    submission_path: Path | None  # a copy outside the sandbox, or None when none was written
    extra: dict = field(default_factory=dict)

    @property
    def infra_failure(self) -> bool:
        return self.status is Status.INFRA


# stderr markers of an allocation failure under RLIMIT_AS (the kernel OOM killer leaves none)
_OOM_MARKERS = ("MemoryError", "std::bad_alloc", "Cannot allocate memory", "Unable to allocate")


def signal_exit_code(code: int | None) -> int | None:
    """Shell convention 128+N (what bwrap and docker report for a signalled program) -> -N."""
    if code is not None and 128 < code <= 128 + 64:
        return -(code - 128)
    return code


def classify(exit_code: int | None, timed_out: bool, oom: bool, killed_reason: str, stderr_tail: str) -> Status:
    """Status of a finished run. exit_code < 0 means killed by signal -exit_code."""
    if timed_out:
        return Status.TIMEOUT
    if oom:
        return Status.OOM
    if killed_reason:
        return Status.KILLED
    if exit_code == 0:
        return Status.OK
    if exit_code is not None and exit_code != 0 and any(m in stderr_tail for m in _OOM_MARKERS):
        return Status.OOM
    if exit_code is not None and exit_code < 0:
        return Status.KILLED
    return Status.ERROR


def signal_name(exit_code: int | None) -> str:
    """ "SIGKILL" for exit code -9; "" for a program that exited."""
    if exit_code is None or exit_code >= 0:
        return ""
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


# What became of a sample, for the report's failure plot and the samples page: a valid submission, or why not
OUTCOMES: tuple[str, ...] = (
    "valid",
    "no_code",  # the response had no code block: never run
    "syntax_error",
    "runtime_error",
    "timeout",
    "oom",
    "killed",  # a limit other than time and memory (file size, processes, output, disk), or a signal
    "invalid_submission",  # ran without error; the grader rejected its submission (or none was written)
)
_SYNTAX_ERRORS = ("SyntaxError", "IndentationError", "TabError")


def error_line(result: ExecResult | None) -> str | None:
    """The line that says why a run failed: the last line of stderr (a Python traceback ends with its exception),
    else what ended it; None for a run without error (or none at all)."""
    if result is None or result.status is Status.OK:
        return None
    if result.status is Status.TIMEOUT:
        return f"timed out after {result.duration_s:.0f} s"
    last = next((line.strip() for line in reversed((result.stderr_tail or "").splitlines()) if line.strip()), "")
    if last:
        return last[:300]
    if result.status is Status.KILLED:
        return f"killed ({result.extra.get('killed_reason') or result.extra.get('signal') or 'a limit'})"
    if result.status is Status.OOM:
        return "out of memory"
    return f"exit code {result.exit_code}"


def outcome(result: ExecResult | None, valid: bool) -> str:
    """One of OUTCOMES: what became of a sample whose run is `result` (None: it had no code) and whose submission
    was `valid` or not."""
    if valid:
        return "valid"
    if result is None:
        return "no_code"
    if result.status is Status.OK:
        return "invalid_submission"
    if result.status in (Status.TIMEOUT, Status.OOM, Status.KILLED):
        return str(result.status)
    line = error_line(result) or ""
    return "syntax_error" if line.startswith(_SYNTAX_ERRORS) else "runtime_error"
