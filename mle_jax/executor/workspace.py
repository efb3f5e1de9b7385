"""The host side of one run: a fresh work dir (the sandbox's cwd), a results dir, and safe copy-out.

The work dir is writable by the sandbox and therefore untrusted after the run: the submission is copied
out only if it is a regular file (not a symlink, FIFO or device) under a size cap, and the whole dir is
deleted afterwards. A watchdog bounds the dir's total disk use and its number of entries (inodes) while the
program runs (RLIMIT_FSIZE bounds each file only).
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mle_jax.executor.capture import BoundedCapture
from mle_jax.executor.result import ExecResult, Limits, classify, signal_name
from mle_jax.executor.settings import MAX_WORK_ENTRIES
from mle_jax.tasks.graders.reading import size_cap
from mle_jax.tasks.task import Task

log = logging.getLogger(__name__)

SUBMISSION_NAME = "submission.csv"
CODE_NAME = "solution.py"


@dataclass(frozen=True)
class Workspace:
    run_id: str
    work_dir: Path  # bound read-write as the sandbox's cwd; holds solution.py
    out_dir: Path  # outside the sandbox: stdout.txt, stderr.txt, submission.csv


@dataclass(frozen=True)
class RunRoots:
    """Where one sandbox keeps its runs: work dirs and results. `temporary` is the folder it made for the roots the
    caller did not name, removed (with every run's leftovers in it) when the sandbox closes; a named root stays."""

    work: Path
    out: Path
    temporary: Path | None

    def remove_temporary(self) -> None:
        """Remove the folder made for the unnamed roots (runs still in flight when a fleet stopped leave their
        results there); named roots stay. Idempotent; call it when no run is in progress."""
        if self.temporary is not None:
            try:
                remove_tree(self.temporary)
            except OSError as e:
                log.warning("could not remove the sandbox's temporary root: %s", e)


def run_roots(prefix: str, work_root: str | Path | None, out_root: str | Path | None) -> RunRoots:
    """The named roots, the others in a folder of this sandbox alone under $TMPDIR: <prefix>_<pid>_<token> (the pid
    first: an executor that starts reaps the folders of dead ones by it)."""
    base = Path(os.environ.get("TMPDIR", "/tmp")) / f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    work = Path(work_root) if work_root else base / "work"
    out = Path(out_root) if out_root else base / "results"
    return RunRoots(work, out, None if work_root and out_root else base)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_dead_roots(prefix: str) -> None:
    """Remove the `run_roots` folders under $TMPDIR of executors that died without closing (a killed Ray actor, a
    launch stopped by SIGKILL): work dirs and results alike, nobody reads them any more. Best effort."""
    for d in Path(os.environ.get("TMPDIR", "/tmp")).glob(f"{prefix}_*"):
        owner = root_owner(d, prefix)
        if owner is not None and not pid_alive(owner):
            try:
                remove_tree(d)
            except OSError as e:  # not ours to remove (another user's), or going under another executor's reaper
                log.debug("leaving %s: %s", d, e)


def root_owner(folder: Path, prefix: str) -> int | None:
    """The pid that made a `run_roots` folder (<prefix>_<pid>_<token>, or <prefix>_<pid> as older executors named
    it), or None when the name is not one."""
    owner = folder.name[len(prefix) + 1 :].split("_", 1)[0] if folder.name.startswith(prefix + "_") else ""
    return int(owner) if owner.isdigit() else None


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


@dataclass(frozen=True)
class DiskUsage:
    bytes: int  # allocated (st_blocks), symlinks not followed; a lower bound when the walk stopped early
    entries: int  # entries seen; the walk stops at max_entries + 1, so more than max_entries means "over"
    too_deep: bool = False  # the walk stopped: its folders nest in a way that would make measuring them too costly


# Paths are opened a piece of at most this many characters at a time, each relative to the piece before: a tree
# nested past PATH_MAX (4096) would otherwise hide its deeper files from the count.
_PATH_PIECE = 3072
# The walk opens each folder relative to its parent's fd (one path component: a tree of any depth costs what its
# entries cost), holding at most this many parents' fds at once; past that a folder is opened by its path, which
# costs its depth. The walk's cost (path components resolved) is bounded by the entries' (x _COST_PER_ENTRY).
_HELD_FDS = 64
_COST_PER_ENTRY = 4


def _open_dir(path: str) -> int:
    """An fd of the directory at path (not a symlink), however long the path."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    if len(path) < _PATH_PIECE:
        return os.open(path, flags)
    fd: int | None = None
    rest = path
    try:
        while rest:
            if len(rest) < _PATH_PIECE:
                piece, rest = rest, ""
            else:
                cut = rest.rindex("/", 1, _PATH_PIECE)  # names are at most 255 characters: a "/" is in reach
                piece, rest = rest[:cut], rest[cut + 1 :]
            opened = os.open(piece, flags, dir_fd=fd)
            if fd is not None:
                os.close(fd)
            fd = opened
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    assert fd is not None
    return fd


class _Parent:
    """An open folder whose subfolders wait on the walk's stack: its fd closes once the last of them is opened."""

    def __init__(self, fd: int, pending: int):
        self.fd, self.pending = fd, pending

    def opened_one(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            os.close(self.fd)


def disk_usage(root: Path, max_entries: int = MAX_WORK_ENTRIES) -> DiskUsage:
    """What the tree under root uses, however deep. The walk is bounded (a poll must stay cheap whatever the program
    makes): it stops after max_entries + 1 entries, which then count as too many rather than as not counted at all,
    and when resolving paths would cost more than its entries allow (`too_deep`: a comb of folders thousands deep)."""
    total, seen, cost, held = 0, 0, 0, 0
    budget = _COST_PER_ENTRY * (max_entries + 1)
    # (parent holding an fd, or None: open by path; name below it; the folder's path; its depth)
    stack: list[tuple[_Parent | None, str, str, int]] = [(None, "", str(root), 0)]
    try:
        while stack and seen <= max_entries:
            parent, name, path, depth = stack.pop()
            try:
                if parent is not None:
                    cost += 1
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent.fd)
                else:
                    cost += depth + 1
                    if cost > budget:
                        return DiskUsage(total, seen, too_deep=True)
                    fd = _open_dir(path)
            except OSError:
                continue
            finally:
                if parent is not None:
                    parent.opened_one()
                    held -= parent.pending == 0
            subdirs: list[str] = []
            try:
                with os.scandir(fd) as it:
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
                            subdirs.append(e.name)
            except OSError:
                subdirs = []
            if subdirs and held < _HELD_FDS:
                holder: _Parent | None = _Parent(fd, len(subdirs))
                held += 1
            else:
                holder = None
                os.close(fd)
            stack.extend((holder, n, f"{path}/{n}", depth + 1) for n in subdirs)
    finally:
        for parent, *_ in stack:  # the walk stopped early: close what it still held
            if parent is not None and parent.pending > 0:
                parent.pending = 0
                os.close(parent.fd)
    return DiskUsage(total, seen)


class DiskWatchdog:
    """Polls a dir's disk use and calls on_exceed() once when it passes max_bytes or holds more than max_entries
    entries; `reason` then says which. On exit (the program has ended) it measures once more: a program fast enough
    to pass a cap between two polls and exit is over it all the same (`finish_run` then counts it killed for disk)."""

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
        if not self.exceeded:
            self._measure()

    def _measure(self) -> bool:
        """One measurement; True (with `reason` set) when the dir is over a cap."""
        used = disk_usage(self.root, self.max_entries)
        if used.entries > self.max_entries:
            self.reason = f"the work dir holds more than {self.max_entries} files and folders"
        elif used.too_deep:
            self.reason = "the work dir's folders nest too deep to measure"
        elif used.bytes > self.max_bytes:
            self.reason = f"the work dir uses more than {self.max_bytes >> 20} MB"
        self.exceeded = bool(self.reason)
        return self.exceeded

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self._measure():
                self.on_exceed()
                return


def remove_tree(path: Path) -> None:
    """Delete an untrusted tree, however deep: the sandbox may have nested thousands of folders (shutil.rmtree
    recurses in Python and raises RecursionError at ~1,000 levels; paths past PATH_MAX defeat a path-based walk)
    and made parts of it unreadable. GNU rm walks with directory fds, not recursion, and costs ~1 ms a run (on
    200,000 files it is faster than rmtree). Raises OSError when the tree is still there afterwards."""
    if not os.path.lexists(path):
        return
    rm = ["rm", "-rf", "--one-file-system", "--", str(path)]
    done = subprocess.run(rm, capture_output=True, text=True)
    if done.returncode != 0 and os.path.lexists(path):
        # not root: folders the program made unreadable or unwritable (root's rm needs no permissions)
        subprocess.run(["chmod", "-R", "--", "u+rwx", str(path)], capture_output=True)
        done = subprocess.run(rm, capture_output=True, text=True)
    if os.path.lexists(path):
        raise OSError(f"could not remove {path}: {done.stderr.strip()[-500:]}")


def discard_work_dir(ws: Workspace) -> None:
    """Delete a finished run's work dir. A failure is logged, not raised: the run's result is the program's own
    whatever it left behind (an executor that starts later reaps its dead predecessors' roots)."""
    try:
        remove_tree(ws.work_dir)
    except OSError as e:
        log.warning("leaving the work dir of run %s: %s", ws.run_id, e)


MAX_SUBMISSION_BYTES = 256 << 20


def submission_cap(task: Task, limits: Limits) -> int:
    """The largest submission.csv worth copying out: no more than the grader reads for this task (`size_cap`: 64 MB
    for most), nor than the program could write (RLIMIT_FSIZE). Checked on st_size before a byte is copied: a sparse
    file costs the program next to nothing in the sandbox and would cost its size in full here."""
    return min(limits.max_file_mb << 20, MAX_SUBMISSION_BYTES, size_cap(task.answers_path))


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
    max_submission_bytes: int,
) -> ExecResult:
    """The ExecResult of a run that ended, whichever backend ran it: status from how it ended, the
    captured output saved beside the copied-out submission (of at most max_submission_bytes: `submission_cap`), and
    the details every backend reports. Call it once every process of the sandbox is dead: what it copies out is then
    what the program left, the same however late its last writer ran."""
    stdout, stderr = out.text(), err.text()
    killed_reason = killed_reason or ("disk" if watchdog.exceeded else "")  # over a cap when it ended (DiskWatchdog)
    status = classify(exit_code, timed_out, oom, "" if timed_out else killed_reason, stderr)
    (ws.out_dir / "stdout.txt").write_text(stdout)
    (ws.out_dir / "stderr.txt").write_text(stderr)
    submission, why = collect_submission(ws.work_dir, ws.out_dir, max_submission_bytes)
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
