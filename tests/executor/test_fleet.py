"""Fleets: the local pool and Ray actors on a local Ray cluster, both running real bwrap sandboxes."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import replace
from pathlib import Path

import pytest

from configs.base import get_config
from mle_jax.executor import fleet as fleet_module
from mle_jax.executor.fleet import (
    Fleet,
    LocalSlot,
    RayFleet,
    SlotFleet,
    address_host,
    is_loopback,
    local_fleet,
    make_fleet,
)
from mle_jax.executor.grading import grade_run
from mle_jax.executor.result import ExecResult, Limits, Status
from mle_jax.executor.runtime import REPO_ROOT
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.tasks.reward import compute_reward
from mle_jax.tasks.task import Task
from tests.executor import programs
from tests.executor.conftest import BWRAP
from tests.executor.start_signal import StartSignal

pytestmark = pytest.mark.integration

QUICK = Limits(timeout_s=3.0, memory_mb=1024, cpus=1, max_procs=64, max_file_mb=64, max_output_bytes=8192)

SLEEP_THEN_SUBMIT = """
import time
time.sleep(SECONDS)
open("submission.csv", "w").write("request_id,requester_received_pizza\\n")
print("slept", SECONDS)
"""

# deterministic programs whose results both fleets must agree on
MIXED = {
    "normal": programs.NORMAL,
    "raises": "print('before'); raise ValueError('agent bug')",
    "exit3": "import sys; print('bye'); sys.exit(3)",
    "timeout": programs.SLEEP_PAST_TIMEOUT,
    "no_submission": "print('nothing written')",
}


def _summary(r):
    sub = r.submission_path.read_bytes() if r.submission_path else None
    return r.status, r.exit_code, r.stdout_tail, sub


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    fleet = local_fleet(replace(BWRAP, slots=2), work_root=root / "work", out_root=root / "results")
    yield fleet
    fleet.close()


@pytest.fixture(scope="module")
def ray_fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray")
    fleet = RayFleet(replace(BWRAP, fleet="ray", slots=2, ray_actor_cpus=1), out_root=root / "driver")
    yield fleet
    fleet.close()


def test_results_come_back_in_completion_order(pool, pizza_task):
    slow = pool.submit(SLEEP_THEN_SUBMIT.replace("SECONDS", "2.5"), pizza_task, replace(QUICK, timeout_s=20))
    fast = pool.submit(programs.NORMAL, pizza_task, QUICK)
    done, _ = wait([slow, fast], return_when=FIRST_COMPLETED)
    assert done == {fast}
    assert fast.result().status is Status.OK and slow.result().status is Status.OK
    assert slow.result().duration_s > 2.5 > fast.result().duration_s


class GatedSlot(LocalSlot):
    """A real local slot that says when it has taken a run and holds it until the test opens the gate."""

    def __init__(self, sandbox, taken: threading.Event, gate: threading.Event):
        super().__init__(sandbox)
        self.taken, self.gate = taken, gate

    def run(self, code: str, task: Task, limits: Limits) -> ExecResult:
        self.taken.set()
        assert self.gate.wait(60), "the test never opened the gate"
        return super().run(code, task, limits)


def test_bounded_queue_blocks_then_refuses(pizza_task, tmp_path):
    sandbox = make_sandbox(BWRAP, work_root=tmp_path / "w", out_root=tmp_path / "r")
    taken, gate = threading.Event(), threading.Event()
    fleet = SlotFleet(lambda i: GatedSlot(sandbox, taken, gate), slots=1, queue_size=1)
    try:
        running = fleet.submit(programs.NORMAL, pizza_task, QUICK)
        assert taken.wait(60)  # the slot took it; the queue is empty again
        queued = fleet.submit(programs.NORMAL, pizza_task, QUICK)
        with pytest.raises(queue.Full):
            fleet.submit(programs.NORMAL, pizza_task, QUICK, timeout=0.2)
        gate.set()
        assert running.result(timeout=60).status is Status.OK and queued.result(timeout=60).status is Status.OK
    finally:
        gate.set()
        fleet.close()


def test_a_deep_tree_is_the_programs_own_result_and_the_next_program_scores(pool, pizza_task):
    """A tree 1,200 folders deep used to crash the work dir's removal (RecursionError): the sample was retried and
    came back INFRA, never trained on, escaping its -10. Now it is the program's own result: it exited 0 and wrote
    no submission, so its reward is the failure's."""
    deep = pool.submit(programs.DEEP_TREE.format(depth=1200), pizza_task, QUICK).result(timeout=120)
    assert deep.status is Status.OK and deep.extra["attempts"] == 1, (deep.status, deep.stderr_tail[-500:])
    assert "made a tree 1200 folders deep" in deep.stdout_tail
    graded = grade_run(pizza_task, deep)
    assert not graded.valid and compute_reward(graded, deep.stdout_tail, False).total == -10.0
    normal = pool.submit(programs.NORMAL, pizza_task, QUICK).result(timeout=120)
    scored = grade_run(pizza_task, normal)
    assert normal.status is Status.OK and scored.valid and scored.score is not None, scored


