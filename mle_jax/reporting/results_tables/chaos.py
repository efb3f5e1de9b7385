"""The chaos run's tables (docs/faults.md): bench/chaos.py's result files, one column per seed."""

from __future__ import annotations

from mle_jax.reporting.markdown import markdown_table
from mle_jax.reporting.results_tables.sources import RESULTS

CHAOS = tuple(f"{RESULTS}/chaos-seed{s}.json" for s in (1, 2))
FAULTS = ("vllm_kill", "ray_worker_kill", "launch_kill_save", "launch_kill_mid_step", "disk_full", "executor_stall")


def _each(xs: list[float] | None) -> str:
    return ", ".join(f"{x:.0f}" for x in xs) if xs else "—"


def render_chaos(*runs: dict) -> str:
    """Per seed: steps finished of those asked, faults injected by kind, samples sampled / trained / discarded with a
    reason / redrawn after a resume / lost / trained twice (from the run's ledger), restarts and checkpoints that
    failed to restore, seconds to recover from each fault (to the run's next finished step: an upper bound of the
    wall time it cost), the fault-free step time, whether the metrics equal a fault-free run's in count and steps."""
    rows = [["steps finished / asked", *(f"{r['steps_finished']} / {r['steps_asked']}" for r in runs)]]
    rows += [[f"faults: `{k}`", *(str(r["faults"].get(k, 0)) for r in runs)] for k in FAULTS]
    for key, label in (("sampled", "sampled"), ("trained", "trained"), ("discarded", "discarded with a reason"),
                       ("redrawn", "redrawn after a resume"), ("lost", "**lost**"),
                       ("trained_twice", "**trained twice**")):  # fmt: skip
        rows.append([f"samples {label}", *(str(r["samples"][key]) for r in runs)])
    rows.append(["run restarts (resumed / refused at start: the disk still full)",
                 *(f"{sum(x['outcome'] == 'resumed' for x in r['restores'])} / "
                   f"{sum(x['outcome'] == 'refused' for x in r['restores'])}" for r in runs)])  # fmt: skip
    rows.append(["**checkpoints that failed to restore**", *(str(r["checkpoints_failed_to_restore"]) for r in runs)])
    rows += [[f"seconds to recover: `{k}`", *(_each(r["recovery_s"].get(k)) for r in runs)] for k in FAULTS]
    rows.append(["median step time (s)", *(f"{r['median_step_s']:.1f}" for r in runs)])
    rows.append(["metrics equal the fault-free run's (rows, steps, keys)",
                 *("yes" if r["equals_fault_free"] else "**no**" for r in runs)])  # fmt: skip
    rows.append(["wall time", *(f"{r['wall_s'] / 60:.0f} min" for r in runs)])
    table = markdown_table(["", *(f"seed {r['seed']}" for r in runs)], rows)
    return table + "".join(f"\n\nSeed {r['seed']}: `{r['command']}` ({r['date'][:16].replace('T', ' ')})" for r in runs)
