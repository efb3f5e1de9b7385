"""infra/orphans.py: a process group in its own session ends when its launcher is SIGKILLed (what the OOM killer
does to a run that started vLLM servers), stays while the launcher lives, and the watcher leaves once the group is
stopped normally."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mle_jax.infra.orphans import end_with_parent

# a launcher: starts a "server" (a sleep and its child, in a session of its own, as VLLMServer.launch does), guards
# it, prints both pids, then lives until killed or until told to stop the server itself (a line on stdin)
LAUNCHER = r"""
import os, signal, subprocess, sys, time
from mle_jax.infra.orphans import end_with_parent
server = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
guard = end_with_parent(server.pid, grace_s=1.0, interval_s=0.1)
print(server.pid, guard.pid, flush=True)
sys.stdin.readline()
os.killpg(server.pid, signal.SIGTERM)
server.wait()
print(guard.wait(timeout=10), flush=True)
"""


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _gone_within(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return True
        time.sleep(0.05)
    return False


def _launch() -> tuple[subprocess.Popen, int, int]:
    p = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    server, guard = map(int, p.stdout.readline().split())
    return p, server, guard


def test_a_launcher_killed_outright_takes_its_server_group_along_and_one_alive_keeps_it():
    launcher, server, guard = _launch()
    try:
        time.sleep(0.5)  # five of the watcher's polls with the launcher alive
        assert _group_alive(server) and _group_alive(guard)
        launcher.send_signal(signal.SIGKILL)  # no finally, no atexit: what the OOM killer does
        launcher.wait()
        assert _gone_within(server, 10.0), "the server's group outlived its SIGKILLed launcher"
        assert _gone_within(guard, 5.0)  # the watcher left once its work was done
    finally:
        for pgid in (server, guard):
            if _group_alive(pgid):
                os.killpg(pgid, signal.SIGKILL)


def test_the_watcher_leaves_by_itself_when_the_launcher_stops_the_group():
    launcher, server, guard = _launch()
    out, _ = launcher.communicate("stop\n", timeout=30)
    assert launcher.returncode == 0 and out.strip() == "0"  # the launcher reaped a watcher that exited with 0
    assert not _group_alive(server) and not _group_alive(guard)


def test_a_pgid_that_is_no_group_of_its_own_is_refused():
    for pgid in (0, 1):
        with pytest.raises(ValueError, match="process group of its own"):
            end_with_parent(pgid)
