"""The sandbox of the configured backend: `make_sandbox(settings)` builds it, `sandbox_problems(settings)` says what
it needs that is missing. The backends are registered by name in registry.py (see backend.py for what they share):

bwrap   bubblewrap on this host (bwrap.py)
docker  a container per run through the docker SDK; Podman's compatible socket works (docker.py)
"""

from __future__ import annotations

from pathlib import Path

from mle_jax.executor import registry
from mle_jax.executor.backend import Sandbox
from mle_jax.executor.settings import ExecutorSettings


def make_sandbox(
    settings: ExecutorSettings,
    work_root: str | Path | None = None,
    out_root: str | Path | None = None,
    keep_work: bool = False,
) -> Sandbox:
    """The sandbox of `settings.backend`, with the options it reads from `settings` (its class's `options`).

    work_root / out_root: where this host keeps per-run work dirs (deleted after each run unless keep_work)
    and results (stdout, stderr, the submission's copy); default: under $TMPDIR, per process.
    """
    cls = registry.resolve(settings.backend)
    return cls(**cls.options(settings), work_root=work_root, out_root=out_root, keep_work=keep_work)


def sandbox_problems(settings: ExecutorSettings) -> list[str]:
    """What the backend of `settings.backend` needs that is missing on this host, one line each (its `preflight`)."""
    return list(registry.resolve(settings.backend).preflight(settings))
