"""Bounded capture of a program's output: keep the head and the tail, count (and drop) the middle.

A program may print without end; capture never holds more than `max_bytes` in memory and never writes
what it drops anywhere.
"""

from __future__ import annotations

import threading
from typing import IO, BinaryIO

_READ_CHUNK = 1 << 16


class BoundedCapture:
    """Accumulates a byte stream keeping its first max_bytes//2 and last max_bytes - max_bytes//2 bytes."""

    def __init__(self, max_bytes: int):
        if max_bytes < 2:
            raise ValueError(f"max_bytes must be >= 2, got {max_bytes}")
        self.head_cap = max_bytes // 2
        self.tail_cap = max_bytes - self.head_cap
        self._head = bytearray()
        self._tail = bytearray()
        self.total_bytes = 0

    def feed(self, chunk: bytes) -> None:
        self.total_bytes += len(chunk)
        room = self.head_cap - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > self.tail_cap:
                del self._tail[: len(self._tail) - self.tail_cap]

    @property
    def truncated(self) -> bool:
        return self.total_bytes > len(self._head) + len(self._tail)

    def text(self) -> str:
        """Head and tail joined by a marker saying how many bytes were elided."""
        head = bytes(self._head).decode("utf-8", errors="replace")
        tail = bytes(self._tail).decode("utf-8", errors="replace")
        if not self.truncated:
            return head + tail
        dropped = self.total_bytes - len(self._head) - len(self._tail)
        return f"{head}\n[... {dropped} bytes elided ...]\n{tail}"

    def drain(self, stream: BinaryIO | IO[bytes]) -> None:
        """Read a stream to EOF (blocking); meant for a reader thread on a pipe."""
        while True:
            chunk = stream.read1(_READ_CHUNK) if hasattr(stream, "read1") else stream.read(_READ_CHUNK)
            if not chunk:
                return
            self.feed(chunk)


def drain_in_thread(stream: BinaryIO, capture: BoundedCapture, name: str) -> threading.Thread:
    """Start a daemon thread that drains `stream` into `capture` and closes it at EOF."""

    def _run() -> None:
        try:
            capture.drain(stream)
        finally:
            stream.close()

    t = threading.Thread(target=_run, name=name, daemon=True)
    t.start()
    return t
