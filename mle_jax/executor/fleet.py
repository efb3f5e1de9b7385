"""Executor fleets: N concurrent slots behind a bounded queue; `submit` returns a Future[ExecResult].

Futures complete in completion order (use `concurrent.futures.wait(..., FIRST_COMPLETED)` or
`as_completed`). `Fleet` is the interface callers use; `make_fleet(settings)` builds a SlotFleet with one
of two kinds of slot:

  local  a thread per slot calling a sandbox in this process
  ray    a thread per slot driving one SandboxActor on a Ray cluster (local `ray.init`, or
         `executor.ray_address`); the actor returns the submission's bytes, so results are usable on the
         driver even when the actor ran on another machine (which must see the task's public dir at the
         same path and have the repo and sandbox venv there)

An executor failure (the sandbox raising, an actor or its node dying, or an actor that has not answered
STALL_GRACE_S after the program's own timeout: stalled) retries the sample once on a fresh executor, then returns
Status.INFRA: not the agent's -10, and never trained on.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import queue
import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Protocol, runtime_checkable

from mle_jax.executor.backend import Sandbox
from mle_jax.executor.result import ExecResult, Limits, Status
from mle_jax.executor.runtime import REPO_ROOT
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.executor.workspace import remove_tree
from mle_jax.tasks.task import Task

log = logging.getLogger(__name__)

ATTEMPTS = 2  # the first try and one retry
# a Ray executor that has not answered this long after its program's timeout is stalled (stopped, its node frozen or
# cut off): it is killed and the run retried on a fresh one. The sandbox kills a program at its timeout and answers
# within seconds, so a long grace only delays a stalled slot.
STALL_GRACE_S = 60.0
ACTOR_START_S = 600.0  # a fresh Ray executor is waited for this long to start (its deadline counts from then)


class ExecutorStalled(RuntimeError):
    """A Ray executor did not answer within its program's timeout plus STALL_GRACE_S."""


@runtime_checkable
class Fleet(Protocol):
    """What the RL loop and evaluation use of a fleet (both SlotFleet and RayFleet are one)."""

    n_slots: int

    def submit(self, code: str, task: Task, limits: Limits) -> Future[ExecResult]: ...

    def close(self) -> None: ...


class Slot(Protocol):
    def run(self, code: str, task: Task, limits: Limits) -> ExecResult: ...

    def restart(self) -> None: ...

    def close(self) -> None: ...


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def infra_result(error: BaseException, attempts: int) -> ExecResult:
    return ExecResult(
        status=Status.INFRA,
        exit_code=None,
        duration_s=0.0,
        stdout_tail="",
        stderr_tail=f"executor failed {attempts} times; last error: {_describe(error)}",
        submission_path=None,
        extra={"attempts": attempts, "infra_error": _describe(error)},
    )


class SlotFleet:
    """N slots (threads) taking (code, task, limits) from a bounded queue. submit() blocks when it is full."""

    def __init__(
        self,
        make_slot: Callable[[int], Slot],
        slots: int,
        queue_size: int = 1024,
        name: str = "fleet",
        on_close: Callable[[], None] | None = None,
    ):
        """on_close: run once the slots have stopped (what the slots share: a sandbox and its temporary roots)."""
        if slots < 1:
            raise ValueError(f"a fleet needs at least one slot, got {slots}")
        self.n_slots = slots
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, queue_size))
        self._slots = [make_slot(i) for i in range(slots)]
        self._on_close = on_close
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, args=(slot,), name=f"{name}-slot{i}", daemon=True)
            for i, slot in enumerate(self._slots)
        ]
        for t in self._threads:
            t.start()

    def submit(self, code: str, task: Task, limits: Limits, timeout: float | None = None) -> Future[ExecResult]:
        """Queue one run; the Future's result is its ExecResult. Raises queue.Full after `timeout`."""
        if self._closed:
            raise RuntimeError("fleet is closed")
        fut: Future[ExecResult] = Future()
        self._queue.put((fut, code, task, limits), timeout=timeout)
        return fut

    def _work(self, slot: Slot) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fut, code, task, limits = item
            if not fut.set_running_or_notify_cancel():
                continue
            fut.set_result(self._run_with_retry(slot, code, task, limits))

    @staticmethod
    def _run_with_retry(slot: Slot, code: str, task: Task, limits: Limits) -> ExecResult:
        error: BaseException | None = None
        for attempt in range(1, ATTEMPTS + 1):
            try:
                result = slot.run(code, task, limits)
                result.extra["attempts"] = attempt
                if error is not None:
                    result.extra["retried_after"] = _describe(error)
                return result
            except Exception as e:  # an executor failure, not the program's: retry on a fresh executor
                error = e
                log.warning("executor failed (attempt %d/%d): %r", attempt, ATTEMPTS, e)
                try:
                    slot.restart()
                except Exception as e2:
                    log.warning("restarting the executor failed: %r", e2)
        assert error is not None
        return infra_result(error, ATTEMPTS)

    def close(self, cancel_pending: bool = False) -> None:
        """Finish (or cancel) what is queued, stop the slots."""
        if self._closed:
            return
        self._closed = True
        if cancel_pending:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
        for slot in self._slots:
            slot.close()
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> SlotFleet:
        return self

    def __exit__(self, *exc) -> None:
        self.close(cancel_pending=exc[0] is not None)