def test_a_closed_fleet_leaves_nothing_in_tmp(pizza_task):
    """Without roots named by the caller, the sandbox's work dirs and results live in a folder of its own under
    $TMPDIR, removed when the fleet closes with the results nobody consumed (every launch used to leave
    /tmp/mle_jax_sandbox_<pid>/results/ with a folder per sample in flight)."""
    fleet = local_fleet(replace(BWRAP, slots=1))
    try:
        r = fleet.submit(programs.NORMAL, pizza_task, QUICK).result(timeout=60)
    finally:
        fleet.close()
    results = Path(r.extra["results_dir"])
    assert r.status is Status.OK and results.is_relative_to(os.environ.get("TMPDIR", "/tmp"))
    assert not results.exists() and not results.parent.parent.exists()


def test_executor_failure_retries_once_then_is_infra(pizza_task, tmp_path):
    # a real executor failure: the work root cannot be created (/proc refuses new dirs)
    fleet = local_fleet(replace(BWRAP, slots=1), work_root="/proc/mle_jax_no_such_dir", out_root=tmp_path / "r")
    try:
        r = fleet.submit(programs.NORMAL, pizza_task, QUICK).result(timeout=60)
    finally:
        fleet.close()
    assert r.status is Status.INFRA and r.infra_failure
    assert r.extra["attempts"] == 2 and "mle_jax_no_such_dir" in r.stderr_tail


def test_ray_fleet_gives_the_same_results_as_the_local_pool(pool, ray_fleet, pizza_task):
    names = list(MIXED)
    local = [pool.submit(MIXED[n], pizza_task, QUICK) for n in names]
    remote = [ray_fleet.submit(MIXED[n], pizza_task, QUICK) for n in names]
    for name, a, b in zip(names, local, remote, strict=True):
        ra, rb = a.result(timeout=120), b.result(timeout=120)
        assert _summary(ra) == _summary(rb), name
        assert rb.extra["attempts"] == 1
    statuses = {n: f.result().status for n, f in zip(names, local, strict=True)}
    assert statuses == {
        "normal": Status.OK,
        "raises": Status.ERROR,
        "exit3": Status.ERROR,
        "timeout": Status.TIMEOUT,
        "no_submission": Status.OK,
    }


def test_killing_ray_executors_mid_run_retries_the_samples(ray_fleet, pizza_task):
    limits = Limits(timeout_s=30, memory_mb=1024, max_output_bytes=8192)
    with StartSignal(pizza_task) as started:
        code = started.prefix() + SLEEP_THEN_SUBMIT.replace("SECONDS", "3")
        futures = [ray_fleet.submit(code, pizza_task, limits) for _ in range(2)]
        started.wait(2)  # both slots are running
        for pid in ray_fleet.executor_pids():
            os.kill(pid, signal.SIGKILL)
        results = [f.result(timeout=120) for f in futures]
    for r in results:
        assert r.status is Status.OK, (r.status, r.stderr_tail)
        assert r.extra["attempts"] == 2 and "retried_after" in r.extra
        assert r.submission_path is not None and r.submission_path.is_file()
        assert "slept 3" in r.stdout_tail


