"""The markdown of planner tables: the rows of `python -m mle_jax.plan --table_out=F` files as one table with the
commands and dates they came from. No JAX here, so the results-table renderer (mle_jax.reporting.results_tables) can
use it."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


def markdown(results: dict[str, Any]) -> str:
    """The rows of a --table_out file as a markdown table, with the command and date it came from."""
    lines = [
        "| slice | chips | device kind | mesh (data, fsdp, tensor) | per-chip GiB (learner + vLLM) | of | fits | "
        "FLOPs / step | projected step | overrides |",
        "| --- | ---: | --- | --- | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for r in results["rows"]:
        over = " ".join(f"`--config.{k}={v}`" for k, v in r["overrides"].items())
        if "error" in r:
            lines.append(f"| {r['target']} | | | | | | error: {r['error']} | | | {over} |")
            continue
        m = r["mesh"]
        mem = f"{r['total_gib']:.2f} ({r['learner_gib']:.2f} + {r['sampler_gib']:.2f})" if r["total_gib"] else "-"
        if r.get("compile_error"):  # libtpu refused: its temporaries plus the state, a lower bound
            mem = f">= {mem}"
        step = f"{r['projected_step_s']:.1f} s" if r["projected_step_s"] else "-"
        fit = {True: "**yes**", False: "no", None: "-"}[r["fits"]]
        lines.append(
            f"| {r['target']} | {r['chips']} | {r['device_kind']} | {m['data']}, {m['fsdp']}, {m['tensor']} | {mem} | "
            f"{r['device_memory_gib']:.0f} | {fit} | {r['flops_per_step']:.3e} | {step} | {over} |"
        )
    lines.append("")
    for r in results["rows"]:
        dcn = (r.get("plan") or {}).get("dcn") or {}
        if dcn.get("slices", 1) > 1:
            parts = ", ".join(
                f"{k}: {v['gib_per_device_per_call']:.3f} GiB in {v['runs_per_call']} transfers"
                for k, v in sorted(dcn["by_op_and_axes"].items(), key=lambda kv: -kv[1]["gib_per_device_per_call"])
            )
            params = r["plan"]["per_device"]["params_gib"]
            grads = params["policy"] + params["critic"]
            lines.append(
                f"Across the {dcn['slices']} slices of {r['target']} (DCN), per chip per step: "
                f"**{dcn['gib_per_device_per_step']:.2f} GiB** ({parts}); the policy's and critic's gradients on "
                f"one chip are {grads:.2f} GiB, so {dcn['gib_per_device_per_step'] / grads:.1f}x that crosses."
            )
            lines.append("")
    refused = [r for r in results["rows"] if r.get("compile_error")]
    if refused:
        lines.append(
            "`>=`: libtpu refused to compile the update for that slice (RESOURCE_EXHAUSTED: the temporaries it needs "
            "exceed the chip's HBM; the message is in the row's `compile_error`); the figure is the state plus the "
            "temporaries the message names, a lower bound."
        )
    sources = results.get("sources") or [{"command": results["command"], "date": results["date"]}]
    made = "; ".join(f"`{s['command']}` ({s['date']})" for s in sources)
    lines.append(
        f"Projected step: FLOPs / (chips x bf16 peak x MFU {results['mfu']}). From {made}; rendered by "
        "`python -m mle_jax.planner.table`."
    )
    return "\n".join(lines)


def merge(files: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Several --table_out files (say one process per generation) as one table's results, rows in order."""
    if len({f["mfu"] for f in files}) > 1:
        raise ValueError(f"the files assume different MFUs: {sorted({f['mfu'] for f in files})}")
    return {
        "mfu": files[0]["mfu"],
        "rows": [r for f in files for r in f["rows"]],
        "sources": [{"command": f["command"], "date": f["date"]} for f in files],
    }


def replace_between_markers(doc: str, name: str, body: str) -> str:
    """doc with the text between `<!-- table:name -->` and `<!-- /table:name -->` replaced by body."""
    pattern = re.compile(rf"(<!-- table:{re.escape(name)} -->\n).*?(<!-- /table:{re.escape(name)} -->)", re.S)
    if not pattern.search(doc):
        raise ValueError(f"no <!-- table:{name} --> ... <!-- /table:{name} --> markers")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), doc)


def objectives_markdown(results: dict[str, Any]) -> str:
    """Planner rows of one config under several `learner.algorithm`s and device counts (merged --table_out files) as
    one table per device row, then each objective's smallest fitting device count among those planned."""
    lines = [
        "| learner.algorithm | devices | mesh (data, fsdp, tensor) | critic params | optimizer states | "
        "per-device GiB (learner + vLLM) | of | fits | FLOPs / step |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    counts: dict[str, dict[int, bool | None]] = {}
    for r in results["rows"]:
        if "error" in r:
            lines.append(f"| | | | | | | | error: {r['error']} | |")
            continue
        p, m = r["plan"], r["mesh"]
        algorithm = p["config"].get("algorithm", "ppo")
        counts.setdefault(algorithm, {})[r["chips"]] = r["fits"]
        d = p["per_device"]
        mem = f"{r['total_gib']:.2f} ({r['learner_gib']:.2f} + {r['sampler_gib']:.2f})" if r["total_gib"] else "-"
        fit = {True: "**yes**", False: "no", None: "-"}[r["fits"]]
        lines.append(
            f"| {algorithm} | {r['chips']} x {r['target'].split(':')[0]} | {m['data']}, {m['fsdp']}, {m['tensor']} | "
            f"{d['params_gib']['critic']:.2f} | {d['optimizer_gib']:.2f} | {mem} | {r['device_memory_gib']:.0f} | "
            f"{fit} | {r['flops_per_step']:.3e} |"
        )
    lines.append("")
    smallest = []
    for algorithm, fits in counts.items():
        fitting = sorted(n for n, ok in fits.items() if ok)
        if not fitting:
            smallest.append(f"{algorithm}: none of {sorted(fits)}")
            continue
        below = [n for n, ok in fits.items() if ok is False and n < fitting[0]]
        why = f", not on {max(below)}" if below else " (fewer not planned)"
        smallest.append(f"{algorithm} on **{fitting[0]}**{why}")
    lines.append(f"Smallest device count that fits, of those planned: {'; '.join(smallest)}.")
    sources = results.get("sources") or [{"command": results["command"], "date": results["date"]}]
    made = "; ".join(f"`{s['command']}` ({s['date']})" for s in sources)
    lines.append(f"From {made}; rendered by `mle_jax.reporting.results_tables` (`objectives_markdown`).")
    return "\n".join(lines)
