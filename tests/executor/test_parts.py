"""Unit tests of the executor's parts: bounded capture, status rules, submission copy-out, cgroups."""

from __future__ import annotations

import os

from mle_jax.executor.capture import BoundedCapture
from mle_jax.executor.cgroups import RunCgroup
from mle_jax.executor.result import Status
from mle_jax.executor.sandbox import classify, signal_exit_code
from mle_jax.executor.workspace import collect_submission, disk_usage_bytes


def test_capture_keeps_head_and_tail_and_counts_everything():
    c = BoundedCapture(10)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"qrstuvwxyz"):
        c.feed(chunk)
    assert c.total_bytes == 26 and c.truncated
    text = c.text()
    assert text.startswith("abcde") and text.endswith("vwxyz") and "16 bytes elided" in text
    small = BoundedCapture(100)
    small.feed("héllo".encode())
    assert small.text() == "héllo" and not small.truncated


def test_status_rules():
    assert classify(0, False, False, "", "") is Status.OK
    assert classify(1, False, False, "", "Traceback\nValueError") is Status.ERROR
    assert classify(1, False, False, "", "MemoryError") is Status.OOM
    assert classify(-9, False, True, "", "") is Status.OOM
    assert classify(-9, True, False, "timeout", "") is Status.TIMEOUT
    assert classify(-9, False, False, "disk", "") is Status.KILLED
    assert classify(-25, False, False, "", "") is Status.KILLED
    assert signal_exit_code(137) == -9 and signal_exit_code(3) == 3 and signal_exit_code(None) is None


def test_collect_submission_only_takes_small_regular_files(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    assert collect_submission(work, out, 100)[0] is None
    os.mkfifo(work / "submission.csv")  # would block a naive reader
    path, why = collect_submission(work, out, 100)
    assert path is None and "not a regular file" in why
    (work / "submission.csv").unlink()
    (work / "submission.csv").symlink_to("/etc/passwd")
    path, why = collect_submission(work, out, 100)
    assert path is None and "not a regular file" in why
    (work / "submission.csv").unlink()
    (work / "submission.csv").write_text("x" * 101)
    path, why = collect_submission(work, out, 100)
    assert path is None and "over" in why
    (work / "submission.csv").write_text("id,y\n1,0\n")
    path, why = collect_submission(work, out, 100)
    assert path == out / "submission.csv" and path.read_text() == "id,y\n1,0\n" and why == ""


def test_disk_usage_counts_allocated_blocks_not_sparse_size(tmp_path):
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 30)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "real").write_bytes(b"x" * (1 << 20))
    used = disk_usage_bytes(tmp_path)
    assert (1 << 20) <= used < (4 << 20)


def test_run_cgroup_limits_and_cleanup():
    g = RunCgroup.create(f"mle_jax_unit_{os.getpid()}", memory_mb=256, max_procs=16, cpus=1)
    assert g is not None, "this host allows per-run cgroups (root, cgroup v1 memory/pids writable)"
    try:
        assert {"memory", "pids"} <= g.controls
        if g.version == 1:
            assert int((g.dirs["memory"] / "memory.limit_in_bytes").read_text()) == 256 << 20
            assert (g.dirs["pids"] / "pids.max").read_text().strip() == "16"
        assert g.pids() == set() and g.oom_kills() == 0
    finally:
        g.destroy()
    assert not any(d.exists() for d in g.dirs.values())
