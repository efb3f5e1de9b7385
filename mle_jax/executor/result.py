"""What an executor returns for one run of agent code, and the limits it runs under."""

from __future__ import annotations

import enum
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
