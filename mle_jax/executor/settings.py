"""The executor's settings: the `executor` section of configs/base.py as a typed, validated value.

settings = ExecutorSettings(**cfg.executor.to_dict())
fleet = make_fleet(settings)                  # mle_jax.executor.fleet
fleet.submit(code, task, settings.limits())
"""

from __future__ import annotations

from dataclasses import dataclass

from mle_jax.executor import registry
from mle_jax.executor.result import Limits

FLEET_KINDS = ("local", "ray")
# files, dirs and links a run's work dir may hold (an inode cap: empty files cost too); here, not in workspace.py,
# so that reading the settings loads no executor runtime
MAX_WORK_ENTRIES = 200_000


@dataclass(frozen=True)
class ExecutorSettings:
    """One field per key of the `executor` config section, with its defaults (configs/base.py says what each is)."""

    backend: str = "docker"  # a name of executor/registry.py: "bwrap" | "docker"
    fleet: str = "local"  # "local" pool | "ray"
    slots: int = 0  # 0: number of cores
    queue_size: int = 1024
    ray_address: str = ""  # "": a private local Ray cluster
    image: str = "mle-jax-sandbox:latest"  # docker backend
    sandbox_python: str = ""  # interpreter of the sandbox venv; "": .sandbox-venv/bin/python
    timeout_s: float = 3600.0
    memory_mb: int = 16384
    cpus: int = 4
    max_procs: int = 512
    max_file_mb: int = 2048
    max_output_bytes: int = 65536
    max_work_mb: int = 8192  # cap on a run's work dir (disk), on top of max_file_mb per file
    max_work_files: int = MAX_WORK_ENTRIES  # cap on the entries (files, folders, links) of a run's work dir: inodes
    docker_url: str = ""  # docker backend: the Docker API socket; "": DOCKER_HOST / local Docker
    ray_actor_cpus: float = 0.0  # CPUs each Ray executor actor reserves; 0: cpus

    def __post_init__(self) -> None:
        registry.check(self.backend)  # the name only: the backend's module is loaded where it is built
        if self.fleet not in FLEET_KINDS:
            raise ValueError(f"executor.fleet={self.fleet!r} is unknown: use one of {', '.join(FLEET_KINDS)}")
        at_least = {
            "slots": 0,
            "queue_size": 1,
            "memory_mb": 1,
            "cpus": 1,
            "max_procs": 1,
            "max_file_mb": 1,
            "max_output_bytes": 1,
            "max_work_mb": 1,
            "max_work_files": 1,
            "ray_actor_cpus": 0,
        }
        for name, low in at_least.items():
            if getattr(self, name) < low:
                raise ValueError(f"executor.{name}={getattr(self, name)!r} is too small: it must be at least {low}")
        if not self.timeout_s > 0:
            raise ValueError(f"executor.timeout_s={self.timeout_s!r} must be a positive number of seconds")

    def limits(self) -> Limits:
        """The limits every run gets."""
        return Limits(
            timeout_s=float(self.timeout_s),
            memory_mb=int(self.memory_mb),
            cpus=int(self.cpus),
            max_procs=int(self.max_procs),
            max_file_mb=int(self.max_file_mb),
            max_output_bytes=int(self.max_output_bytes),
        )