def test_ray_fleet_stays_on_loopback(ray_fleet):
    """Tests send traffic to loopback only: every address the local Ray cluster reports (the GCS, the driver's
    node, the raylet, object manager and runtime-env agent, each executor's node) is a loopback address. Ray turns
    a node address of 127.0.0.1 into this machine's interface address, so the fleet must not give it one."""
    addresses = ray_fleet.ray_addresses()
    roles = {role.split(" ")[0] for role in addresses}
    assert {"gcs", "driver", "raylet", "object", "runtime", "executor"} <= roles, addresses
    assert sum(role.startswith("executor") for role in addresses) == 2
    assert {role: a for role, a in addresses.items() if not is_loopback(address_host(a))} == {}, addresses


def test_both_fleets_are_fleets(pool, ray_fleet):
    assert isinstance(pool, Fleet) and isinstance(ray_fleet, Fleet)
    assert pool.n_slots == ray_fleet.n_slots == 2


def test_make_fleet_from_config(pizza_task, tmp_path):
    cfg = get_config().executor
    cfg.backend, cfg.fleet, cfg.slots, cfg.timeout_s, cfg.memory_mb = "bwrap", "local", 2, 20.0, 1024
    settings = ExecutorSettings(**cfg.to_dict())
    fleet = make_fleet(settings, work_root=tmp_path / "w", out_root=tmp_path / "r")
    try:
        assert isinstance(fleet, SlotFleet) and fleet.n_slots == 2
        r = fleet.submit(programs.NORMAL, pizza_task, settings.limits()).result(timeout=60)
        assert r.status is Status.OK
        assert r.submission_path is not None and r.submission_path.is_relative_to(tmp_path / "r")
    finally:
        fleet.close()


# The Ray cluster of a fleet disappears (shut down under it) before the fleet closes: killing its actors
# then fails, and that must be seen, not swallowed, nor start a new cluster (Ray's ray.kill would start one).
# In a process of its own: this one's Ray is in use.
RAY_GONE = """
import logging, sys
import ray
from mle_jax.executor.fleet import RayFleet
from mle_jax.executor.settings import ExecutorSettings

logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
fleet = RayFleet(ExecutorSettings(backend="bwrap", fleet="ray", slots=1, ray_actor_cpus=1))
print("actor pid", fleet.executor_pids()[0], flush=True)
ray.shutdown()
fleet.close()
print("closed", flush=True)
"""


def test_a_failing_ray_kill_is_logged():
    out = subprocess.run(
        [sys.executable, "-c", RAY_GONE], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    assert "actor pid" in out.stdout and "closed" in out.stdout
    assert out.stderr.count("Started a local Ray instance") == 1, out.stderr[-2000:]  # the fleet's, no other
    warnings = [x for x in out.stderr.splitlines() if x.startswith("WARNING mle_jax.executor.fleet: ray.kill")]
    assert len(warnings) == 1 and "failed" in warnings[0], out.stderr[-2000:]


def test_a_stalled_ray_executor_is_replaced_and_its_runs_retried(ray_fleet, pizza_task, monkeypatch):
    """Found by bench/chaos.py: an executor stopped (SIGSTOP: a frozen node) past its program's timeout held its slot
    forever (the driver waited on the actor without a deadline). Now it is given up STALL_GRACE_S after the timeout,
    killed, and its run retried on a fresh actor: graded once, from the second attempt."""
    monkeypatch.setattr(fleet_module, "STALL_GRACE_S", 2.0)
    limits = Limits(timeout_s=4, memory_mb=1024, max_output_bytes=8192)
    with StartSignal(pizza_task) as started:
        code = started.prefix() + SLEEP_THEN_SUBMIT.replace("SECONDS", "1")
        futures = [ray_fleet.submit(code, pizza_task, limits) for _ in range(2)]
        started.wait(2)  # both slots are running
        pids = ray_fleet.executor_pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            results = [f.result(timeout=120) for f in futures]
        finally:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
    for r in results:
        assert r.status is Status.OK, (r.status, r.stderr_tail)
        assert r.extra["attempts"] == 2 and "stalled" in r.extra["retried_after"], r.extra
        assert "slept 1" in r.stdout_tail
    assert set(ray_fleet.executor_pids()).isdisjoint(pids)  # fresh actors serve the slots
