"""Sandbox start overhead: `python -c pass` in a bwrap / Docker (Podman) sandbox vs the bare interpreter.

  .venv/bin/python bench/sandbox_overhead.py [--runs 20] [--docker-runs 10] [--no-docker]

Wall time per run as the caller sees it (sandbox setup, program, teardown, copy-out), and Δt (the
program's own time as the executor reports it). Prints the ratio against bare in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mle_jax.executor.podman import PodmanService  # noqa: E402
from mle_jax.executor.result import Limits  # noqa: E402
from mle_jax.executor.runtime import check_venv, default_venv  # noqa: E402
from mle_jax.executor.sandbox import make_sandbox  # noqa: E402
from mle_jax.executor.settings import ExecutorSettings  # noqa: E402
from mle_jax.tasks.task import Task, TaskSpec  # noqa: E402

LIMITS = Limits(timeout_s=60, memory_mb=1024, cpus=1, max_procs=64, max_file_mb=64, max_output_bytes=4096)


def _task(root: Path) -> Task:
    public = root / "public"
    public.mkdir()
    (public / "sample_submission.csv").write_text("id,y\n")
    spec = TaskSpec(
        id="bench",
        metric="auc",
        lower_is_better=False,
        statement="",
        id_column="id",
        target_columns=("y",),
        data_files=(),
    )
    return Task(spec=spec, public_dir=public, private_dir=root / "private")


def _bare(runs: int) -> list[float]:
    py = str(check_venv(default_venv()))
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([py, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t)
    return times


def _sandboxed(sandbox, task: Task, runs: int) -> tuple[list[float], list[float]]:
    walls, deltas = [], []
    sandbox.run("pass", task, LIMITS)  # warm-up (page cache, image)
    for _ in range(runs):
        t = time.perf_counter()
        r = sandbox.run("pass", task, LIMITS)
        walls.append(time.perf_counter() - t)
        deltas.append(r.duration_s)
        assert r.status == "ok", (r.status, r.stderr_tail)
    return walls, deltas


def _row(name: str, walls: list[float], bare: float, deltas: list[float] | None = None) -> None:
    med = statistics.median(walls)
    dt = f"  Δt median {statistics.median(deltas) * 1e3:7.1f} ms" if deltas else ""
    print(
        f"{name:8s} wall median {med * 1e3:7.1f} ms  mean {statistics.mean(walls) * 1e3:7.1f} ms  "
        f"x{med / bare:5.2f} vs bare{dt}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--docker-runs", type=int, default=10)
    p.add_argument("--no-docker", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="mle_jax_bench_") as tmp:
        root = Path(tmp)
        task = _task(root)
        _bare(2)
        bare_times = _bare(args.runs)
        bare = statistics.median(bare_times)
        _row("bare", bare_times, bare)
        bw = make_sandbox(ExecutorSettings(backend="bwrap"), work_root=root / "w", out_root=root / "r")
        walls, deltas = _sandboxed(bw, task, args.runs)
        _row("bwrap", walls, bare, deltas)
        if not args.no_docker:
            with PodmanService() as url:
                settings = ExecutorSettings(backend="docker", docker_url=url)
                dk = make_sandbox(settings, work_root=root / "dw", out_root=root / "dr")
                walls, deltas = _sandboxed(dk, task, args.docker_runs)
                _row("docker", walls, bare, deltas)


if __name__ == "__main__":
    main()