# -- local pool ----------------------------------------------------------------------------------
class LocalSlot:
    """Runs in this process with a shared sandbox (sandboxes are thread-safe)."""

    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox

    def run(self, code: str, task: Task, limits: Limits) -> ExecResult:
        return self.sandbox.run(code, task, limits)

    def restart(self) -> None:
        pass  # stateless: the next run starts a fresh sandbox anyway

    def close(self) -> None:
        pass


def slots_for(settings: ExecutorSettings) -> int:
    """How many programs a fleet built from `settings` runs at once: `slots`, or this machine's CPU count."""
    return settings.slots or os.cpu_count() or 1


def local_fleet(
    settings: ExecutorSettings, work_root: str | Path | None = None, out_root: str | Path | None = None
) -> SlotFleet:
    """`settings.slots` threads sharing one sandbox in this process (work_root, out_root: see make_sandbox); the
    sandbox's temporary roots go when the fleet closes, with the results of runs nobody consumed."""
    sandbox = make_sandbox(settings, work_root=work_root, out_root=out_root)
    return SlotFleet(
        lambda i: LocalSlot(sandbox), slots_for(settings), settings.queue_size, name="local", on_close=sandbox.close
    )


# -- Ray -----------------------------------------------------------------------------------------
# The node address of a Ray cluster on this machine alone. Ray turns 127.0.0.1, localhost and ::1 given as a node's
# address into this machine's interface address (ray._private.services.resolve_ip_for_localhost), and its GCS,
# raylets, object managers and workers then listen and dial there; any other address in 127.0.0.0/8 it keeps as
# given, and Linux routes all of them over loopback. ray_executors.sh's NODE_IP=127.0.0.2 does the same for a
# cluster started by hand.
LOOPBACK_NODE_IP = "127.0.0.2"


def address_host(address: str) -> str:
    """The host of "host:port", "[v6]:port" or a bare host."""
    if address.startswith("["):
        return address[1:].split("]", 1)[0]
    return address.rsplit(":", 1)[0] if address.count(":") == 1 else address


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _import_ray():
    try:
        import ray  # optional dependency
    except ImportError as e:
        raise ImportError("the ray fleet needs ray: .venv/bin/pip install 'ray' (extra [ray])") from e
    return ray


class SandboxActorImpl:
    """The body of the Ray actor: a sandbox on the actor's machine."""

    def __init__(self, settings: ExecutorSettings, work_root: str | None):
        self.sandbox = make_sandbox(settings, work_root=work_root)

    def pid(self) -> int:
        return os.getpid()

    def node_ip(self) -> str:
        """The address of the Ray node this actor runs on, as Ray sees it."""
        import ray

        return ray.util.get_node_ip_address()

    def run(self, code: str, task: Task, limits: Limits) -> tuple[ExecResult, bytes | None]:
        """The result and the submission's bytes; the results dir here is removed (the driver keeps them)."""
        result = self.sandbox.run(code, task, limits)
        data = result.submission_path.read_bytes() if result.submission_path is not None else None
        if result.extra.get("results_dir"):
            remove_tree(Path(result.extra["results_dir"]))
        return result, data

    def close(self) -> None:
        """Remove the sandbox's temporary roots on this machine (the driver's slot calls it before killing us)."""
        self.sandbox.close()


