"""Per-run cgroups (v1 or v2): memory, pids and cpu limits, the OOM-kill count, and kill-everything.

The bwrap backend puts each sandbox in its own group under this process's own cgroup. Where no
controller is writable (an unprivileged container, a v2 tree without delegation), `RunCgroup.create`
returns None and the sandbox relies on rlimits (RLIMIT_AS/NPROC) alone.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

_V1_CONTROLLERS = ("memory", "pids", "cpu")


def _mounts() -> tuple[dict[str, Path], Path | None]:
    """(v1 controller -> mount point, v2 mount point or None) from /proc/self/mountinfo."""
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype, mount_point, options = rfields[0], Path(fields[4]), rfields[2].split(",")
        if fstype == "cgroup2" and v2 is None:
            v2 = mount_point
        elif fstype == "cgroup":
            for c in _V1_CONTROLLERS:
                if c in options:
                    v1.setdefault(c, mount_point)
    return v1, v2


def _own_paths() -> tuple[dict[str, str], str | None]:
    """This process's cgroup path per v1 controller, and its v2 path."""
    v1: dict[str, str] = {}
    v2: str | None = None
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            v2 = path
        for c in controllers.split(","):
            if c in _V1_CONTROLLERS:
                v1[c] = path
    return v1, v2


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


@dataclass
class RunCgroup:
    """The cgroup(s) of one sandbox run. `dirs` maps a controller (or "unified") to its directory."""

    version: int
    dirs: dict[str, Path]
    controls: set[str] = field(default_factory=set)  # limits that are really enforced

    @classmethod
    def create(cls, name: str, memory_mb: int, max_procs: int, cpus: float) -> RunCgroup | None:
        """Make and configure a group named `name`; None when this machine lets us have none."""
        try:
            v1_mounts, v2_mount = _mounts()
            v1_own, v2_own = _own_paths()
        except OSError:
            return None
        if v1_mounts:
            return cls._create_v1(name, v1_mounts, v1_own, memory_mb, max_procs, cpus)
        if v2_mount is not None and v2_own is not None:
            return cls._create_v2(name, v2_mount / v2_own.lstrip("/"), memory_mb, max_procs, cpus)
        return None

    @classmethod
    def _create_v1(cls, name, mounts, own, memory_mb, max_procs, cpus) -> RunCgroup | None:
        group = cls(1, {})
        for c, mount in mounts.items():
            d = mount / own.get(c, "/").lstrip("/") / name
            try:
                d.mkdir()
            except OSError:
                continue
            group.dirs[c] = d
            try:
                if c == "memory":
                    _write(d / "memory.limit_in_bytes", str(memory_mb << 20))
                    if (d / "memory.memsw.limit_in_bytes").exists():
                        _write(d / "memory.memsw.limit_in_bytes", str(memory_mb << 20))
                elif c == "pids":
                    _write(d / "pids.max", str(max_procs))
                elif c == "cpu":
                    _write(d / "cpu.cfs_period_us", "100000")
                    _write(d / "cpu.cfs_quota_us", str(max(1000, int(cpus * 100000))))
                group.controls.add(c)
            except OSError as e:
                log.debug("cgroup v1 %s not configurable: %s", c, e)
        if not group.controls:
            group.destroy()
            return None
        return group

    @classmethod
    def _create_v2(cls, name, own_dir: Path, memory_mb, max_procs, cpus) -> RunCgroup | None:
        d = own_dir / name
        try:
            d.mkdir()
        except OSError:
            return None
        group = cls(2, {"unified": d})
        settings = {
            "memory": [("memory.max", str(memory_mb << 20)), ("memory.swap.max", "0")],
            "pids": [("pids.max", str(max_procs))],
            "cpu": [("cpu.max", f"{max(1000, int(cpus * 100000))} 100000")],
        }
        for c, writes in settings.items():
            try:
                for fname, value in writes:
                    if fname == "memory.swap.max" and not (d / fname).exists():
                        continue
                    _write(d / fname, value)
                group.controls.add(c)
            except OSError as e:
                log.debug("cgroup v2 %s not configurable: %s", c, e)
        if not group.controls:
            group.destroy()
            return None
        return group

    @staticmethod
    def reap_stale(prefix: str, pid_alive) -> None:
        """Kill and remove groups named <prefix><pid>_<run> under our own cgroups whose owner pid is dead."""
        try:
            v1_mounts, v2_mount = _mounts()
            v1_own, v2_own = _own_paths()
        except OSError:
            return
        parents = [m / v1_own.get(c, "/").lstrip("/") for c, m in v1_mounts.items()]
        if v2_mount is not None and v2_own is not None:
            parents.append(v2_mount / v2_own.lstrip("/"))
        for parent in parents:
            try:
                entries = [d for d in parent.iterdir() if d.is_dir() and d.name.startswith(prefix)]
            except OSError:
                continue
            for d in entries:
                owner = d.name[len(prefix) :].split("_", 1)[0]
                if owner.isdigit() and not pid_alive(int(owner)):
                    RunCgroup(0, {"stale": d}).destroy()

    def procs_files(self) -> list[Path]:
        """cgroup.procs of each group the run must join (write a pid to each)."""
        return [d / "cgroup.procs" for d in self.dirs.values()]

    def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed in this group."""
        if self.version == 1:
            f = self.dirs.get("memory")
            key, fname = "oom_kill", "memory.oom_control"
        else:
            f = self.dirs.get("unified")
            key, fname = "oom_kill", "memory.events"
        if f is None:
            return 0
        try:
            for line in (f / fname).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
        except OSError:
            pass
        return 0

    def pids(self) -> set[int]:
        out: set[int] = set()
        for p in self.procs_files():
            try:
                out |= {int(x) for x in p.read_text().split()}
            except OSError:
                pass
        return out

    def kill_all(self, deadline_s: float = 5.0) -> bool:
        """SIGKILL every process in the group until it is empty; True when empty."""
        end = time.monotonic() + deadline_s
        kill_file = self.dirs.get("unified", Path("/nonexistent")) / "cgroup.kill"
        while True:
            pids = self.pids()
            if not pids:
                return True
            if kill_file.exists():
                try:
                    _write(kill_file, "1")
                except OSError:
                    pass
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > end:
                return False
            time.sleep(0.01)

    def destroy(self) -> None:
        self.kill_all()
        for d in self.dirs.values():
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.02)  # the last exiting task may still be leaving the group
            else:
                log.warning("could not remove cgroup %s", d)
