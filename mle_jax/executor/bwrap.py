"""The bubblewrap sandbox (default backend).

One run, as root on the host (the usual case here):

  sh (join the run's cgroups) -> unshare --net --mount (a fresh netns: loopback exists and is down;
    a private mount ns where root binds the venv, public data and work dir at a staging path the
    unprivileged bwrap can reach) -> prlimit (AS, CPU, FSIZE, NPROC, NOFILE, CORE)
    -> setpriv (a fresh unprivileged uid per run)
    -> bwrap (user/pid/ipc/uts/cgroup namespaces, empty read-only root, sandboxes/bwrap.json binds,
              public data ro, work dir rw, venv ro) -> bash (reports "started", closes our fds)
    -> python solution.py, pid 1 of its pid namespace (--as-pid-1)

The unprivileged uid makes host file permissions apply (no /etc/shadow even unmasked) and makes
RLIMIT_NPROC count this run's processes only. The program is its pid namespace's init, so its exit is the
namespace's end: the kernel kills whatever it left running (daemons, a child waiting to rewrite
submission.csv once it is gone) before the exit is reported, and bwrap reports it only once every process of
the sandbox is dead; with a bwrap init in between, children saw the program gone and wrote for a millisecond
or more before anything killed them (graded or half-written by chance). On a timeout we SIGKILL that init and
everything in the run's cgroup. The submission is copied out after all that. Δt is taken from the "started"
byte to the exit.

Not root: the same without cgroups, setpriv and NPROC, and with bwrap's own --unshare-net (which brings
loopback up inside the empty netns).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from mle_jax.executor.backend import UidPool, data_mount_point, sandbox_env, work_mount
from mle_jax.executor.capture import BoundedCapture, drain_in_thread
from mle_jax.executor.cgroups import RunCgroup
from mle_jax.executor.result import ExecResult, Limits, signal_exit_code
from mle_jax.executor.runtime import REPO_ROOT, VENV_MOUNT, check_venv, venv_of
from mle_jax.executor.settings import MAX_WORK_ENTRIES, ExecutorSettings
from mle_jax.executor.workspace import (
    CODE_NAME,
    DiskWatchdog,
    create_workspace,
    discard_work_dir,
    finish_run,
    pid_alive,
    remove_dead_roots,
    run_roots,
    submission_cap,
)
from mle_jax.tasks.task import Task

log = logging.getLogger(__name__)

PROFILE_PATH = REPO_ROOT / "sandboxes" / "bwrap.json"
_HOST_TOOLS = {"unshare": "util-linux", "prlimit": "util-linux", "setpriv": "util-linux"}
# Mount points root binds the run's dirs on (in the run's private mount ns); its parents must be
# traversable by the sandbox's unprivileged uid, which /tmp is.
STAGE_ROOT = Path("/tmp/mle_jax_stage")
CGROUP_PREFIX = "mle_jax_"
ROOTS_PREFIX = "mle_jax_sandbox"  # the folders of work dirs and results a sandbox makes under $TMPDIR (run_roots)


def reap_stale(stage_root: Path, cgroup_prefix: str) -> None:
    """Remove staging dirs and cgroups left by executors that died mid-run (named <pid>_<run>)."""
    if stage_root.is_dir():
        for d in stage_root.iterdir():
            owner = d.name.split("_", 1)[0]
            if owner.isdigit() and not pid_alive(int(owner)):
                _remove_mount_points(d)
    RunCgroup.reap_stale(cgroup_prefix, pid_alive)


class SandboxSetupError(RuntimeError):
    """The sandbox itself failed to start (an executor failure, not the program's)."""


def _require(tool: str, package: str) -> str:
    path = shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        raise FileNotFoundError(f"{tool} not found: apt-get install {package} (or `make apt`)")
    return path


def load_profile(path: Path = PROFILE_PATH) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"bwrap profile not found at {path}")
    return json.loads(path.read_text())


def profile_args(profile: dict) -> list[str]:
    """bwrap arguments for the host paths of the profile, as they exist on this host."""
    args: list[str] = []
    for p in profile["ro_bind"]:
        args += ["--ro-bind", p, p]
    for p in profile["usr_links"]:
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    for p in profile["mask_files"]:
        if os.path.isfile(p):
            args += ["--ro-bind", "/dev/null", p]
    for p in profile["mask_dirs"]:
        if os.path.isdir(p):
            args += ["--tmpfs", p, "--remount-ro", p]
    return args


