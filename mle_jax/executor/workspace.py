"""The host side of one run: a fresh work dir (the sandbox's cwd), a results dir, and safe copy-out.

The work dir is writable by the sandbox and therefore untrusted after the run: the submission is copied
out only if it is a regular file (not a symlink, FIFO or device) under a size cap, and the whole dir is
deleted afterwards. A watchdog bounds the dir's total disk use and its number of entries (inodes) while the
program runs (RLIMIT_FSIZE bounds each file only).
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mle_jax.executor.capture import BoundedCapture
from mle_jax.executor.result import ExecResult, Limits, classify, signal_name

SUBMISSION_NAME = "submission.csv"
CODE_NAME = "solution.py"


@dataclass(frozen=True)
class Workspace:
    run_id: str
    work_dir: Path  # bound read-write as the sandbox's cwd; holds solution.py
    out_dir: Path  # outside the sandbox: stdout.txt, stderr.txt, submission.csv


def create_workspace(work_root: Path, out_root: Path, code: str, uid: int, gid: int) -> Workspace:
    """A fresh work dir owned by the sandbox's uid (mode 0700) with the program in it, and a results dir."""
    run_id = uuid.uuid4().hex[:12]
    work_root.mkdir(parents=True, exist_ok=True)
    out_root.mkdir(parents=True, exist_ok=True)
    work_dir = work_root / run_id
    work_dir.mkdir(mode=0o700)
    out_dir = out_root / run_id
    out_dir.mkdir()
    (work_dir / CODE_NAME).write_text(code)
    if os.geteuid() == 0:
        os.chown(work_dir, uid, gid)
        os.chown(work_dir / CODE_NAME, uid, gid)
    return Workspace(run_id, work_dir, out_dir)


def collect_submission(work_dir: Path, out_dir: Path, max_bytes: int) -> tuple[Path | None, str]:
    """Copy work_dir/submission.csv to out_dir if it is a regular file of at most max_bytes.

    Returns (path of the copy or None, reason when None).
    """
    src = work_dir / SUBMISSION_NAME
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None, "no submission.csv was written"
    except OSError as e:  # ELOOP: a symlink
        return None, f"submission.csv is not a regular file ({e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "submission.csv is not a regular file"
        if st.st_size > max_bytes:
            return None, f"submission.csv is {st.st_size} bytes, over the {max_bytes} byte cap"
        dst = out_dir / SUBMISSION_NAME
        f_in, fd = os.fdopen(fd, "rb", closefd=True), -1
        with f_in, open(dst, "wb") as f_out:
            remaining = max_bytes + 1
            while remaining > 0:
                chunk = f_in.read(min(1 << 20, remaining))
                if not chunk:
                    break
                f_out.write(chunk)
                remaining -= len(chunk)
        if remaining <= 0:  # grew while we read
            dst.unlink()
            return None, f"submission.csv is over the {max_bytes} byte cap"
        return dst, ""
    finally:
        if fd >= 0:
            os.close(fd)


MAX_WORK_ENTRIES = 200_000  # files, dirs and links a run's work dir may hold (an inode cap: empty files cost too)


@dataclass(frozen=True)
class DiskUsage:
    bytes: int  # allocated (st_blocks), symlinks not followed; a lower bound when the walk stopped early
    entries: int  # entries seen; the walk stops at max_entries + 1, so more than max_entries means "over"


def disk_usage(root: Path, max_entries: int = MAX_WORK_ENTRIES) -> DiskUsage:
    """What the tree under root uses. The walk is bounded (a poll must stay cheap whatever the program makes): it
    stops after max_entries + 1 entries, which then count as too many rather than as not counted at all."""
    total, seen, stack = 0, 0, [root]
    while stack and seen <= max_entries:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    seen += 1
                    if seen > max_entries:
                        break
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(Path(e.path))
        except OSError:
            continue
    return DiskUsage(total, seen)


class DiskWatchdog:
    """Polls a dir's disk use and calls on_exceed() once when it passes max_bytes or holds more than max_entries
    entries; `reason` then says which."""

    def __init__(
        self,
        root: Path,
        max_bytes: int,
        on_exceed: Callable[[], None],
        interval_s: float = 0.25,
        max_entries: int = MAX_WORK_ENTRIES,
    ):
        self.root, self.max_bytes, self.on_exceed, self.interval_s = root, max_bytes, on_exceed, interval_s
        self.max_entries = max_entries
        self.exceeded = False
        self.reason = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-watchdog", daemon=True)

    def __enter__(self) -> DiskWatchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            used = disk_usage(self.root, self.max_entries)
            if used.entries > self.max_entries:
                self.reason = f"the work dir holds more than {self.max_entries} files and folders"
            elif used.bytes > self.max_bytes:
                self.reason = f"the work dir uses more than {self.max_bytes >> 20} MB"
            if self.reason:
                self.exceeded = True
                self.on_exceed()
                return


def remove_tree(path: Path) -> None:
    """Delete an untrusted tree (the sandbox may have made parts of it read-only)."""

    def _fix(func, p, exc):
        if isinstance(exc[1], FileNotFoundError):  # gone already (a concurrent cleaner)
            return
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
        except OSError:
            pass
        func(p)

    if path.exists():
        shutil.rmtree(path, onerror=_fix)


MAX_SUBMISSION_BYTES = 256 << 20


def finish_run(
    ws: Workspace,
    backend: str,
    exit_code: int | None,
    duration_s: float,
    timed_out: bool,
    oom: bool,
    killed_reason: str,
    out: BoundedCapture,
    err: BoundedCapture,
    watchdog: DiskWatchdog,
    limits: Limits,
    extra: dict,
) -> ExecResult:
    """The ExecResult of a run that ended, whichever backend ran it: status from how it ended, the
    captured output saved beside the copied-out submission, and the details every backend reports."""
    stdout, stderr = out.text(), err.text()
    status = classify(exit_code, timed_out, oom, "" if timed_out else killed_reason, stderr)
    (ws.out_dir / "stdout.txt").write_text(stdout)
    (ws.out_dir / "stderr.txt").write_text(stderr)
    submission, why = collect_submission(ws.work_dir, ws.out_dir, min(limits.max_file_mb << 20, MAX_SUBMISSION_BYTES))
    return ExecResult(
        status=status,
        exit_code=exit_code,
        duration_s=duration_s,
        stdout_tail=stdout,
        stderr_tail=stderr,
        submission_path=submission,
        extra={
            "backend": backend,
            "run_id": ws.run_id,
            "results_dir": str(ws.out_dir),
            "signal": signal_name(exit_code),
            "killed_reason": killed_reason,
            "disk_exceeded": watchdog.exceeded,
            "disk_reason": watchdog.reason,
            "submission_reason": why,
            "stdout_bytes": out.total_bytes,
            "stderr_bytes": err.total_bytes,
            **extra,
        },
    )
