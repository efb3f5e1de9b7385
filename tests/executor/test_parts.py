"""Unit tests of the executor's parts: bounded capture, status rules, submission copy-out, cgroups, settings."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

from configs.base import get_config
from mle_jax.executor import registry
from mle_jax.executor.capture import BoundedCapture
from mle_jax.executor.cgroups import RunCgroup
from mle_jax.executor.result import (
    ExecResult,
    Limits,
    Status,
    classify,
    error_line,
    outcome,
    signal_exit_code,
    signal_name,
)
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.executor.workspace import DiskWatchdog, collect_submission, disk_usage, remove_tree
from tests.executor.conftest import deep_tree


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
    assert signal_name(-9) == "SIGKILL" and signal_name(0) == "" and signal_name(None) == ""


def test_outcome_and_error_line_say_what_became_of_a_sample():
    """The outcome a report plots and samples.html filters by, and the line that says why a run failed (a traceback's
    last line; what stopped it when stderr says nothing)."""

    def run(status, stderr="", exit_code=1, **extra):
        return ExecResult(status, exit_code, 12.4, "out\n", stderr, None, extra)

    syntax = "  File \"/workdir/main.py\", line 3\n    x = (\n        ^\nSyntaxError: '(' was never closed\n"
    assert (outcome(run(Status.ERROR, syntax), False), error_line(run(Status.ERROR, syntax))) == (
        "syntax_error",
        "SyntaxError: '(' was never closed",
    )
    indent = "Traceback (most recent call last):\nIndentationError: unexpected indent\n\n"
    assert outcome(run(Status.ERROR, indent), False) == "syntax_error"
    crash = "Traceback (most recent call last):\n  File ...\nKeyError: 'label'\n"
    assert outcome(run(Status.ERROR, crash), False) == "runtime_error"
    assert error_line(run(Status.ERROR, crash)) == "KeyError: 'label'"
    assert error_line(run(Status.ERROR, "", exit_code=3)) == "exit code 3"
    assert (outcome(run(Status.TIMEOUT), False), error_line(run(Status.TIMEOUT))) == ("timeout", "timed out after 12 s")
    assert (outcome(run(Status.OOM), False), error_line(run(Status.OOM))) == ("oom", "out of memory")
    killed = run(Status.KILLED, exit_code=-9, killed_reason="disk")
    assert (outcome(killed, False), error_line(killed)) == ("killed", "killed (disk)")
    ok = run(Status.OK, exit_code=0)
    assert (outcome(ok, False), outcome(ok, True), error_line(ok)) == ("invalid_submission", "valid", None)
    assert (outcome(None, False), error_line(None)) == ("no_code", None)  # no code block: never ran


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
    used = disk_usage(tmp_path)
    assert (1 << 20) <= used.bytes < (4 << 20) and used.entries == 3


def test_too_many_entries_count_as_over_the_cap(tmp_path):
    """The walk stops at its bound: what lies past it is not 'unseen' but over the cap (a program used to make
    200,000 empty files and then write past the byte cap unnoticed)."""
    (tmp_path / "many").mkdir()
    for i in range(150):
        (tmp_path / "many" / str(i)).touch()
    (tmp_path / "big").write_bytes(b"x" * (2 << 20))
    assert disk_usage(tmp_path, max_entries=100).entries == 101
    assert disk_usage(tmp_path, max_entries=1000).entries == 152
    fired = threading.Event()
    with DiskWatchdog(tmp_path, 1 << 30, fired.set, interval_s=0.01, max_entries=100) as dog:
        assert fired.wait(10)
    assert dog.exceeded and dog.reason == "the work dir holds more than 100 files and folders"
    with DiskWatchdog(tmp_path, 1 << 20, fired.set, interval_s=0.01, max_entries=1000) as dog:
        for _ in range(1000):
            if dog.exceeded:
                break
            time.sleep(0.01)
    assert dog.exceeded and dog.reason == "the work dir uses more than 1 MB"


def test_a_dir_over_its_cap_when_the_program_ends_is_over_it(tmp_path):
    """A program can pass a cap and exit between two polls (the CLI's 2,200 files and 800 MB did in 0.45 s, and came
    out ok): the watchdog measures once more on exit."""
    (tmp_path / "big").write_bytes(b"x" * (2 << 20))
    fired = threading.Event()
    with DiskWatchdog(tmp_path, 1 << 20, fired.set, interval_s=60) as dog:
        pass  # the program ended before the first poll
    assert dog.exceeded and dog.reason == "the work dir uses more than 1 MB" and not fired.is_set()


def test_a_tree_past_path_max_is_measured_and_removed():
    """2,500 folders deep (paths of 5,000 characters, past PATH_MAX): the watchdog's walk used to stop where paths got
    too long, missing what lay below, and rmtree raised RecursionError. On tmpfs: every folder costs on this disk."""
    root = Path(tempfile.mkdtemp(prefix="mle_jax_deep_", dir="/dev/shm"))
    try:
        deep_tree(root / "t", 2500, file_bytes=1 << 20)
        with pytest.raises(OSError, match="File name too long"):
            os.stat(root.joinpath("t", *["d"] * 2500, "bottom.bin"))
        used = disk_usage(root)
        assert used.entries == 1 + 2500 + 1 and used.bytes >= 1 << 20, used
        remove_tree(root)
        assert not root.exists()
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def _fd_target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # closed since the listing
        return ""


def test_a_comb_of_folders_too_costly_to_measure_is_over_the_cap():
    """Folders opened relative to their parent's fd cost one path component each (a chain of any depth is as cheap as
    its entries), but a walk holds only so many parents open: a comb 1,000 deep whose deep branch comes first is
    opened by paths past that, and what that would cost counts as over the cap, not as a poll that never ends."""
    root = Path(tempfile.mkdtemp(prefix="mle_jax_comb_", dir="/dev/shm"))
    try:
        fd = os.open(root, os.O_RDONLY)
        for _ in range(1000):  # each level: the branch that goes on, then a leaf (scandir lists the leaf first)
            os.mkdir("z", dir_fd=fd)
            os.mkdir("a", dir_fd=fd)
            below = os.open("z", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = below
        os.close(fd)
        assert disk_usage(root).too_deep
        # no fd left open in the comb (by where each points: other threads of the worker open and close their own)
        assert [f for f in os.listdir("/proc/self/fd") if _fd_target(f).startswith(str(root))] == []
        fired = threading.Event()
        with DiskWatchdog(root, 1 << 30, fired.set, interval_s=0.01) as dog:
            assert fired.wait(10)
        assert dog.reason == "the work dir's folders nest too deep to measure"
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


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


def test_settings_are_the_executor_config_section():
    section = get_config().executor.to_dict()
    assert {f.name for f in dataclasses.fields(ExecutorSettings)} == set(section)
    assert ExecutorSettings(**section) == ExecutorSettings()  # same defaults as configs/base.py


def test_settings_limits():
    s = ExecutorSettings(timeout_s=30.0, memory_mb=512, cpus=2, max_procs=7, max_file_mb=3, max_output_bytes=99)
    assert s.limits() == Limits(timeout_s=30.0, memory_mb=512, cpus=2, max_procs=7, max_file_mb=3, max_output_bytes=99)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("backend", "kvm", "executor.backend='kvm' is unknown: use one of bwrap, docker"),
        ("fleet", "slurm", "executor.fleet='slurm' is unknown: use one of local, ray"),
        ("slots", -1, "executor.slots=-1 is too small: it must be at least 0"),
        ("queue_size", 0, "executor.queue_size=0 is too small: it must be at least 1"),
        ("memory_mb", 0, "executor.memory_mb=0 is too small: it must be at least 1"),
        ("max_work_mb", 0, "executor.max_work_mb=0 is too small: it must be at least 1"),
        ("ray_actor_cpus", -0.5, "executor.ray_actor_cpus=-0.5 is too small: it must be at least 0"),
        ("timeout_s", 0.0, "executor.timeout_s=0.0 must be a positive number of seconds"),
    ],
)
def test_settings_refuse_bad_values_in_one_line(field, value, message):
    with pytest.raises(ValueError) as e:
        ExecutorSettings(**{field: value})
    assert str(e.value) == message


# constructor options that are this host's, not the config's: where runs live, debugging, image building
_HOST_OPTIONS = {"work_root", "out_root", "keep_work", "use_cgroups", "bwrap", "profile", "build", "base_image"}


@pytest.mark.parametrize("backend", ["bwrap", "docker"])
def test_sandbox_options_cover_every_config_option_of_the_backend(backend):
    cls = registry.resolve(backend)
    params = set(inspect.signature(cls.__init__).parameters) - {"self"}
    settings = ExecutorSettings(backend=backend, sandbox_python="/venv/bin/python", max_work_mb=123)
    opts = cls.options(settings)
    assert set(opts) == params - _HOST_OPTIONS
    assert opts["python"] == "/venv/bin/python" and opts["max_work_mb"] == 123
    if backend == "docker":
        docker = cls.options(dataclasses.replace(settings, image="img:1", docker_url="unix:///x.sock"))
        assert docker["image"] == "img:1" and docker["base_url"] == "unix:///x.sock"
        assert cls.options(settings)["base_url"] is None  # "": DOCKER_HOST / the local Docker


def test_make_sandbox_passes_the_settings_on(tmp_path):
    sb = make_sandbox(ExecutorSettings(backend="bwrap", max_work_mb=321), work_root=tmp_path / "w")
    assert sb.name == "bwrap" and sb.max_work_mb == 321 and sb.work_root == tmp_path / "w"
    with pytest.raises(FileNotFoundError, match="/nonexistent/venv"):
        make_sandbox(ExecutorSettings(backend="bwrap", sandbox_python="/nonexistent/venv/bin/python"))
