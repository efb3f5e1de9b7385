"""The sandbox interface, what every backend shares, and `make_sandbox(backend, **opts)`.

Backends: "bwrap" (default; bubblewrap on this host) and "docker" (docker SDK; Podman's compatible
socket works). Both give the program the same view:

  /workdir/<task-id>/prepared/public/   the task's public data, read-only (DATA_MOUNT; the prompt says so)
  /workdir/<task-id>/work/              a fresh writable dir, the cwd; ./submission.csv is collected
  /opt/sandbox-venv                     the agent's python (read-only)
  /tmp                                  private, size-capped tmpfs

and nothing else of the host: no network, no private answers, checkpoints or run dirs. There is no
unsandboxed backend.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
from typing import Protocol

from mle_jax.executor.result import ExecResult, Limits, Status
from mle_jax.tasks.prompts import data_mount
from mle_jax.tasks.task import Task

BACKENDS = ("bwrap", "docker")
WORK_MOUNT = "/workdir/{task_id}/work"

# stderr markers of an allocation failure under RLIMIT_AS (the kernel OOM killer leaves none)
_OOM_MARKERS = ("MemoryError", "std::bad_alloc", "Cannot allocate memory", "Unable to allocate")


class Sandbox(Protocol):
    backend: str

    def run(self, code: str, task: Task, limits: Limits) -> ExecResult: ...


def work_mount(task_id: str) -> str:
    return WORK_MOUNT.format(task_id=task_id)


def sandbox_env(task_id: str, limits: Limits, venv_mount: str) -> dict[str, str]:
    """The whole environment of the program (nothing of the host's leaks in)."""
    threads = str(max(1, int(limits.cpus)))
    return {
        "PATH": f"{venv_mount}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": work_mount(task_id),
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",  # progress prints reach us even when the program is killed
        "PYTHONDONTWRITEBYTECODE": "1",
        "MPLBACKEND": "Agg",
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
    }


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
    if exit_code is None or exit_code >= 0:
        return ""
    try:
        return signal.Signals(-exit_code).name
    except ValueError:
        return f"signal {-exit_code}"


class UidPool:
    """Unprivileged host uids, one per concurrent run, so RLIMIT_NPROC counts one run's processes only."""

    def __init__(self, base: int = 200_000, span: int = 50_000):
        self.base, self.span = base, span
        self._lock = threading.Lock()
        self._in_use: set[int] = set()
        self._counter = itertools.count((os.getpid() * 97) % span)

    def acquire(self) -> int:
        with self._lock:
            while True:
                uid = self.base + next(self._counter) % self.span
                if uid not in self._in_use:
                    self._in_use.add(uid)
                    return uid

    def release(self, uid: int) -> None:
        with self._lock:
            self._in_use.discard(uid)


def make_sandbox(backend: str = "bwrap", **opts) -> Sandbox:
    """A sandbox of the named backend; opts go to its constructor (see BwrapSandbox, DockerSandbox)."""
    if backend == "bwrap":
        from mle_jax.executor.bwrap import BwrapSandbox

        return BwrapSandbox(**opts)
    if backend == "docker":
        from mle_jax.executor.docker import DockerSandbox

        return DockerSandbox(**opts)
    raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {BACKENDS}")


__all__ = [
    "BACKENDS",
    "ExecResult",
    "Limits",
    "Sandbox",
    "Status",
    "UidPool",
    "classify",
    "data_mount",
    "make_sandbox",
    "sandbox_env",
    "signal_exit_code",
    "work_mount",
]
