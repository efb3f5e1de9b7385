"""The Docker sandbox: one container per run through the docker SDK (Docker, or Podman's compatible socket).

The container: image from sandboxes/Dockerfile (built and cached by `image.ensure_image`), no network,
read-only root, size-capped tmpfs /tmp, memory (no swap) / pids / cpu limits, nofile/nproc/fsize/core
ulimits, all capabilities dropped, no-new-privileges, an unprivileged user; the task's public data
read-only at the data mount, a fresh work dir read-write as the cwd, the host's sandbox venv read-only at
/opt/sandbox-venv. Output is streamed over an attach socket into bounded buffers (the log driver is
"none", so nothing is written to disk). Δt is the container's StartedAt -> FinishedAt.

The program is the container's pid 1 (no `timeout` or init in front of it): its exit ends the pid namespace, so
the kernel kills what it left running (a child waiting to rewrite submission.csv once it is gone) before the
container stops, and the submission is copied out only then. With a wrapper as pid 1 such a child saw the program
gone and wrote in the moment before the wrapper exited (3 runs in 40). A container whose executor died is
removed past its deadline label by the next DockerSandbox on that daemon (a busy one dies of RLIMIT_CPU first).

OOM: Docker reports State.OOMKilled; Podman with runc on cgroup v1 (this host) does not, so a SIGKILL we
did not send is counted as OOM too (inside the container only the kernel's OOM killer or the program
itself can send one).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from mle_jax.executor.backend import data_mount_point, sandbox_env, work_mount
from mle_jax.executor.capture import BoundedCapture
from mle_jax.executor.image import ensure_image
from mle_jax.executor.result import ExecResult, Limits, signal_exit_code
from mle_jax.executor.runtime import VENV_MOUNT, check_venv, venv_of
from mle_jax.executor.settings import MAX_WORK_ENTRIES, ExecutorSettings
from mle_jax.executor.workspace import (
    CODE_NAME,
    DiskWatchdog,
    create_workspace,
    discard_work_dir,
    finish_run,
    remove_dead_roots,
    run_roots,
    submission_cap,
)
from mle_jax.tasks.task import Task

log = logging.getLogger(__name__)

SANDBOX_UID = 65534
_NPROC_ULIMIT = 8192
LABEL = "org.mle_jax.sandbox"
ROOTS_PREFIX = "mle_jax_docker"  # the folders of work dirs and results a sandbox makes under $TMPDIR (run_roots)


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

    name = "docker"  # its executor.backend (executor/registry.py)

    @classmethod
    def options(cls, settings: ExecutorSettings) -> dict[str, Any]:
        """The constructor options the `executor` config section decides."""
        return {
            "image": settings.image,
            "base_url": settings.docker_url or None,  # "": DOCKER_HOST / the local Docker
            "python": settings.sandbox_python or None,
            "max_work_mb": int(settings.max_work_mb),
            "max_work_files": int(settings.max_work_files),
        }

    @classmethod
    def preflight(cls, settings: ExecutorSettings) -> list[str]:
        """What the backend needs that is missing, one line each: the docker SDK and a daemon that answers."""
        try:
            import docker  # optional dependency (extra [sandbox])
        except ImportError:
            return ["executor.backend=docker needs the docker SDK: pip install -e '.[sandbox]'"]
        try:
            client = docker.DockerClient(base_url=settings.docker_url) if settings.docker_url else docker.from_env()
            client.ping()
        except Exception as err:  # any failure to reach the daemon is the same problem to the user
            where = settings.docker_url or "DOCKER_HOST / the local socket"
            return [
                f"executor.backend=docker but no Docker daemon answers at {where} ({type(err).__name__}): start "
                "one (`make sandbox-image` builds the image; BUILD.md shows Podman's socket), or pass "
                "--config.executor.backend=bwrap"
            ]
        return []

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
        self._remove_expired()
        remove_dead_roots(ROOTS_PREFIX)
        self.roots = run_roots(ROOTS_PREFIX, work_root, out_root)
        self.work_root, self.out_root = self.roots.work, self.roots.out
        self.max_work_mb = max_work_mb
        self.max_work_files = max_work_files
        self.keep_work = keep_work

    def _remove_expired(self) -> None:
        """Remove sandbox containers past their deadline: their executor died (a live one kills its own at the
        timeout, a minute before the deadline)."""
        now = time.time()
        try:
            for c in self.client.containers.list(all=True, filters={"label": LABEL}):
                deadline = c.labels.get(f"{LABEL}.deadline", "")
                if deadline.isdigit() and int(deadline) < now:
                    c.remove(force=True)
        except self._errors.APIError as e:  # best effort: another executor may be removing it too
            log.debug("removing expired sandbox containers: %r", e)

    def close(self) -> None:
        """Remove the roots this sandbox made (runs still in flight when a fleet stopped leave their results there);
        roots the caller named stay. Idempotent; call it when no run is in progress."""
        self.roots.remove_temporary()

    def _create(self, task: Task, limits: Limits, work_dir: Path):
        from docker.types import LogConfig, Ulimit  # optional dependency

        mem = limits.memory_mb << 20
        cpu = int(limits.timeout_s * max(1, limits.cpus)) + 2
        fsize = limits.max_file_mb << 20
        tmp_mb = max(64, min(limits.memory_mb // 2, self.max_work_mb))
        return self.client.containers.create(
            self.image,
            [f"{VENV_MOUNT}/bin/python", CODE_NAME],  # pid 1 (module docstring)
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
            return self._run(container, ws, limits, submission_cap(task, limits))
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except Exception as e:  # an API failure here must not hide the run's own error or result
                    log.warning("could not remove container %s: %r", container.id[:12], e)
            if not self.keep_work:
                discard_work_dir(ws)

    def _run(self, container, ws, limits: Limits, max_submission_bytes: int) -> ExecResult:
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
        # the container has stopped: its init is reaped, so every process it held is dead and the submission is final
        return finish_run(
            ws, self.name, exit_code, duration, timed_out, oom, killed_reason, out, err, watchdog, limits, details,
            max_submission_bytes=max_submission_bytes,
        )  # fmt: skip
