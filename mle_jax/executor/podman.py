"""A private Podman service speaking the Docker API on a unique unix socket (tests, bench, CLI).

On these machines Podman needs `--runtime runc`; containers then also need nofile/nproc ulimits below
the host's hard limits, which DockerSandbox always sets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path


class PodmanService:
    """`with PodmanService() as url:` -> "unix:///tmp/.../podman.sock", stopped on exit."""

    def __init__(self, start_timeout_s: float = 60.0):
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.dir: Path | None = None

    @property
    def url(self) -> str:
        assert self.dir is not None
        return f"unix://{self.dir / 'podman.sock'}"

    def start(self) -> str:
        podman = shutil.which("podman")
        if podman is None or shutil.which("runc") is None:
            raise FileNotFoundError("podman/runc not found: apt-get install podman runc (or `make apt`)")
        self.dir = Path(tempfile.mkdtemp(prefix=f"mle_jax_podman_{uuid.uuid4().hex[:6]}_"))
        sock = self.dir / "podman.sock"
        log = open(self.dir / "service.log", "wb")
        self.proc = subprocess.Popen(
            [podman, "--runtime", "runc", "system", "service", "--time=0", f"unix://{sock}"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.dir,  # conmon leaves files in its working directory (an empty "oom" after an OOM kill)
        )
        log.close()
        end = time.monotonic() + self.start_timeout_s
        while not sock.exists():
            if self.proc.poll() is not None or time.monotonic() > end:
                text = (self.dir / "service.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise RuntimeError(f"podman system service did not start: {text}")
            time.sleep(0.05)
        return self.url

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