class RaySlot:
    """One slot = one actor; a dead actor is replaced by a fresh one on restart()."""

    def __init__(
        self, ray, actor_cls, settings: ExecutorSettings, work_root: str | None, out_root: Path, actor_options: dict
    ):
        self.ray, self.actor_cls = ray, actor_cls
        self.settings, self.work_root, self.out_root = settings, work_root, out_root
        self.actor_options = actor_options
        self.actor = self._new_actor()

    def _new_actor(self):
        actor = self.actor_cls.options(**self.actor_options).remote(self.settings, self.work_root)
        self._pid_ref = actor.pid.remote()  # answered before any run: calls to an actor run in order
        return actor

    def pid(self) -> int:
        return self.ray.get(self._pid_ref)

    def node_ip(self) -> str:
        return self.ray.get(self.actor.node_ip.remote())

    def run(self, code: str, task: Task, limits: Limits) -> ExecResult:
        wait_s = limits.timeout_s + STALL_GRACE_S
        try:
            self.ray.get(self._pid_ref, timeout=ACTOR_START_S)  # started (a fresh actor's start is no stall)
            result, data = self.ray.get(self.actor.run.remote(code, task, limits), timeout=wait_s)
        except self.ray.exceptions.GetTimeoutError as e:
            raise ExecutorStalled(
                f"executor actor gave no answer {wait_s:.0f} s after its run was sent (timeout {limits.timeout_s:.0f} s"
                f" + {STALL_GRACE_S:.0f} s grace): stalled"
            ) from e
        # the results on this machine, as a local sandbox would leave them
        local = self.out_root / uuid.uuid4().hex[:12]
        local.mkdir(parents=True)
        (local / "stdout.txt").write_text(result.stdout_tail)
        (local / "stderr.txt").write_text(result.stderr_tail)
        path = None
        if data is not None:
            path = local / "submission.csv"
            path.write_bytes(data)
        return replace(result, submission_path=path, extra={**result.extra, "results_dir": str(local)})

    def _kill(self) -> None:
        # ray.kill of an actor that is already dead succeeds (it is a request to the GCS), so whatever it
        # raises is worth seeing; the slot goes on either way (max_restarts=0: the old actor stays dead or
        # is reaped with the cluster)
        try:
            if not self.ray.is_initialized():
                # the cluster was shut down under the fleet: ray.kill would start a fresh default cluster (Ray's
                # auto-init, on this machine's interface address) only to fail on this handle
                raise RuntimeError("Ray is not initialized: its cluster was shut down")
            self.ray.kill(self.actor, no_restart=True)
        except Exception as e:
            log.warning("ray.kill of executor actor %s failed: %r", self.actor, e)

    def restart(self) -> None:
        self._kill()
        self.actor = self._new_actor()

    def close(self) -> None:
        # the actor's temporary roots on its machine first (best effort: the actor may be dead already)
        try:
            if self.ray.is_initialized():
                self.ray.get(self.actor.close.remote(), timeout=60)
        except Exception as e:
            log.warning("closing executor actor %s failed: %r", self.actor, e)
        self._kill()


