"""A process group that ends with the process that started it, however that process ends.

A vLLM server runs in its own session (`start_new_session`, so that `stop()` reaches its engine and workers with one
`killpg`); the price is that nothing ends it when its launcher dies without running `stop()`: killed by the OOM
killer, SIGKILL, a crash in native code. One such server holds ~7 GB here. Linux's PR_SET_PDEATHSIG does not serve:
it fires when the *thread* that forked the child exits, and servers are launched from worker threads.

`end_with_parent(pgid)` starts a small watcher process (its own session, so that neither the group's `killpg` nor a
Ctrl-C to the launcher's terminal ends it first). It polls its parent pid: once the launcher is gone (the watcher was
re-parented), it sends the group SIGTERM and, after a grace period, SIGKILL. It exits by itself as soon as the group
is gone (a normal `stop()`), so it never outlives what it watches by more than one poll.
"""

from __future__ import annotations

import os
import subprocess
import sys

WATCHER = r"""
import os, signal, sys, time
pgid, parent, grace_s, interval_s = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])

def alive():
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

while alive():
    if os.getppid() != parent:  # the launcher is gone: this process was handed to a reaper
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                sys.exit(0)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and alive():
                time.sleep(0.1)
        sys.exit(0)
    time.sleep(interval_s)
"""


def end_with_parent(pgid: int, grace_s: float = 30.0, interval_s: float = 1.0) -> subprocess.Popen:
    """Ends process group `pgid` (SIGTERM, SIGKILL after `grace_s`) within `interval_s` of this process's death.

    Returns the watcher; poll it now and then (it exits by itself once the group is gone) so that it is reaped."""
    if pgid <= 1:
        raise ValueError(f"pgid must be a process group of its own (> 1), got {pgid}")
    return subprocess.Popen(
        [sys.executable, "-S", "-c", WATCHER, str(pgid), str(os.getpid()), str(grace_s), str(interval_s)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
