"""Whether a run's XLA compiles stop once its shapes have been seen: a fresh launch of CONFIG for --steps RL steps,
and the compiles so far (`process/compiles`), the compile seconds and the resident memory after each step, from
its metrics.jsonl.

    PYTHONPATH=. .venv/bin/python bench/compile_counts.py --config configs/pizza.py:cpu --steps 40 \
        --workdir runs/compiles-cpu --out docs/results/compiles-cpu.json

--reuse reads WORKDIR's finished run instead of launching one (the launch command it records is the one this
script would have run). The summary: the compiles of each step, the last step that compiled anything, and the
steps after it that compiled nothing; the run's plot of its compiles is copied beside --out.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mle_jax.infra.metrics import read_metrics  # noqa: E402
from mle_jax.reporting import provenance  # noqa: E402


def launch_command(config: str, workdir: Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "mle_jax.launch", f"--config={config}", f"--config.workdir={workdir}",
            f"--config.loop.steps={steps}"]  # fmt: skip


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per step: compiles so far, compiles in the step, compile seconds so far, resident GiB; and the last step
    with a compile (None: none logged)."""
    steps = [r["step"] for r in rows]
    total = [r.get("process/compiles") for r in rows]
    new = [t - (total[i - 1] if i else 0) if t is not None else None for i, t in enumerate(total)]
    compiled = [s for s, n in zip(steps, new, strict=True) if n]
    last = compiled[-1] if compiled else None
    return {
        "steps_logged": steps,
        "compiles_by_step": total,
        "new_compiles_by_step": new,
        "compile_s_by_step": [r.get("process/compile_s") for r in rows],
        "rss_gib_by_step": [r.get("process/rss_gib") for r in rows],
        "last_step_with_a_compile": last,
        "steps_without_a_compile_after_it": len([s for s in steps if last is not None and s > last]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/pizza.py:cpu")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--workdir", default="runs/compiles-cpu")
    ap.add_argument("--out", default="docs/results/compiles-cpu.json")
    ap.add_argument("--reuse", action="store_true", help="read WORKDIR's finished run instead of launching one")
    a = ap.parse_args()
    workdir = Path(a.workdir).resolve()
    cmd = launch_command(a.config, workdir, a.steps)
    wall = None
    if not a.reuse:
        shutil.rmtree(workdir, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, check=True)
        wall = round(time.perf_counter() - t0, 1)
    rows = read_metrics(workdir / "metrics.jsonl")
    if not rows:
        raise SystemExit(f"{workdir / 'metrics.jsonl'}: no steps logged")
    plot, copied = workdir / "plots" / "compiles.png", None
    if plot.is_file():  # the run's report plots process/compiles per step
        copied = Path(a.out).with_suffix(".png")
        shutil.copyfile(plot, copied)
    out = {"launch": " ".join(["python", *cmd[1:]]), "config": a.config, "steps": a.steps, "wall_s": wall,
           "plot": str(copied) if copied else None, **summarize(rows)}  # fmt: skip
    provenance.write_json(a.out, out)
    print(
        f"{a.out}: last compile at step {out['last_step_with_a_compile']}, "
        f"then {out['steps_without_a_compile_after_it']} steps without one"
    )


if __name__ == "__main__":
    main()