class RayFleet(SlotFleet):
    """A fleet whose slots are SandboxActors on a Ray cluster.

    settings.ray_address: a cluster to join ("" starts a private local one, shut down on close).
    settings.ray_actor_cpus: CPUs each actor reserves on the cluster (0: settings.cpus).
    work_root: the actors' work dirs (on their machines); out_root: where results land on this machine.
    """

    def __init__(
        self,
        settings: ExecutorSettings,
        work_root: str | Path | None = None,
        out_root: str | Path | None = None,
    ):
        ray = _import_ray()
        slots = slots_for(settings)
        address = settings.ray_address
        actor_cpus = settings.ray_actor_cpus or settings.cpus
        self._owns_ray = False
        self._ray_tmp: str | None = None
        # the code must import on the workers the same way as here (this checkout first)
        env = {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(":")}
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no phoning home
            if address:
                # a cluster on this machine's loopback (ray_executors.sh with NODE_IP=127.0.0.2): the driver's node
                # is on the same loopback address, or Ray would make it the interface address
                host = address_host(address)
                if host in ("127.0.0.1", "localhost", "::1"):
                    log.warning(
                        "executor.ray_address=%s: Ray replaces %s with this machine's interface address, so the "
                        "cluster's traffic leaves loopback; for a one-machine cluster on loopback start it with "
                        "NODE_IP=%s (launch/ray_executors.sh) and join %s:PORT",
                        address, host, LOOPBACK_NODE_IP, LOOPBACK_NODE_IP,
                    )  # fmt: skip
                ray.init(
                    address=address,
                    runtime_env={"env_vars": env},
                    log_to_driver=False,
                    **({"_node_ip_address": host} if is_loopback(host) else {}),
                )
            else:
                self._ray_tmp = tempfile.mkdtemp(prefix="mle_jax_ray_")
                ray.init(
                    num_cpus=max(slots * actor_cpus, 1),
                    include_dashboard=False,
                    _temp_dir=self._ray_tmp,
                    runtime_env={"env_vars": env},
                    _node_ip_address=LOOPBACK_NODE_IP,
                    log_to_driver=False,
                )
            self._owns_ray = True
        self.ray = ray
        actor_cls = ray.remote(SandboxActorImpl)
        # results land here on the driver; a folder the fleet made goes when it closes
        self._own_out = None if out_root else Path(tempfile.mkdtemp(prefix="mle_jax_ray_results_"))
        out = Path(out_root) if out_root else self._own_out
        options = {"num_cpus": actor_cpus, "max_restarts": 0, "max_concurrency": 1, "runtime_env": {"env_vars": env}}
        actor_work = str(work_root) if work_root else None
        make_slot = lambda i: RaySlot(ray, actor_cls, settings, actor_work, out, options)
        super().__init__(make_slot, slots, settings.queue_size, name="ray")

    def executor_pids(self) -> list[int]:
        """Process ids of the slots' actors (for tests that kill one)."""
        return [slot.pid() for slot in self._slots]

    def ray_addresses(self) -> dict[str, str]:
        """Every address of this fleet's Ray cluster, by role: the GCS, this driver's node, each node's raylet,
        object manager and runtime-env agent, each slot's executor node ("host:port" or a bare host)."""
        ray = self.ray
        out = {"gcs": ray.get_runtime_context().gcs_address, "driver node": ray.util.get_node_ip_address()}
        for node in ray.nodes():
            name, host = node["NodeID"][:8], node["NodeManagerAddress"]
            out[f"raylet {name}"] = f"{host}:{node['NodeManagerPort']}"
            out[f"object manager {name}"] = f"{host}:{node['ObjectManagerPort']}"
            out[f"runtime env agent {name}"] = f"{host}:{node['RuntimeEnvAgentPort']}"
        for i, slot in enumerate(self._slots):
            out[f"executor {i}"] = slot.node_ip()
        return out

    def close(self, cancel_pending: bool = False) -> None:
        super().close(cancel_pending)
        if self._owns_ray:
            self.ray.shutdown()
            self._owns_ray = False
            if self._ray_tmp is not None:
                shutil.rmtree(self._ray_tmp, ignore_errors=True)
        if self._own_out is not None:
            remove_tree(self._own_out)
            self._own_out = None


def make_fleet(
    settings: ExecutorSettings, work_root: str | Path | None = None, out_root: str | Path | None = None
) -> Fleet:
    """The fleet `settings.fleet` of `settings.slots` sandboxes of `settings.backend` (see make_sandbox for
    work_root and out_root)."""
    if settings.fleet == "ray":
        return RayFleet(settings, work_root, out_root)
    return local_fleet(settings, work_root, out_root)
