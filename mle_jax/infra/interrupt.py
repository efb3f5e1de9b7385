"""Ctrl-C as a request to stop a run at its next safe point, never as an exception thrown into JAX or XLA.

Python raises KeyboardInterrupt wherever the main thread is when SIGINT arrives; inside the learner's XLA compile
that ended in "Fatal Python error: Segmentation fault". Under `stop_on_sigint()` the first Ctrl-C only sets a flag:
the run's loops look at it between their steps (`raise_if_requested`) and stop there by raising `Interrupted`, so
that what they leave is whole (a finished step checkpointed, the sandboxes and samplers closed on the way out). A
second Ctrl-C exits at once (status 130), even while the main thread is stuck in a compile.

Both presses are seen by a watcher thread reading the signal wakeup fd: the C-level handler writes to it as soon as
the signal arrives, whereas a Python handler would run only once the main thread is back in Python code.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_STATUS = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C

_requested = threading.Event()
_watching = threading.Event()


class Interrupted(Exception):
    """The run stopped at a safe point after Ctrl-C; the message says where (one line)."""


def requested() -> bool:
    """Whether Ctrl-C asked the run to stop."""
    return _requested.is_set()


def watching() -> bool:
    """Whether Ctrl-C is a stop request here (inside `stop_on_sigint`), not a KeyboardInterrupt."""
    return _watching.is_set()


def raise_if_requested(where: str) -> None:
    """Raises Interrupted(where) when Ctrl-C asked the run to stop. Call it where stopping leaves nothing half done."""
    if _requested.is_set():
        raise Interrupted(where)


def _watch(read_fd: int, first: str, second: str) -> None:
    presses = 0
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:  # the write end closed: the context has ended
            return
        for signum in data:
            if signum != signal.SIGINT:
                continue
            presses += 1
            if presses == 1:
                _requested.set()
                os.write(2, (first + "\n").encode())
            else:
                os.write(2, (second + "\n").encode())
                os._exit(EXIT_STATUS)


@contextmanager
def stop_on_sigint(first: str, second: str) -> Iterator[None]:
    """Within the block, Ctrl-C sets the stop flag and prints `first` (one line, stderr); a second one prints `second`
    and exits the process at once with status 130 (sandboxes die with it: bwrap runs them --die-with-parent).

    Only from the main thread (where signal handlers are set); elsewhere the block runs with Python's default."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # the wakeup fd must not block the signal handler
    previous_handler = signal.signal(signal.SIGINT, lambda signum, frame: None)  # the watcher acts, not Python
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watcher = threading.Thread(target=_watch, args=(read_fd, first, second), name="sigint-watch", daemon=True)
    watcher.start()
    _watching.set()
    try:
        yield
    finally:
        _watching.clear()
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous_handler)
        os.close(write_fd)
        watcher.join(timeout=5)
        os.close(read_fd)
        _requested.clear()
