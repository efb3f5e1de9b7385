"""Programs in a sandbox telling the test that they have started: a FIFO in the task's public dir.

The public dir is mounted read-only, but writing to a FIFO touches no filesystem, so a program can open it
for writing (non-blocking: a run that starts when nobody listens any more is not held up). The test keeps
both ends open for as long as it listens, so it blocks on data, never on end-of-file.

  with StartSignal(task) as started:
      futures = [fleet.submit(started.prefix() + code, task, limits) for _ in range(2)]
      started.wait(2)   # both programs are running
"""

from __future__ import annotations

import os
import select
import time
import uuid

from mle_jax.tasks.prompts import data_mount
from mle_jax.tasks.task import Task


class StartSignal:
    def __init__(self, task: Task):
        self.task = task
        self.name = f"started_{uuid.uuid4().hex[:8]}.fifo"
        self.host_path = task.public_dir / self.name
        self._read = self._write = -1
        self._seen = 0

    def prefix(self) -> str:
        """Python lines that say "started" through the FIFO; put them first in the program."""
        path = data_mount(self.task.id) + self.name
        return (
            "import os as _os\n"
            f"_fd = _os.open({path!r}, _os.O_WRONLY | _os.O_NONBLOCK)\n"
            '_os.write(_fd, b"started\\n")\n'
            "_os.close(_fd)\n"
        )

    def wait(self, n: int, timeout_s: float = 120.0) -> None:
        """Block until n programs in all have said "started"."""
        deadline = time.monotonic() + timeout_s
        while self._seen < n:
            ready, _, _ = select.select([self._read], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError(f"{self._seen} of {n} programs started within {timeout_s} s")
            self._seen += os.read(self._read, 4096).count(b"started")

    def __enter__(self) -> StartSignal:
        os.mkfifo(self.host_path)
        os.chmod(self.host_path, 0o666)  # the sandbox's unprivileged uid writes to it
        self._read = os.open(self.host_path, os.O_RDONLY | os.O_NONBLOCK)
        self._write = os.open(self.host_path, os.O_WRONLY | os.O_NONBLOCK)  # no EOF while we listen
        return self

    def __exit__(self, *exc) -> None:
        for fd in (self._read, self._write):
            os.close(fd)
        self.host_path.unlink()
