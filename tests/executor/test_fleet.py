"""Fleets: the local pool and Ray actors on a local Ray cluster, both running real bwrap sandboxes."""

from __future__ import annotations

import os
import queue
import signal
import time
from concurrent.futures import FIRST_COMPLETED, wait
from dataclasses import replace

import pytest

from configs.base import get_config
from mle_jax.executor.fleet import RayFleet, limits_from_config, local_fleet, make_fleet
from mle_jax.executor.result import Limits, Status
from tests.executor import programs

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
    fleet = local_fleet("bwrap", slots=2, work_root=root / "work", out_root=root / "results")
    yield fleet
    fleet.close()


@pytest.fixture(scope="module")
def ray_fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray")
    fleet = RayFleet("bwrap", slots=2, actor_cpus=1, out_root=root / "driver")
    yield fleet
    fleet.close()


def test_results_come_back_in_completion_order(pool, pizza_task):
    slow = pool.submit(SLEEP_THEN_SUBMIT.replace("SECONDS", "2.5"), pizza_task, replace(QUICK, timeout_s=20))
    fast = pool.submit(programs.NORMAL, pizza_task, QUICK)
    done, _ = wait([slow, fast], return_when=FIRST_COMPLETED)
    assert done == {fast}
    assert fast.result().status is Status.OK and slow.result().status is Status.OK
    assert slow.result().duration_s > 2.5 > fast.result().duration_s


def test_bounded_queue_blocks_then_refuses(pizza_task, tmp_path):
    fleet = local_fleet("bwrap", slots=1, queue_size=1, work_root=tmp_path / "w", out_root=tmp_path / "r")
    try:
        running = fleet.submit(SLEEP_THEN_SUBMIT.replace("SECONDS", "1.5"), pizza_task, QUICK)
        time.sleep(0.5)  # the slot took it; the queue is empty again
        queued = fleet.submit(programs.NORMAL, pizza_task, QUICK)
        with pytest.raises(queue.Full):
            fleet.submit(programs.NORMAL, pizza_task, QUICK, timeout=0.2)
        assert running.result().status is Status.OK and queued.result().status is Status.OK
    finally:
        fleet.close()


def test_executor_failure_retries_once_then_is_infra(pizza_task, tmp_path):
    # a real executor failure: the work root cannot be created (/proc refuses new dirs)
    fleet = local_fleet("bwrap", slots=1, work_root="/proc/mle_jax_no_such_dir", out_root=tmp_path / "r")
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
    code = SLEEP_THEN_SUBMIT.replace("SECONDS", "3")
    futures = [ray_fleet.submit(code, pizza_task, limits) for _ in range(2)]
    time.sleep(1.5)  # both slots are running
    for pid in ray_fleet.executor_pids():
        os.kill(pid, signal.SIGKILL)
    results = [f.result(timeout=120) for f in futures]
    for r in results:
        assert r.status is Status.OK, (r.status, r.stderr_tail)
        assert r.extra["attempts"] == 2 and "retried_after" in r.extra
        assert r.submission_path is not None and r.submission_path.is_file()
        assert "slept 3" in r.stdout_tail


def test_make_fleet_from_config(pizza_task):
    cfg = get_config().executor
    cfg.backend, cfg.fleet, cfg.slots, cfg.timeout_s, cfg.memory_mb = "bwrap", "local", 2, 20.0, 1024
    fleet = make_fleet(cfg)
    try:
        assert fleet.n_slots == 2
        r = fleet.submit(programs.NORMAL, pizza_task, limits_from_config(cfg)).result(timeout=60)
        assert r.status is Status.OK
    finally:
        fleet.close()
