"""The vLLM servers behind one `VLLMSampler`: a pool that routes each request to the least-loaded live server, takes
a server that stops answering out of the rotation and back in once it answers again, and loads every weight sync
into every server, tracking the version each one holds.

Routing: a request of n samples (one prompt's group: vLLM's prefix cache serves its n samples from one prefill)
goes whole to the live server with the fewest samples outstanding (ties: the one that was sent fewest so far).

A server dies (`server_died`: no connection, a connection cut, a 5xx): the requests that met it are re-sent to the
others at once (a dead server costs its in-flight requests' time, never a sample), and a watcher thread polls its
`/health`; once it answers (restarted at the same URL, serving its start-up model) it is given the weights last
synced, tagged with their version, and taken back. With no server left, a request waits up to `wait_s` for one to
come back (the one-server case: wait for it, as a run must); `wait_s <= 0` raises at once instead.

Weights: `load(folder, version)` has every live server load the folder (in parallel: the seconds to the last one
are the slowest server's) and keeps (folder, version) as the pool's target, so a server that comes back later gets
them too. A weight load and a server's return never interleave (one lock), so a returning server cannot come back
with weights older than the last sync.

This module imports no jax.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from mle_jax.sampling.vllm_server import VLLMServer, VLLMServerError

T = TypeVar("T")
Reload = Callable[[VLLMServer, Any, int], Any]  # (server, source, version): the server loads the weights at source


def server_died(error: BaseException) -> bool:
    """Whether `error`, raised by a request to a vLLM server, means the server is gone (killed, restarting, its
    engine dead): no connection, a connection cut mid-answer, or a 5xx answer. A 4xx (a bad request) is not."""
    import requests  # optional dependency (the vllm extra)

    if isinstance(error, (requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
        return True
    return isinstance(error, VLLMServerError) and " -> 5" in str(error)


@dataclass(eq=False)
class Replica:
    """One server of the pool, as the pool sees it.

    version: the policy version of the weights it holds (the pool's start version until its first load).
    alive: in the rotation. outstanding: samples sent to it and not answered yet. sent: samples ever sent (the
    routing's tie-break). comebacks: times it came back from the dead; a failure met before the last comeback is
    stale (the server was already taken out and is back) and takes nothing out.
    """

    server: VLLMServer
    version: int
    alive: bool = True
    outstanding: int = 0
    sent: int = 0
    comebacks: int = 0

    @property
    def url(self) -> str:
        return self.server.url


@dataclass(frozen=True)
class Lease:
    """Which server a request went to, and the version its weights had when it was sent."""

    replica: Replica
    version: int
    comebacks: int


class ServerPool:
    """The vLLM servers one sampler spreads its requests over (one or more; see the module docstring).

    servers: the servers, in order (the first is `VLLMSampler.server`). version: what each holds at start.
    wait_s: how long a request (or a sync) waits for some server to come back when none is left; <= 0: raise at once.
    poll_s: how often a dead server's /health is polled.
    """

    def __init__(self, servers: Sequence[VLLMServer], version: int = 0, wait_s: float = 900.0, poll_s: float = 1.0):
        if not servers:
            raise ValueError("a server pool needs at least one vLLM server")
        urls = [s.url for s in servers]
        if len(set(urls)) != len(urls):
            raise ValueError(f"a vLLM server is listed twice: {urls}")
        self.replicas = [Replica(s, version) for s in servers]
        self.wait_s = wait_s
        self.poll_s = poll_s
        # the weights every server should hold: (source, version, reload) of the last `load` (None: its own model)
        self.target: tuple[Any, int, Reload] | None = None
        self.recoveries: list[dict[str, Any]] = []  # {"server", "outage_s", "weights"} per comeback
        self._cond = threading.Condition()  # guards the replicas' routing fields
        self._weights = threading.Lock()  # a load and a comeback's reload never interleave
        self._closed = threading.Event()
        self._last_error: BaseException | None = None

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def versions(self) -> dict[str, int | None]:
        """{url: the version its weights have} of the live servers; a dead one's is None."""
        with self._cond:
            return {r.url: r.version if r.alive else None for r in self.replicas}

    def call(self, request: Callable[[VLLMServer], T], samples: int = 1) -> tuple[T, Lease]:
        """request(server) on the least-loaded live server; where that server dies, taken out and request() sent to
        another (or, none left, to the first to come back). Other errors (a 4xx: a bad request) raise at once.
        samples: the request's share of the servers' work (its n). Returns (what request gave, where it ran)."""
        while True:
            lease = self._acquire(samples)
            try:
                return request(lease.replica.server), lease
            except Exception as e:  # noqa: BLE001 (sorted below: only a dead server's errors are re-sent)
                if not server_died(e):
                    raise
                self._lost(lease, e)
            finally:
                with self._cond:
                    lease.replica.outstanding -= samples

    def load(self, source: Any, version: int, reload: Reload) -> None:
        """Every live server loads the weights at `source` (reload(server, source, version): an HF folder, a shared
        memory manifest, ...), in parallel; the ones that die meanwhile are taken out and get them when they come
        back. Where no server took them, waits (wait_s) for one to come back and load them."""
        with self._weights:
            self.target = (source, version, reload)
            with self._cond:
                live = [(r, r.comebacks) for r in self.replicas if r.alive]

            def one(entry: tuple[Replica, int]) -> bool:
                replica, comebacks = entry
                try:
                    reload(replica.server, source, version)
                except Exception as e:  # noqa: BLE001 (only a dead server's errors are absorbed)
                    if not server_died(e):
                        raise
                    self._lost(Lease(replica, replica.version, comebacks), e)
                    return False
                with self._cond:
                    replica.version = version
                return True

            if len(live) == 1:
                took = [one(live[0])]
            else:
                with ThreadPoolExecutor(max_workers=max(1, len(live))) as pool:
                    took = list(pool.map(one, live))
        if not any(took):  # no server holds the weights: wait for the first to come back (its watcher loads them)
            self._acquire(0)

    def close(self) -> None:
        """Stops the watchers of dead servers."""
        self._closed.set()

    # ---- routing, taking out, bringing back ------------------------------------------------

    def _acquire(self, samples: int) -> Lease:
        """The least-loaded live server, its outstanding work counted up by `samples`; waits (wait_s) when none."""
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while not any(r.alive for r in self.replicas):
                left = deadline - time.monotonic()
                if self.wait_s <= 0 or left <= 0:
                    raise self._none_left()
                self._cond.wait(min(left, 5.0))
            replica = min((r for r in self.replicas if r.alive), key=lambda r: (r.outstanding, r.sent))
            replica.outstanding += samples
            replica.sent += samples
            return Lease(replica, replica.version, replica.comebacks)

    def _none_left(self) -> VLLMServerError:
        error = self._last_error
        which = f"the vLLM server at {self.urls[0]}" if len(self.replicas) == 1 else f"every vLLM server ({self.urls})"
        if self.wait_s <= 0:
            return VLLMServerError(f"{which} died: {error}")
        return VLLMServerError(
            f"{which} died and did not come back within {self.wait_s:.0f} s (restart it, e.g. launch/vllm_server.sh, "
            f"at the same URL): {error}"
        )

    def _lost(self, lease: Lease, error: BaseException) -> None:
        """Takes the lease's server out (unless it was already, or has come back since) and watches for its return."""
        replica = lease.replica
        with self._cond:
            self._last_error = error
            if not replica.alive or replica.comebacks != lease.comebacks:
                return
            replica.alive = False
            left = sum(r.alive for r in self.replicas)
        print(
            f"vLLM server at {replica.url} died ({type(error).__name__}); {left} of {len(self.replicas)} left, "
            "watching for its return",
            flush=True,
        )
        threading.Thread(target=self._watch, args=(replica,), name=f"vllm-watch-{replica.url}", daemon=True).start()

    def _watch(self, replica: Replica) -> None:
        """Polls a dead server's /health until it answers, gives it the pool's weights and takes it back."""
        t0 = time.monotonic()
        while not self._closed.wait(self.poll_s):
            if not replica.server.healthy():
                continue
            with self._weights:
                target = self.target
                try:
                    if target is not None:  # a restarted server serves its start-up model: the policy's weights again
                        target[2](replica.server, target[0], target[1])
                except Exception as e:  # noqa: BLE001 (it died again, or is not ready: keep watching)
                    print(f"vLLM server at {replica.url} answers but did not take the weights: {e}", flush=True)
                    continue
                with self._cond:
                    if target is not None:
                        replica.version = target[1]
                    replica.alive = True
                    replica.comebacks += 1
                    outage_s = round(time.monotonic() - t0, 1)
                    self.recoveries.append({"server": replica.url, "outage_s": outage_s,
                                            "weights": None if target is None else str(target[0])})  # fmt: skip
                    self._cond.notify_all()
            print(f"vLLM server at {replica.url} back after {outage_s:.0f} s (weights: {target})", flush=True)
            return