class BwrapSandbox:
    """Runs programs under bubblewrap. Thread-safe: a fleet calls run() from several slots at once.

    python: the sandbox venv's interpreter (default .sandbox-venv/bin/python, `make sandbox-env`).
    work_root / out_root: where per-run work dirs (deleted after the run) and results go.
    max_work_mb: cap on the work dir's total disk use (RLIMIT_FSIZE caps each file).
    max_work_files: cap on the work dir's entries (a million empty files fill a disk's inodes).
    use_cgroups: put each run in its own memory/pids/cpu cgroup when this host allows it.
    """

    name = "bwrap"  # its executor.backend (executor/registry.py)

    @classmethod
    def options(cls, settings: ExecutorSettings) -> dict[str, Any]:
        """The constructor options the `executor` config section decides."""
        return {
            "python": settings.sandbox_python or None,
            "max_work_mb": int(settings.max_work_mb),
            "max_work_files": int(settings.max_work_files),
        }

    @classmethod
    def preflight(cls, settings: ExecutorSettings) -> list[str]:
        """What the backend needs that is missing, one line each: bubblewrap and the sandbox venv."""
        problems = []
        if shutil.which("bwrap") is None:
            problems.append("executor.backend=bwrap but bubblewrap is not installed: apt-get install bubblewrap")
        try:
            check_venv(venv_of(settings.sandbox_python))
        except FileNotFoundError as err:
            problems.append(str(err))
        return problems

    def __init__(
        self,
        python: str | Path | None = None,
        work_root: str | Path | None = None,
        out_root: str | Path | None = None,
        max_work_mb: int = 8192,
        max_work_files: int = MAX_WORK_ENTRIES,
        use_cgroups: bool = True,
        keep_work: bool = False,
        bwrap: str = "bwrap",
        profile: str | Path = PROFILE_PATH,
    ):
        self.bwrap = _require(bwrap, "bubblewrap")
        self.root = os.geteuid() == 0
        for tool, package in _HOST_TOOLS.items():
            if self.root or tool == "prlimit":
                _require(tool, package)
        self.venv = venv_of(python)
        check_venv(self.venv)
        self.roots = run_roots(ROOTS_PREFIX, work_root, out_root)
        self.work_root, self.out_root = self.roots.work, self.roots.out
        self.max_work_mb = max_work_mb
        self.max_work_files = max_work_files
        self.use_cgroups = use_cgroups and self.root
        self.keep_work = keep_work
        self.profile_args = profile_args(load_profile(Path(profile)))
        if self.root:
            reap_stale(STAGE_ROOT, CGROUP_PREFIX)
        remove_dead_roots(ROOTS_PREFIX)
        self.uids = UidPool()

    def close(self) -> None:
        """Remove the roots this sandbox made (runs still in flight when a fleet stopped leave their results there);
        roots the caller named stay. Idempotent; call it when no run is in progress."""
        self.roots.remove_temporary()

    # -- command ---------------------------------------------------------------------------------
    def rlimit_args(self, limits: Limits, cgroup_memory: bool) -> list[str]:
        mem = limits.memory_mb << 20
        # With a memory cgroup the kernel enforces RSS; RLIMIT_AS is only a backstop (ML libraries
        # reserve far more address space than they touch).
        address_space = 2 * mem + (1 << 30) if cgroup_memory else mem
        cpu = math.ceil(limits.timeout_s * max(1, limits.cpus)) + 2
        args = [
            f"--as={address_space}",
            f"--cpu={cpu}:{cpu + 5}",
            f"--fsize={limits.max_file_mb << 20}",
            "--nofile=4096",
            "--core=0",
        ]
        if self.root:  # per-run uid: NPROC counts this run's processes (root ignores NPROC)
            args.append(f"--nproc={limits.max_procs}")
        return ["prlimit", *args, "--"]

    def command(
        self,
        task: Task,
        limits: Limits,
        uid: int,
        cgroup: RunCgroup | None,
        sources: dict[str, Path],
        stage: Path | None,
        status_fd: int,
        started_fd: int,
    ) -> list[str]:
        """The whole launch chain. sources: host dirs "venv", "public", "work"; stage: where root binds them
        (in a private mount namespace) so that the unprivileged bwrap can reach them whatever the
        permissions of their parent dirs."""
        cmd: list[str] = []
        if cgroup is not None:
            joins = " && ".join(f"echo $$ > {shlex.quote(str(p))}" for p in cgroup.procs_files())
            cmd += ["/bin/sh", "-c", f'{joins} && exec "$@"', "sh"]
        if self.root:
            cmd += ["unshare", "--net", "--mount", "--propagation", "private", "--"]
            binds: list[str] = []
            for name in ("venv", "public", "work"):
                binds += [str(sources[name]), str(stage / name)]
            script = (
                'mount --bind "$1" "$2" && mount --bind "$3" "$4" && mount --bind "$5" "$6" && shift 6 && exec "$@"'
            )
            cmd += ["/bin/sh", "-c", script, "sh", *binds]
            sources = {name: stage / name for name in sources}
        cmd += self.rlimit_args(limits, cgroup is not None and "memory" in cgroup.controls)
        if self.root:
            cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
        work = work_mount(task.id)
        tmp_mb = max(64, min(limits.memory_mb // 2, self.max_work_mb))
        shm_mb = max(64, limits.memory_mb // 4)
        cmd += [
            self.bwrap,
            "--unshare-user",
            "--unshare-pid",
            "--as-pid-1",  # the program is the namespace's init: nothing of it outlives its exit (module docstring)
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            *([] if self.root else ["--unshare-net"]),
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--clearenv",
        ]
        for k, v in sandbox_env(task.id, limits, VENV_MOUNT).items():
            cmd += ["--setenv", k, v]
        cmd += [
            *self.profile_args,
            "--dev",
            "/dev",
            "--size",
            str(shm_mb << 20),
            "--tmpfs",
            "/dev/shm",
            "--proc",
            "/proc",
            "--size",
            str(tmp_mb << 20),
            "--tmpfs",
            "/tmp",
            "--ro-bind",
            str(sources["venv"]),
            VENV_MOUNT,
            "--ro-bind",
            str(sources["public"]),
            data_mount_point(task.id),
            "--bind",
            str(sources["work"]),
            work,
            "--remount-ro",
            "/",
            "--chdir",
            work,
            "--json-status-fd",
            str(status_fd),
            # Inside, after all setup: say "started" (this also times Δt), close our fds, become the program.
            "--",
            "/bin/bash",
            "-c",
            f'printf . >&{started_fd}; exec {started_fd}>&- {status_fd}>&-; exec "$@"',
            "bash",
            f"{VENV_MOUNT}/bin/python",
            CODE_NAME,
        ]
        return cmd

    # -- run -------------------------------------------------------------------------------------
    def run(self, code: str, task: Task, limits: Limits) -> ExecResult:
        public = Path(task.public_dir).resolve()
        if not public.is_dir():
            raise FileNotFoundError(f"task {task.id}: public dir {public} does not exist")
        uid = self.uids.acquire()
        ws = create_workspace(self.work_root, self.out_root, code, uid, uid)
        stage = None
        if self.root:
            stage = STAGE_ROOT / f"{os.getpid()}_{ws.run_id}"
            STAGE_ROOT.mkdir(mode=0o711, exist_ok=True)
            for name in ("venv", "public", "work"):
                (stage / name).mkdir(parents=True)
            stage.chmod(0o755)
        cgroup = None
        if self.use_cgroups:
            name = f"{CGROUP_PREFIX}{os.getpid()}_{ws.run_id}"
            cgroup = RunCgroup.create(name, limits.memory_mb, limits.max_procs, limits.cpus)
        try:
            sources = {"venv": self.venv.resolve(), "public": public, "work": ws.work_dir}
            return self._run(ws, task, limits, uid, cgroup, sources, stage)
        finally:
            if cgroup is not None:
                cgroup.destroy()
            if stage is not None:
                _remove_mount_points(stage)
            if not self.keep_work:
                discard_work_dir(ws)
            self.uids.release(uid)

    def _run(self, ws, task: Task, limits: Limits, uid: int, cgroup: RunCgroup | None, sources, stage):
        status_r, status_w = os.pipe()
        started_r, started_w = os.pipe()
        cmd = self.command(task, limits, uid, cgroup, sources, stage, status_w, started_w)
        out, err = BoundedCapture(limits.max_output_bytes), BoundedCapture(limits.max_output_bytes)
        events: dict[str, float | int] = {}
        killed_reason = ""
        lock = threading.Lock()

        t_start = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(status_w, started_w),
                start_new_session=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
        except BaseException:
            for fd in (status_r, started_r):
                os.close(fd)
            raise
        finally:
            os.close(status_w)
            os.close(started_w)

        def kill(reason: str) -> None:
            # Kill the sandbox's init (pid 1 of its pid namespace): the kernel then kills everything in
            # the namespace and the outer bwrap reaps it and exits. Killing the outer bwrap first would
            # orphan that init to the host's pid 1, which may never reap it (a zombie per timeout).
            # While the outer bwrap lives, its child's pid cannot be reused, so this cannot hit a stranger.
            nonlocal killed_reason
            with lock:
                killed_reason = killed_reason or reason
            child = events.get("child-pid")
            try:
                if child is not None and proc.poll() is None:
                    os.kill(int(child), signal.SIGKILL)
                else:
                    os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        threads = [
            threading.Thread(target=_read_status, args=(status_r, events), daemon=True),
            threading.Thread(target=_read_started, args=(started_r, events), daemon=True),
        ]
        for t in threads:
            t.start()
        threads += [drain_in_thread(proc.stdout, out, "stdout"), drain_in_thread(proc.stderr, err, "stderr")]
        timed_out = False
        with DiskWatchdog(
            ws.work_dir, self.max_work_mb << 20, lambda: kill("disk"), max_entries=self.max_work_files
        ) as watchdog:
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                stopped = _stopped_state(events.get("child-pid"))
                kill(f"timeout: the program was {stopped} when its time ran out" if stopped else "timeout")
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # the outer bwrap did not follow its child: take it all down
                os.killpg(proc.pid, signal.SIGKILL)
                if cgroup is not None:
                    cgroup.kill_all()
                proc.wait()
        t_end = time.monotonic()
        # The program is gone; anything it left behind (there should be nothing: the pid namespace died
        # with it) goes too, so the pipes reach EOF.
        if cgroup is not None:
            cgroup.kill_all()
        for t in threads:
            t.join(timeout=10)

        if "started_t" not in events:
            # the sandbox never reached the program: an executor failure, not the agent's
            raise SandboxSetupError(f"sandbox did not start (exit {proc.returncode}): {err.text()[-2000:]}")
        raw_exit = events.get("exit-code")
        exit_code = signal_exit_code(int(raw_exit)) if raw_exit is not None else proc.returncode
        if timed_out or killed_reason:
            exit_code = -signal.SIGKILL  # we killed it (bwrap may or may not have reported the child)
        oom = cgroup is not None and cgroup.oom_kills() > 0
        t_program = float(events["started_t"])
        details = {
            "sandbox_start_s": t_program - t_start,
            "wall_s": t_end - t_start,
            "cgroup": sorted(cgroup.controls) if cgroup is not None else [],
            "uid": uid if self.root else os.getuid(),
        }
        return finish_run(
            ws,
            self.name,
            exit_code,
            # the reader thread notes the start byte when it is scheduled: on a loaded machine that can be after
            # a short program has already ended, so the difference can come out slightly negative
            max(0.0, t_end - t_program),
            timed_out,
            oom,
            killed_reason,
            out,
            err,
            watchdog,
            limits,
            details,
            max_submission_bytes=submission_cap(task, limits),
        )


def _remove_mount_points(stage: Path) -> None:
    """rmdir (never rm -r: were a bind still visible here, that would delete the data) the staging dirs."""
    for d in (*(stage / n for n in ("venv", "public", "work")), stage):
        try:
            d.rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("could not remove staging dir %s: %s", d, e)


def _stopped_state(pid: int | None) -> str:
    """ "in tracing stop (traced by host pid N)" or "stopped" when the process is (a child of the program can
    ptrace-stop it: it then never ends, and the timeout says why), else ""."""
    if pid is None:
        return ""
    try:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{int(pid)}/status").read_text().splitlines() if ":" in line
        )
    except OSError:
        return ""
    state, tracer = status.get("State", "").strip(), status.get("TracerPid", "0").strip()
    if state.startswith("t"):
        return f"in tracing stop (traced by host pid {tracer})"
    if state.startswith("T"):
        return f"stopped (traced by host pid {tracer})" if tracer != "0" else "stopped"
    return ""


def _read_started(fd: int, events: dict) -> None:
    """One byte arrives when the sandbox is set up and about to exec the program."""
    with os.fdopen(fd, "rb", buffering=0) as f:
        if f.read(1):
            events["started_t"] = time.monotonic()


_STATUS_RE = re.compile(rb'"(child-pid|exit-code)"\s*:\s*(-?\d+)')


def _read_status(fd: int, events: dict) -> None:
    """bwrap's --json-status-fd: note when the program started and its exit code."""
    buf = b""
    with os.fdopen(fd, "rb", buffering=0) as f:
        while True:
            chunk = f.read(4096)
            if not chunk:
                return
            buf += chunk
            for key, value in _STATUS_RE.findall(buf):
                events.setdefault(key.decode(), int(value))
            buf = buf[-256:]
