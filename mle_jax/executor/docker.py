"""The Docker sandbox: one container per run through the docker SDK (Docker, or Podman's compatible socket).

The container: image from sandboxes/Dockerfile (built and cached by `image.ensure_image`), no network,
read-only root, size-capped tmpfs /tmp, memory (no swap) / pids / cpu limits, nofile/nproc/fsize/core
ulimits, all capabilities dropped, no-new-privileges, an unprivileged user; the task's public data
read-only at the data mount, a fresh work dir read-write as the cwd, the host's sandbox venv read-only at
/opt/sandbox-venv. Output is streamed over an attach socket into bounded buffers (the log driver is
"none", so nothing is written to disk). Δt is the container's StartedAt -> FinishedAt.

OOM: Docker reports State.OOMKilled; Podman with runc on cgroup v1 (this host) does not, so a SIGKILL we
did not send is counted as OOM too (inside the container only the kernel's OOM killer or the program
itself can send one).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from datetime import datetime
from pathlib import Path

from mle_jax.executor.backend import data_mount_point, sandbox_env, work_mount
from mle_jax.executor.capture import BoundedCapture
from mle_jax.executor.image import ensure_image
from mle_jax.executor.result import ExecResult, Limits, signal_exit_code
from mle_jax.executor.runtime import VENV_MOUNT, check_venv, venv_of
from mle_jax.executor.workspace import (
    CODE_NAME,
    MAX_WORK_ENTRIES,
    DiskWatchdog,
    create_workspace,
    finish_run,
    remove_tree,
)
from mle_jax.tasks.task import Task

log = logging.getLogger(__name__)

SANDBOX_UID = 65534
_NPROC_ULIMIT = 8192
LABEL = "org.mle_jax.sandbox"


def _import_docker():
    try:
        import docker  # optional dependency
    except ImportError as e:
        raise ImportError("the docker backend needs the docker SDK: .venv/bin/pip install docker") from e
    return docker


_TIME_RE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?$")


def _parse_time(s: str) -> float:
    """Docker's RFC 3339 time with nanoseconds -> epoch seconds."""
    m = _TIME_RE.match(s)
    if m is None:
        raise ValueError(f"not an RFC 3339 time: {s!r}")
    tz = m.group(3) or "Z"
    t = datetime.fromisoformat(m.group(1) + ("+00:00" if tz == "Z" else tz))
    return t.timestamp() + (float("0." + m.group(2)) if m.group(2) else 0.0)


def _is_read_timeout(error: BaseException) -> bool:
    """Whether a docker SDK call failed because its `timeout` passed: requests' ReadTimeout over TCP, a
    ConnectionError wrapping urllib3's ReadTimeoutError over a unix socket. Any other error (the API
    answering an error, the connection reset or refused) is the executor's failure."""
    import requests  # optional dependency (comes with the docker SDK)
    from urllib3.exceptions import ReadTimeoutError  # optional dependency (comes with the docker SDK)

    if isinstance(error, requests.exceptions.ReadTimeout):
        return True
    return isinstance(error, requests.exceptions.ConnectionError) and any(
        isinstance(a, ReadTimeoutError) for a in error.args
    )


