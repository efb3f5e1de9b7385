"""Executor CLI.

  python -m mle_jax.executor run --task random-acts-of-pizza --code solution.py [--backend bwrap|docker]
                                 [--timeout S] [--work-mb MB] [--work-files N] [--instrument] [--prepared DIR]
                                 [--docker-url URL] [--results DIR]
      runs one program in a sandbox, grades its submission, prints JSON (status, exit_code, duration_s,
      killed_reason, submission_valid, score, reward, stdout tail); a missing --code or task folder is one
      line on stderr and exit status 2
  python -m mle_jax.executor build-image [--docker-url URL] [--tag T] [--base IMAGE] [--rebuild]
  python -m mle_jax.executor packages     what the sandbox runtime really imports

The docker backend talks to --docker-url, else DOCKER_HOST, else a private Podman service started for
the command.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from mle_jax.executor import registry
from mle_jax.executor.grading import grade_run
from mle_jax.executor.image import ensure_image
from mle_jax.executor.podman import PodmanService
from mle_jax.executor.result import ExecResult, Limits, Status
from mle_jax.executor.runtime import REPO_ROOT, sandbox_packages
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.instrument import instrument
from mle_jax.tasks.prepare import RAW_DATA_DIR, prepare
from mle_jax.tasks.registry import load_task
from mle_jax.tasks.reward import compute_reward
from mle_jax.tasks.task import Task

STDOUT_TAIL_CHARS = 2000


@contextlib.contextmanager
def docker_url(url: str | None):
    """The given socket, DOCKER_HOST, or a private Podman service for the duration."""
    if url or os.environ.get("DOCKER_HOST"):
        yield url or os.environ["DOCKER_HOST"]
        return
    with PodmanService() as started:
        yield started


def _task(task_id: str, prepared: str | None, raw: str) -> Task:
    if prepared:
        return load_task(task_id, prepared)
    out = REPO_ROOT / "data" / "tasks" / task_id / "prepared"
    raw_dir = Path(raw) / task_id if (Path(raw) / task_id).is_dir() else Path(raw)
    return prepare(task_id, raw_dir, out)


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        settings = ExecutorSettings(
            backend=args.backend,
            timeout_s=args.timeout,
            memory_mb=args.memory_mb,
            cpus=args.cpus,
            max_work_mb=args.work_mb,
            max_work_files=args.work_files,
        )
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        code = Path(args.code).read_text()
    except (OSError, UnicodeDecodeError) as e:
        print(f"error: --code {args.code}: {getattr(e, 'strerror', None) or e}", file=sys.stderr)
        return 2
    try:
        task = _task(args.task, args.prepared, args.raw)
    except (OSError, KeyError) as e:  # no such task, no prepared/public folder, no raw data
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    instrumented_path = None
    if args.instrument:
        inst = instrument(code, mode="ast")
        code, instrumented_path = inst.code, inst.path
    with contextlib.ExitStack() as stack:
        if args.backend == "docker":
            settings = dataclasses.replace(settings, docker_url=stack.enter_context(docker_url(args.docker_url)))
        # without --results the run's folders are temporary: gone once it is graded
        sandbox = make_sandbox(settings, out_root=args.results)
        stack.callback(sandbox.close)
        result = sandbox.run(code, task, settings.limits())
        return _report(task, result, instrumented_path, kept=bool(args.results))


def _report(task: Task, result: ExecResult, instrumented_path: str | None, kept: bool) -> int:
    """Grades the run and prints the JSON report."""
    out: dict = {
        "status": str(result.status),
        "exit_code": result.exit_code,
        "duration_s": round(result.duration_s, 3),
        "killed_reason": result.extra.get("killed_reason", ""),
        "disk_reason": result.extra.get("disk_reason", ""),
    }
    if result.status is Status.INFRA:
        out.update(submission_valid=None, score=None, reward=None)
    else:
        g = grade_run(task, result)
        r = compute_reward(g, result.stdout_tail, task.lower_is_better)
        out.update(
            submission_valid=g.valid,
            score=g.score,
            reward=r.total,
            grade_reason=g.reason,
            progress_prints=list(r.prints),
        )
    out.update(
        instrumented=instrumented_path,
        stdout_tail=result.stdout_tail[-STDOUT_TAIL_CHARS:],
        stderr_tail=result.stderr_tail[-STDOUT_TAIL_CHARS:],
        results_dir=result.extra.get("results_dir") if kept else None,
    )
    print(json.dumps(out, indent=2))
    return 0


def _cmd_build_image(args: argparse.Namespace) -> int:
    import docker  # optional dependency

    # the build's steps (debootstrap, the Dockerfile) on stderr: CI's log shows whether an image was built
    logging.basicConfig(level=logging.INFO, format="build-image: %(message)s")
    with docker_url(args.docker_url) as url:
        client = docker.DockerClient(base_url=url)
        image_id = ensure_image(client, args.tag, base=args.base, rebuild=args.rebuild)
    print(json.dumps({"tag": args.tag, "id": image_id}))
    return 0


def _cmd_packages(_args: argparse.Namespace) -> int:
    print(json.dumps(sandbox_packages()))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mle_jax.executor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run one program in a sandbox and grade it")
    run.add_argument("--task", required=True)
    run.add_argument("--code", required=True, help="the program (a .py file)")
    run.add_argument("--backend", choices=registry.names(), default="bwrap")
    run.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit, seconds")
    run.add_argument("--memory-mb", type=int, default=Limits.memory_mb)
    run.add_argument("--cpus", type=int, default=Limits.cpus)
    run.add_argument(
        "--work-mb", type=int, default=ExecutorSettings.max_work_mb, help="cap on the work dir's disk use, MB"
    )
    run.add_argument(
        "--work-files",
        type=int,
        default=ExecutorSettings.max_work_files,
        help="cap on the work dir's files and folders (inodes)",
    )
    run.add_argument("--instrument", action="store_true", help="insert the progress prints (AST) first")
    run.add_argument("--prepared", help="an MLE-bench prepared/ folder (default: prepare from --raw)")
    run.add_argument("--raw", default=str(RAW_DATA_DIR), help="raw data (folder of tasks or of this task)")
    run.add_argument("--docker-url", help="Docker API socket (default: DOCKER_HOST, else a private Podman)")
    run.add_argument(
        "--results", help="keep the run's stdout, stderr and submission copy here (default: removed at exit)"
    )
    run.set_defaults(func=_cmd_run)
    img = sub.add_parser("build-image", help="build (or find cached) the docker backend's image")
    img.add_argument("--docker-url")
    img.add_argument("--tag", default="mle-jax-sandbox:latest")
    img.add_argument(
        "--base", help="base image (default: a debootstrapped bookworm; with Docker Hub: debian:bookworm-slim)"
    )
    img.add_argument("--rebuild", action="store_true")
    img.set_defaults(func=_cmd_build_image)
    pk = sub.add_parser("packages", help="the paper's packages that import in the sandbox runtime")
    pk.set_defaults(func=_cmd_packages)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
