"""Verify a task's whole warm-start grid (or a balanced sample of it) in the real sandbox on the real data.

    PYTHONPATH=. .venv/bin/python bench/corpus_grid.py --task leaf-classification [--limit N] [--workers 2]
        [--cache runs/corpus-grid] [--timeout 120] [--budget-s S]

Without --task (as `make bench` runs it): a balanced sample of --limit (default 16) programs of every task's grid;
with --task: that task's whole grid unless --limit is given.

Every program runs as the warm start runs it (instrumented with the AST progress prints, bwrap, the task's
grader). Prints, per model family: programs, valid, score range and median, run time mean and max; and the
reason of every invalid one. Results are cached per program (JSONL keyed by the code's sha256 under --cache),
so an interrupted run resumes where it stopped and a rerun of the same grid prints at once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from mle_jax.executor.result import Limits
from mle_jax.executor.runtime import sandbox_packages
from mle_jax.executor.sandbox import make_sandbox
from mle_jax.executor.settings import ExecutorSettings
from mle_jax.tasks.prepare import RAW_DATA_DIR, prepare
from mle_jax.warmstart.corpus import sandbox_run_fn
from mle_jax.warmstart.programs import full_grid, generate_corpus, registered_tasks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--task", choices=registered_tasks(), help="default: a sample of every task's grid")
    ap.add_argument("--limit", type=int, default=None, help="a balanced sample of this many programs (0: the grid)")
    ap.add_argument("--family", default="", help="only this model family of the grid (with --task)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--cache", default="runs/corpus-grid")
    ap.add_argument("--budget-s", type=float, default=0, help="start no program after this many seconds (0: none)")
    args = ap.parse_args()
    if args.task:
        check_grid(args.task, args.limit or 0, args)
    else:
        for task_id in registered_tasks():
            check_grid(task_id, 16 if args.limit is None else args.limit, args)


def check_grid(task_id: str, limit: int, args: argparse.Namespace) -> None:
    """Run `limit` programs of the task's grid (0: all of them) and print the per-family table."""
    packages = sandbox_packages()
    grid = full_grid(task_id, packages)
    items = generate_corpus(task_id, limit, args.seed, packages) if limit else grid
    if args.family:
        grid = items = [it for it in grid if it.meta["model"] == args.family]
    task = prepare(task_id, RAW_DATA_DIR / task_id, Path(tempfile.mkdtemp()) / task_id / "prepared")
    limits = Limits(timeout_s=args.timeout, memory_mb=4096, cpus=1, max_procs=64, max_file_mb=256)
    run_fn = sandbox_run_fn(make_sandbox(ExecutorSettings(backend="bwrap")), task, limits)

    cache_path = Path(args.cache) / f"{task_id}.jsonl"
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    seen = {}
    if cache_path.is_file():
        seen = {r["sha256"]: r for r in map(json.loads, cache_path.read_text().splitlines()) if r}
    sha = {id(it): hashlib.sha256(it.code.encode()).hexdigest() for it in items}
    todo = [it for it in items if sha[id(it)] not in seen]
    print(f"{task_id}: grid {len(grid)} programs, checking {len(items)} ({len(todo)} not cached)", flush=True)
    lock = threading.Lock()
    t0 = time.monotonic()

    def one(it):
        g, duration, _ = run_fn(it.code)
        return {
            "sha256": sha[id(it)],
            "model": it.meta["model"],
            "features": it.meta["features"],
            "hparams": str(it.meta["hparams"]),
            "valid": bool(g.valid),
            "score": g.score,
            "duration_s": round(duration, 2),
            "reason": "" if g.valid else g.reason[-300:],
        }

    def budgeted(it):  # past the budget a queued program is skipped, so the run ends soon and resumes later
        if args.budget_s and time.monotonic() - t0 > args.budget_s:
            return None
        return one(it)

    with cache_path.open("a") as f, ThreadPoolExecutor(args.workers) as pool:
        futures = [pool.submit(budgeted, it) for it in todo]
        for done, fut in enumerate(as_completed(futures), 1):
            rec = fut.result()
            if rec is None:
                continue
            with lock:
                seen[rec["sha256"]] = rec
                f.write(json.dumps(rec) + "\n")
                f.flush()
            if done % 20 == 0 or done == len(todo):
                print(f"  {done}/{len(todo)} run, {time.monotonic() - t0:.0f} s", flush=True)
    missing = [it for it in items if sha[id(it)] not in seen]
    if missing:
        print(f"budget spent: {len(missing)} programs not run yet; run the same command again to go on")
        return

    records = [seen[sha[id(it)]] for it in items]
    families: dict[str, list[dict]] = {}
    for r in records:
        families.setdefault(r["model"], []).append(r)
    print("| family | programs | valid | score min / median / max | run s mean / max |")
    print("|---|---|---|---|---|")
    for fam, rs in [*sorted(families.items()), ("all", records)]:
        scores = [r["score"] for r in rs if r["valid"]]
        durations = [r["duration_s"] for r in rs]
        score_txt = f"{min(scores):.4f} / {statistics.median(scores):.4f} / {max(scores):.4f}" if scores else "-"
        print(
            f"| {fam} | {len(rs)} | {len(scores)} | {score_txt} | "
            f"{statistics.mean(durations):.1f} / {max(durations):.1f} |"
        )
    for r in records:
        if not r["valid"]:
            print(f"INVALID {r['model']} {r['features']} {r['hparams']}: {r['reason'][-200:]}")


if __name__ == "__main__":
    main()