class DockerSandbox:
    """Runs programs in containers. Thread-safe (one container per run).

    image: tag of the executor image; built from sandboxes/Dockerfile when missing or stale (build=True).
    base_url: the Docker API socket (default: DOCKER_HOST / the local Docker).
    python: the host sandbox venv's interpreter to mount (default .sandbox-venv/bin/python).
    """

    backend = "docker"

    def __init__(
        self,
        image: str = "mle-jax-sandbox:latest",
        base_url: str | None = None,
        python: str | Path | None = None,
        work_root: str | Path | None = None,
        out_root: str | Path | None = None,
        max_work_mb: int = 8192,
        max_work_files: int = MAX_WORK_ENTRIES,
        keep_work: bool = False,
        build: bool = True,
        base_image: str | None = None,
    ):
        docker = _import_docker()
        self._errors = docker.errors
        self.client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
        self.image = image
        if build:
            ensure_image(self.client, image, base=base_image)
        self.venv = venv_of(python)
        check_venv(self.venv)
        base = Path(os.environ.get("TMPDIR", "/tmp")) / f"mle_jax_docker_{os.getpid()}"
        self.work_root = Path(work_root) if work_root else base / "work"
        self.out_root = Path(out_root) if out_root else base / "results"
        self.max_work_mb = max_work_mb
        self.max_work_files = max_work_files
        self.keep_work = keep_work

    def _create(self, task: Task, limits: Limits, work_dir: Path):
        from docker.types import LogConfig, Ulimit  # optional dependency

        mem = limits.memory_mb << 20
        cpu = int(limits.timeout_s * max(1, limits.cpus)) + 2
        fsize = limits.max_file_mb << 20
        tmp_mb = max(64, min(limits.memory_mb // 2, self.max_work_mb))
        # `timeout` is a backstop for a container whose executor died (we kill it ourselves normally).
        backstop = str(int(limits.timeout_s) + 30)
        return self.client.containers.create(
            self.image,
            ["timeout", "-s", "KILL", backstop, f"{VENV_MOUNT}/bin/python", CODE_NAME],
            user=f"{SANDBOX_UID}:{SANDBOX_UID}",
            working_dir=work_mount(task.id),
            environment=sandbox_env(task.id, limits, VENV_MOUNT),
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"size={tmp_mb}m,mode=1777"},
            shm_size=f"{max(64, limits.memory_mb // 4)}m",
            mem_limit=mem,
            memswap_limit=mem,
            pids_limit=limits.max_procs,
            nano_cpus=int(limits.cpus * 1e9),
            ulimits=[
                Ulimit(name="nofile", soft=4096, hard=4096),
                # every container runs as the same uid and NPROC counts per uid across containers, so
                # the per-run bound is pids_limit; this only has to stay under the host's hard limit
                Ulimit(name="nproc", soft=_NPROC_ULIMIT, hard=_NPROC_ULIMIT),
                Ulimit(name="fsize", soft=fsize, hard=fsize),
                Ulimit(name="cpu", soft=cpu, hard=cpu + 5),
                Ulimit(name="core", soft=0, hard=0),
            ],
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            volumes={
                str(Path(task.public_dir).resolve()): {"bind": data_mount_point(task.id), "mode": "ro"},
                str(work_dir): {"bind": work_mount(task.id), "mode": "rw"},
                str(self.venv.resolve()): {"bind": VENV_MOUNT, "mode": "ro"},
            },
            log_config=LogConfig(type="none"),
            labels={LABEL: "1", f"{LABEL}.deadline": str(int(time.time() + limits.timeout_s + 60))},
            hostname="sandbox",
            detach=True,
        )

    def run(self, code: str, task: Task, limits: Limits) -> ExecResult:
        if not Path(task.public_dir).is_dir():
            raise FileNotFoundError(f"task {task.id}: public dir {task.public_dir} does not exist")
        ws = create_workspace(self.work_root, self.out_root, code, SANDBOX_UID, SANDBOX_UID)
        container = None
        try:
            container = self._create(task, limits, ws.work_dir)
            return self._run(container, ws, limits)
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except Exception as e:  # an API failure here must not hide the run's own error or result
                    log.warning("could not remove container %s: %r", container.id[:12], e)
            if not self.keep_work:
                remove_tree(ws.work_dir)

    def _run(self, container, ws, limits: Limits) -> ExecResult:
        out, err = BoundedCapture(limits.max_output_bytes), BoundedCapture(limits.max_output_bytes)
        stream = container.attach(stdout=True, stderr=True, stream=True, demux=True, logs=False)

        def drain() -> None:
            try:
                for o, e in stream:
                    if o:
                        out.feed(o)
                    if e:
                        err.feed(e)
            except Exception as ex:  # the socket closes under us when the container is killed
                log.debug("attach stream ended: %s", ex)

        reader = threading.Thread(target=drain, name="docker-attach", daemon=True)
        reader.start()
        killed_reason = ""
        lock = threading.Lock()

        def kill(reason: str) -> None:
            nonlocal killed_reason
            with lock:
                killed_reason = killed_reason or reason
            try:
                container.kill()
            except self._errors.APIError:
                pass  # already gone

        t_start = time.monotonic()
        container.start()
        timed_out = False
        with DiskWatchdog(
            ws.work_dir, self.max_work_mb << 20, lambda: kill("disk"), max_entries=self.max_work_files
        ) as watchdog:
            try:
                container.wait(timeout=limits.timeout_s)
            except Exception as e:
                if not _is_read_timeout(e):
                    raise  # the Docker API failed, not the program: the fleet retries it on a fresh executor
                timed_out = True  # the wall-clock limit passed
                kill("timeout")
                container.wait(timeout=60)
        t_end = time.monotonic()
        reader.join(timeout=10)
        container.reload()
        state = container.attrs["State"]
        exit_code = signal_exit_code(state.get("ExitCode"))
        try:
            duration = _parse_time(state["FinishedAt"]) - _parse_time(state["StartedAt"])
        except (KeyError, ValueError):
            duration = t_end - t_start
        if not 0 <= duration <= t_end - t_start + 1:
            duration = t_end - t_start
        oom = bool(state.get("OOMKilled")) or (exit_code == -9 and not killed_reason)
        details = {
            "container": container.id[:12],
            "wall_s": t_end - t_start,
        }
        return finish_run(
            ws, self.backend, exit_code, duration, timed_out, oom, killed_reason, out, err, watchdog, limits, details
        )
