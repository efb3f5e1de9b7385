"""Fleet throughput: N short programs through a fleet with 2 slots, local pool vs Ray actors (bwrap).

  .venv/bin/python bench/fleet_throughput.py [--programs 200] [--slots 2] [--no-ray]

Ideal = slots / (wall time of one run on an idle sandbox, measured serially in the same process), i.e.
perfect overlap with no queueing or dispatch cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import as_completed
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sandbox_overhead import LIMITS, _task  # noqa: E402
from mle_jax.executor.fleet import RayFleet, local_fleet  # noqa: E402
from mle_jax.executor.sandbox import make_sandbox  # noqa: E402
from mle_jax.executor.settings import ExecutorSettings  # noqa: E402

PROGRAM = "import sys\nprint('hello', sys.version_info[:2])\n"


def _through(fleet, task, n: int) -> float:
    t = time.perf_counter()
    futures = [fleet.submit(PROGRAM, task, LIMITS) for _ in range(n)]
    statuses = [f.result().status for f in as_completed(futures)]
    elapsed = time.perf_counter() - t
    assert all(s == "ok" for s in statuses), set(statuses)
    return n / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--programs", type=int, default=200)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--no-ray", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="mle_jax_bench_") as tmp:
        root = Path(tmp)
        task = _task(root)
        settings = ExecutorSettings(backend="bwrap", slots=args.slots, ray_actor_cpus=1)
        sb = make_sandbox(settings, work_root=root / "w", out_root=root / "r")
        sb.run(PROGRAM, task, LIMITS)
        single = []
        for _ in range(10):
            t = time.perf_counter()
            sb.run(PROGRAM, task, LIMITS)
            single.append(time.perf_counter() - t)
        ideal = args.slots / statistics.median(single)
        print(
            f"one run alone: {statistics.median(single) * 1e3:.1f} ms -> ideal {ideal:.2f} programs/s "
            f"with {args.slots} slots"
        )
        with local_fleet(settings, work_root=root / "lw", out_root=root / "lr") as fleet:
            local = _through(fleet, task, args.programs)
        print(f"local pool: {local:.2f} programs/s = {local / ideal:.0%} of ideal")
        if not args.no_ray:
            with RayFleet(replace(settings, fleet="ray"), work_root=root / "rw", out_root=root / "ray") as fleet:
                _through(fleet, task, 2 * args.slots)  # actors up and warm
                ray = _through(fleet, task, args.programs)
            print(f"ray fleet:  {ray:.2f} programs/s = {ray / ideal:.0%} of ideal, x{ray / local:.2f} vs local")


if __name__ == "__main__":
    main()
