"""What every sandbox backend shares: the Sandbox interface, the program's view of the filesystem, its
environment, and the pool of unprivileged uids.

Both backends ("bwrap": bubblewrap on this host, the default; "docker": the docker SDK, Podman's
compatible socket works) give the program the same view:

  /workdir/<task-id>/prepared/public/   the task's public data, read-only (data_mount; the prompt says so)
  /workdir/<task-id>/work/              a fresh writable dir, the cwd; ./submission.csv is collected
  /opt/sandbox-venv                     the agent's python (read-only)
  /tmp                                  private, size-capped tmpfs

and nothing else of the host: no network, no private answers, checkpoints or run dirs. There is no
unsandboxed backend.
"""

from __future__ import annotations

import itertools
import os
import threading
from typing import Protocol

from mle_jax.executor.result import ExecResult, Limits
from mle_jax.tasks.prompts import data_mount
from mle_jax.tasks.task import Task

WORK_MOUNT = "/workdir/{task_id}/work"


class Sandbox(Protocol):
    name: str  # its executor.backend (executor/registry.py)

    def run(self, code: str, task: Task, limits: Limits) -> ExecResult: ...

    def close(self) -> None:
        """Remove the temporary roots it made for work dirs and results (idempotent; roots a caller named stay)."""
        ...


def work_mount(task_id: str) -> str:
    """The program's cwd inside the sandbox (its work dir, read-write)."""
    return WORK_MOUNT.format(task_id=task_id)


def data_mount_point(task_id: str) -> str:
    """Where the task's public dir is mounted read-only: the path the prompt gives the agent (`data_mount`)."""
    return data_mount(task_id).rstrip("/")


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
