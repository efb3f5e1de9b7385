"""Plans of one config over several targets, as rows (`python -m mle_jax.plan --targets=... --table_out=F`), and
the markdown table of such files (`python -m mle_jax.planner.table F... [--doc BUILD.md] [--name NAME]` writes it
between the doc's `<!-- table:NAME -->` and `<!-- /table:NAME -->` markers, NAME by default the first file's stem).

    python -m mle_jax.plan --config=configs/pizza.py --targets=v4-8 --until_fits --nodecode \\
        --table_out=docs/results/tpu_plans_v4.json
    python -m mle_jax.planner.table docs/results/tpu_plans_v4.json [more files] --name tpu_plans --doc BUILD.md
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from mle_jax.planner.errors import PlanError
from mle_jax.planner.plan import make_plan
from mle_jax.planner.targets import GPU_TARGETS, TpuSlice, make_target, tpu_slice
from mle_jax.reporting.plan_markdown import markdown, merge, replace_between_markers
from mle_jax.run.settings import RunSettings

MAX_GROWTH = 4  # --until_fits: at most this many larger slices per entry (each is a full compile)


def plan_targets(
    base: RunSettings,
    entries: Sequence[str],
    num_slices: int = 1,
    *,
    until_fits: bool = False,
    mfu: float = 0.4,
    decode: bool = True,
    update: bool = True,
    overrides: Callable[[dict[str, Any]], RunSettings] | None = None,
) -> dict[str, Any]:
    """Plan `base` on each entry (a TPU slice such as v4-8 or v5e:2x4, or GPU:count such as a100-40:8) in this
    process. until_fits: a TPU slice whose plan does not fit tries the next size of its generation (at most
    MAX_GROWTH times), and a layout error that names its fix (PlanError.fix) is retried with it, through
    `overrides` (the fix's config overrides -> settings). One row per plan or error."""
    rows: list[dict[str, Any]] = []
    for entry in entries:
        applied: dict[str, Any] = {}
        s = base
        gpu, _, count = entry.partition(":")
        sl: TpuSlice | None = None if gpu in GPU_TARGETS else tpu_slice(entry)
        for _ in range(2 * MAX_GROWTH + 2):
            name = f"{gpu}:{count}" if sl is None else sl.topology
            try:
                if sl is None:
                    if not count.isdigit():
                        raise PlanError(f"--targets entry {entry}: a GPU entry is MODEL:COUNT, e.g. a100-40:8")
                    target = make_target(gpu, "", int(count), num_slices)
                else:
                    target = make_target("cpu", sl.topology, 0, num_slices)
                plan = make_plan(s, target, target.memory_gib, mfu, decode=decode, update=update)
            except PlanError as e:
                rows.append({"entry": entry, "target": name, "error": str(e), "overrides": dict(applied)})
                if until_fits and e.fix and overrides and not set(e.fix.items()) <= set(applied.items()):
                    applied |= e.fix
                    s = overrides(applied)
                    continue
                break
            rows.append(row(entry, sl, plan, applied))
            print(format_row(rows[-1]), file=sys.stderr, flush=True)
            jax.clear_caches()  # the compiled update of a 3B model is GBs of host memory: one at a time
            gc.collect()
            _malloc_trim()
            if not until_fits or sl is None or plan["fits"] is not False:
                break
            grown = sl.larger()
            if grown is None or sum(r["entry"] == entry for r in rows) > MAX_GROWTH:
                break
            sl = grown
    return {"mfu": mfu, "num_slices": num_slices, "rows": rows}


def _malloc_trim() -> None:
    """Hand freed heap back to the system (libtpu's compiles leave GBs in glibc's arenas otherwise)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc


def row(entry: str, sl: TpuSlice | None, plan: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The table's columns of one plan (the plan itself rides along under "plan")."""
    d = plan["per_device"]
    return {
        "entry": entry,
        "target": plan["target"],
        "topology": sl.topology if sl else None,
        "generation": sl.generation if sl else None,
        "chips": plan["devices"],
        "slices": plan["slices"],
        "device_kind": plan["device_kind"],
        "mesh": plan["mesh"],
        "overrides": dict(overrides),
        "learner_gib": d["learner_gib"] if plan["update_compiled"] else None,
        "sampler_gib": d["sampler_gib"],
        "total_gib": d["total_gib"] if plan["update_compiled"] else None,
        "device_memory_gib": d["device_memory_gib"],
        "fits": plan["fits"],
        "flops_per_step": plan["flops_per_step"],
        "projected_step_s": plan["projected_step_s"],
        "peak_tflops_per_device": plan["peak_tflops_per_device"],
        "dcn_gib_per_device_per_step": (plan["dcn"] or {}).get("gib_per_device_per_step"),
        "compile_error": d["xla"].get("compile_error"),
        "plan": {k: v for k, v in plan.items() if k != "layer_stack"},
    }


def format_row(r: dict[str, Any]) -> str:
    """One line per row for the terminal."""
    if "error" in r:
        return f"{r['target']:>14}: error: {r['error']}"
    fit = {True: "fits", False: "does not fit", None: "update not compiled"}[r["fits"]]
    mem = f"{r['total_gib']:.2f}" if r["total_gib"] is not None else "-"
    step = f"{r['projected_step_s']:.1f} s" if r["projected_step_s"] else "-"
    over = " ".join(f"--config.{k}={v}" for k, v in r["overrides"].items())
    return (
        f"{r['target']:>14}: {r['chips']} x {r['device_kind']}, mesh {r['mesh']}, {mem} of "
        f"{r['device_memory_gib']:.0f} GiB per chip: {fit}; {r['flops_per_step']:.3e} FLOPs, step {step} {over}"
    ).rstrip()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m mle_jax.planner.table", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="--table_out files of mle_jax.plan, rows in order")
    parser.add_argument("--doc", type=Path, help="write the table between this doc's markers (else print it)")
    parser.add_argument("--name", help="the markers' NAME (default: the first file's stem)")
    args = parser.parse_args(argv)
    name = args.name or args.results[0].stem
    try:
        table = markdown(merge([json.loads(f.read_text()) for f in args.results]))
        if args.doc is None:
            print(table)
            return 0
        args.doc.write_text(replace_between_markers(args.doc.read_text(), name, table))
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote the {name} table into {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
