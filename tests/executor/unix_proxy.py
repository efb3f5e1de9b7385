"""A unix-socket forwarder in front of the real Podman API socket that can reset the connection of a
container's `wait` call: the Docker API failing mid-run the way a dying socket, proxy or tunnel does.

  with UnixProxy(podman_socket, tmp_path / "proxy.sock") as proxy:
      sandbox = make_sandbox(ExecutorSettings(backend="docker", docker_url=proxy.url))
      ...
      proxy.wait_seen.wait()   # a wait call is in flight
      proxy.reset_waits()      # its connection is reset; every other call goes on working
"""

from __future__ import annotations

import re
import socket
import threading
from pathlib import Path

# the request line of the Docker API's "wait for a container" call
_WAIT_REQUEST = re.compile(rb"POST /[^ ]*containers/[^/ ]+/wait")


class _Pair:
    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.client, self.upstream = client, upstream
        self._lock = threading.Lock()
        self._closed = False

    def reset(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for s in (self.client, self.upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class UnixProxy:
    """reset_every_wait: reset each wait call's connection as soon as the request has passed (the API
    failing for good); else only when reset_waits() is called."""

    def __init__(self, target: str | Path, path: Path, reset_every_wait: bool = False):
        self.target = str(target).removeprefix("unix://")
        self.path = path
        self.reset_every_wait = reset_every_wait
        self.wait_seen = threading.Event()
        self.waits_reset = 0
        self._lock = threading.Lock()
        self._waiting: list[_Pair] = []
        self._pairs: list[_Pair] = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def __enter__(self) -> UnixProxy:
        self._listener.bind(str(self.path))
        self._listener.listen(64)
        threading.Thread(target=self._accept, name="unix-proxy", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._listener.close()
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            pair.reset()

    def reset_waits(self) -> int:
        """Reset the connections of the wait calls seen so far; returns how many."""
        with self._lock:
            pairs, self._waiting = self._waiting, []
            self.waits_reset += len(pairs)
        for pair in pairs:
            pair.reset()
        return len(pairs)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            pair = _Pair(client, upstream)
            with self._lock:
                self._pairs.append(pair)
            threading.Thread(target=self._pump, args=(pair, client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, upstream, client, False), daemon=True).start()

    def _pump(self, pair: _Pair, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                if from_client and _WAIT_REQUEST.search(data):
                    with self._lock:
                        self._waiting.append(pair)
                    self.wait_seen.set()
                    if self.reset_every_wait:
                        self.reset_waits()
                        return
        except OSError:
            pass  # reset (by us or a peer)
        pair.reset()
