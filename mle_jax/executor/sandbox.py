"""`make_sandbox(settings)`: the sandbox of the configured backend (see backend.py for what they share).

bwrap   bubblewrap on this host (bwrap.py)
docker  a container per run through the docker SDK; Podman's compatible socket works (docker.py)
"""

from __future__ import annotations

from pathlib import Path

from mle_jax.executor.backend import Sandbox
from mle_jax.executor.bwrap import BwrapSandbox
from mle_jax.executor.docker import DockerSandbox
from mle_jax.executor.settings import ExecutorSettings

BACKENDS: dict[str, type[BwrapSandbox] | type[DockerSandbox]] = {"bwrap": BwrapSandbox, "docker": DockerSandbox}


def make_sandbox(
    settings: ExecutorSettings,
    work_root: str | Path | None = None,
    out_root: str | Path | None = None,
    keep_work: bool = False,
) -> Sandbox:
    """The sandbox of `settings.backend` with `settings.sandbox_options()`.

    work_root / out_root: where this host keeps per-run work dirs (deleted after each run unless keep_work)
    and results (stdout, stderr, the submission's copy); default: under $TMPDIR, per process.
    """
    cls = BACKENDS[settings.backend]
    return cls(**settings.sandbox_options(), work_root=work_root, out_root=out_root, keep_work=keep_work)
