"""Real bubblewrap sandboxes running real programs on the real pizza data, hostile ones included.

Every hostile program is followed by a normal run in the same sandbox object, which must still work.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from mle_jax.env.observation import observe_run
from mle_jax.executor.bwrap import CGROUP_PREFIX, STAGE_ROOT, SandboxSetupError
from mle_jax.executor.cgroups import RunCgroup
from mle_jax.executor.grading import grade_run
from mle_jax.executor.result import Status, error_line, outcome
from mle_jax.executor.runtime import REPO_ROOT
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.executor.workspace import disk_usage
from mle_jax.tasks.graders import grade
from mle_jax.tasks.prepare import RAW_DATA_DIR
from tests.executor import programs
from tests.executor.conftest import BWRAP, CLOCK, HOSTILE, NORMAL, graded_outcomes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    root = tmp_path_factory.mktemp("bwrap")
    settings = replace(BWRAP, max_work_mb=512)  # FILL_DISK passes this cap only when it reaches the sandbox
    return make_sandbox(settings, work_root=root / "work", out_root=root / "results")


def _survivors(uid: int, timeout_s: float = 10.0) -> list[int]:
    """Processes of uid that do not exit within timeout_s (each waited on through a pidfd). What dies with the
    sandbox may still be on its way out when run() returns; something that escaped never gets there."""
    alive = []
    for pid in _uid_processes(uid):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            if not select.select([fd], [], [], timeout_s)[0]:
                alive.append(pid)
        finally:
            os.close(fd)
    return alive


def _uid_processes(uid: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid == uid:
                    pids.append(int(d.name))
            except OSError:
                pass
    return pids


def _normal_run_works(sandbox, task):
    r = sandbox.run(programs.NORMAL, task, NORMAL)
    assert r.status is Status.OK, (r.status, r.stderr_tail)
    assert "normal run done" in r.stdout_tail
    assert r.submission_path is not None and r.submission_path.is_file()
    return r


def test_pizza_sklearn_solution_grades(sandbox, pizza_task):
    r = sandbox.run(programs.PIZZA_SKLEARN, pizza_task, NORMAL)
    assert r.status is Status.OK, r.stderr_tail
    assert r.exit_code == 0
    assert "trained model" in r.stdout_tail
    assert 0.5 < r.duration_s < r.extra["wall_s"]
    g = grade(pizza_task, r.submission_path)
    assert g.valid, g.reason
    assert 0.6 < g.score < 1.0  # a real model on real data: well above chance, below perfect
    assert r.extra["cgroup"] == ["cpu", "memory", "pids"]


def test_fork_bomb(sandbox, pizza_task):
    r = sandbox.run(programs.FORK_BOMB, pizza_task, CLOCK)
    assert r.status in (Status.TIMEOUT, Status.KILLED), r.status
    assert r.extra["uid"] >= 200_000 and _survivors(r.extra["uid"]) == []  # nothing survived
    _normal_run_works(sandbox, pizza_task)


def test_allocate_50gb(sandbox, pizza_task):
    # the memory cap, not the clock, must stop it: on a loaded machine 6 s was not always enough to allocate 768 MB
    # (a flake seen with load 40: status timeout), and the cap stops it as soon as it is reached anyway
    r = sandbox.run(programs.ALLOCATE_50GB, pizza_task, replace(HOSTILE, timeout_s=120.0))
    assert r.status is Status.OOM, (r.status, r.stderr_tail[-500:])
    assert "allocated 100 MB" in r.stdout_tail and "allocated 1000 MB" not in r.stdout_tail
    assert outcome(r, False) == "oom"  # what samples.html shows: the allocation's error, or that memory ran out
    assert "MemoryError" in error_line(r) or error_line(r) == "out of memory", r.stderr_tail[-300:]
    _normal_run_works(sandbox, pizza_task)


def test_infinite_loop_times_out(sandbox, pizza_task):
    t0 = time.monotonic()
    r = sandbox.run(programs.INFINITE_LOOP, pizza_task, CLOCK)
    assert r.status is Status.TIMEOUT
    assert CLOCK.timeout_s - 1 < r.duration_s < CLOCK.timeout_s + 2
    assert time.monotonic() - t0 < CLOCK.timeout_s + 10
    assert "looping" in r.stdout_tail  # output before the kill is kept
    assert outcome(r, False) == "timeout" and error_line(r) == f"timed out after {r.duration_s:.0f} s"
    _normal_run_works(sandbox, pizza_task)


def test_sleep_past_timeout(sandbox, pizza_task):
    r = sandbox.run(programs.SLEEP_PAST_TIMEOUT, pizza_task, CLOCK)
    assert r.status is Status.TIMEOUT
    assert r.duration_s < CLOCK.timeout_s + 2
    _normal_run_works(sandbox, pizza_task)


def test_write_1gb_file_hits_file_size_limit(sandbox, pizza_task):
    r = sandbox.run(programs.WRITE_1GB, pizza_task, HOSTILE)
    assert r.status is Status.ERROR, r.status
    assert "File too large" in r.stderr_tail
    assert "wrote 1 GB" not in r.stdout_tail
    assert outcome(r, False) == "runtime_error" and "File too large" in error_line(r)
    _normal_run_works(sandbox, pizza_task)


def test_filling_the_disk_with_many_files_is_killed(sandbox, pizza_task):
    r = sandbox.run(programs.FILL_DISK, pizza_task, HOSTILE)  # sandbox cap: 512 MB, 64 x 48 MB asked
    assert r.status is Status.KILLED, (r.status, r.stderr_tail[-300:])
    assert r.extra["killed_reason"] == "disk"
    assert "file 63" not in r.stdout_tail
    _normal_run_works(sandbox, pizza_task)


def test_print_100mb_is_truncated_head_and_tail(sandbox, pizza_task):
    r = sandbox.run(programs.PRINT_100MB, pizza_task, HOSTILE)
    assert r.status is Status.OK
    assert r.extra["stdout_bytes"] == 100 * 1024 * 1024 + len("END-OF-OUTPUT\n")
    assert len(r.stdout_tail) < HOSTILE.max_output_bytes + 100
    assert r.stdout_tail.startswith("y" * 100) and r.stdout_tail.endswith("END-OF-OUTPUT\n")
    assert "bytes elided" in r.stdout_tail
    saved = Path(r.extra["results_dir"]) / "stdout.txt"
    assert saved.stat().st_size < HOSTILE.max_output_bytes + 100
    _normal_run_works(sandbox, pizza_task)


def test_cannot_reach_a_listener_on_host_loopback(sandbox, pizza_task):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    try:
        r = sandbox.run(programs.CONNECT_HOST_LOOPBACK.replace("PORT", str(port)), pizza_task, HOSTILE)
        assert "connect failed" in r.stdout_tail and "CONNECTED" not in r.stdout_tail
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing arrived
    finally:
        listener.close()
    _normal_run_works(sandbox, pizza_task)


def test_only_a_down_loopback_interface(sandbox, pizza_task):
    r = sandbox.run(programs.LIST_INTERFACES, pizza_task, HOSTILE)
    assert r.status is Status.OK, r.stderr_tail
    line = next(x for x in r.stdout_tail.splitlines() if x.startswith("IFACES "))
    flags = json.loads(line[len("IFACES ") :])
    assert set(flags) <= {"lo"}
    assert all(f & 0x1 == 0 for f in flags.values())  # IFF_UP not set
    _normal_run_works(sandbox, pizza_task)


def test_cannot_read_etc_shadow(sandbox, pizza_task):
    r = sandbox.run(programs.READ_SHADOW, pizza_task, HOSTILE)
    assert "denied" in r.stdout_tail and "root:" not in r.stdout_tail
    _normal_run_works(sandbox, pizza_task)


def test_cannot_read_private_answers_or_host_dirs(sandbox, pizza_task):
    raw = RAW_DATA_DIR / "random-acts-of-pizza" / "train.json"  # in the repository: the labels of every split
    paths = [
        str(pizza_task.answers_path),
        str(pizza_task.private_dir),
        str(pizza_task.private_dir.parent),
        "/workdir/random-acts-of-pizza/prepared/private/test.csv",
        str(raw),
        str(REPO_ROOT),
        str(REPO_ROOT / ".sandbox-venv"),
        "/root",
        "/work",
        "/home",
        "/var",
        "/opt/pypi",
        "/run",
    ]
    r = sandbox.run(programs.READ_PRIVATE.replace("PATHS", repr(paths)), pizza_task, HOSTILE)
    assert r.status is Status.OK, r.stderr_tail
    assert "FOUND" not in r.stdout_tail, r.stdout_tail
    assert r.stdout_tail.count("absent:") == len(paths)
    fds = [x for x in r.stdout_tail.splitlines() if x.startswith("fd ")]
    assert {x.split()[1] for x in fds} <= {"0", "1", "2", "3"}  # 3: the listing itself
    _normal_run_works(sandbox, pizza_task)


def test_cannot_write_outside_the_work_dir(sandbox, pizza_task):
    name = f"mle_jax_escape_{uuid.uuid4().hex[:8]}"
    r = sandbox.run(programs.WRITE_OUTSIDE.replace("TMPNAME", name), pizza_task, HOSTILE)
    assert r.status is Status.OK, r.stderr_tail
    wrote = [x for x in r.stdout_tail.splitlines() if x.startswith("WROTE")]
    assert wrote == [f"WROTE /tmp/{name}"], wrote  # only the sandbox's private /tmp
    assert not Path("/tmp", name).exists()
    assert not (pizza_task.public_dir / "evil").exists()
    _normal_run_works(sandbox, pizza_task)


def test_daemon_left_behind_is_killed(tmp_path, pizza_task):
    sb = make_sandbox(BWRAP, work_root=tmp_path / "work", out_root=tmp_path / "results", keep_work=True)
    r = sb.run(programs.DAEMON, pizza_task, HOSTILE)
    assert r.status is Status.OK and "daemon left behind" in r.stdout_tail
    work_dir = tmp_path / "work" / r.extra["run_id"]
    assert (work_dir / "DAEMON_STARTED").exists()  # it was running when its parent exited
    owner = work_dir.stat().st_uid
    assert owner >= 200_000 and _survivors(owner) == []  # and it is gone with the sandbox
    assert not (work_dir / "DAEMON_MARKER").exists()
    _normal_run_works(sb, pizza_task)


def test_killing_the_parent_process(sandbox, pizza_task):
    r = sandbox.run(programs.KILL_PARENT, pizza_task, HOSTILE)
    assert r.status in (Status.OK, Status.KILLED), (r.status, r.stdout_tail)
    assert os.getpid() > 0  # (we are still here)
    _normal_run_works(sandbox, pizza_task)


def test_submission_written_elsewhere_is_not_collected(sandbox, pizza_task):
    r = sandbox.run(programs.CHDIR_SUBMISSION, pizza_task, HOSTILE)
    assert r.status is Status.OK
    assert r.submission_path is None and "no submission" in r.extra["submission_reason"]
    assert outcome(r, False) == "invalid_submission" and error_line(r) is None
    r = sandbox.run(programs.SYMLINK_SUBMISSION, pizza_task, HOSTILE)
    assert r.status is Status.OK and r.submission_path is None
    assert "not a regular file" in r.extra["submission_reason"]
    # what the agent reads is what the executor and the grader say (it used to read "no submission.csv was written")
    seen = observe_run(r, None, pizza_task)
    assert seen.submission_note == r.extra["submission_reason"] == grade_run(pizza_task, r).reason
    assert "not a regular file" in seen.text(1500) and "no submission.csv was written" not in seen.text(1500)
    _normal_run_works(sandbox, pizza_task)


def test_a_write_after_the_program_exited_is_never_graded(sandbox, pizza_task):
    """A detached child rewrites submission.csv once the main process is gone: the program is its pid namespace's
    init, so the child dies with it, and the copy is taken after that. It used to be graded (or half-copied) by
    chance: 7 of 20 runs the child's file, 5 a truncated one, 8 the program's."""
    outcomes = graded_outcomes(sandbox, pizza_task, programs.LATE_WRITER, HOSTILE, runs=10)
    assert len(outcomes) == 1, outcomes
    status, submission, _, _ = next(iter(outcomes))
    assert status is Status.OK and submission == programs.LATE_WRITER_MAIN_SUBMISSION


def test_a_sparse_submission_is_refused_before_it_is_copied(sandbox, pizza_task):
    """256 MB of holes cost ~8 KB in the sandbox; its size is checked against the grader's cap (64 MB here) before a
    byte is copied (it used to be copied out as a real 256 MB file, then refused by the grader)."""
    r = sandbox.run(programs.SPARSE_SUBMISSION, pizza_task, replace(HOSTILE, max_file_mb=512))
    assert r.status is Status.OK, (r.status, r.stderr_tail[-300:])
    assert r.submission_path is None
    assert r.extra["submission_reason"] == f"submission.csv is {256 << 20} bytes, over the {64 << 20} byte cap"
    assert grade_run(pizza_task, r).reason == r.extra["submission_reason"]  # what the agent is told
    results = Path(r.extra["results_dir"])
    assert not (results / "submission.csv").exists() and disk_usage(results).bytes < 1 << 20
    _normal_run_works(sandbox, pizza_task)


def test_a_program_stopped_by_ptrace_times_out_saying_why(sandbox, pizza_task):
    """A child stops the sandbox's pid 1 (the program) with PTRACE_ATTACH: it harms only itself, and its timeout
    says why (it used to be a bare timeout, with the program's exit unreported behind a stopped bwrap init)."""
    r = sandbox.run(programs.PTRACE_STOP_INIT, pizza_task, CLOCK)
    assert r.status is Status.TIMEOUT, (r.status, r.stdout_tail)
    assert "attach: 0 0" in r.stdout_tail and "main exits" not in r.stdout_tail
    assert re.fullmatch(r"timeout: the program was in tracing stop \(traced by host pid \d+\) when its time ran out",
                        r.extra["killed_reason"]), r.extra["killed_reason"]  # fmt: skip
    _normal_run_works(sandbox, pizza_task)


def test_a_broken_sandbox_raises_instead_of_blaming_the_program(tmp_path, pizza_task):
    sb = make_sandbox(BWRAP, work_root=tmp_path / "w", out_root=tmp_path / "r")
    sb.profile_args = sb.profile_args + ["--ro-bind", "/nonexistent/mle_jax", "/x"]
    with pytest.raises(SandboxSetupError):
        sb.run(programs.NORMAL, pizza_task, NORMAL)


def test_leftovers_of_a_dead_executor_are_reaped(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid now names a dead executor
    stage = STAGE_ROOT / f"{gone.pid}_deadbeef0000"
    for name in ("venv", "public", "work"):
        (stage / name).mkdir(parents=True)
    group = RunCgroup.create(f"{CGROUP_PREFIX}{gone.pid}_deadbeef0000", 64, 8, 1)
    assert group is not None
    make_sandbox(BWRAP, work_root=tmp_path / "w", out_root=tmp_path / "r")
    assert not stage.exists()
    assert not any(d.exists() for d in group.dirs.values())
