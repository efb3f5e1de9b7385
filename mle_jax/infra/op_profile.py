"""Where a traced step's device time goes: a Perfetto trace (`jax.profiler.trace(..., create_perfetto_trace=True)`)
summarised by op and by category, with the standard library only (the bare GPU image has no TensorBoard plugin).

    python -m mle_jax.infra.op_profile TRACE.json.gz [--top 25]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

# checked in order: the first pattern that matches an op's name (or its HLO text) names its category
CATEGORIES = (
    ("attention (cuDNN)", re.compile(r"cudnn|fmha|flash|fused_attention", re.I)),
    ("matmul", re.compile(r"gemm|cublas|nvjet|dot|matmul|triton_gemm|cutlass", re.I)),
    ("collective", re.compile(r"all-reduce|all-gather|reduce-scatter|all-to-all|collective|nccl", re.I)),
    ("copy / transpose", re.compile(r"copy|transpose|memcpy|memset|dynamic-update-slice", re.I)),
    ("fusion (elementwise, reduce)", re.compile(r"fusion|reduce|loop|input", re.I)),
)


def category(name: str, text: str = "") -> str:
    for label, pattern in CATEGORIES:
        if pattern.search(name) or (text and pattern.search(text)):
            return label
    return "other"


def _events(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def summarize(path: str | Path, top: int = 25) -> dict[str, Any]:
    """{busy_ms, span_ms, busy_share, line, by_category: {label: ms}, top: [{name, category, ms, share, count}],
    lines: {"process / thread": ms}} over the device's op line ("XLA Ops"; else its streams' kernels)."""
    events = _events(Path(path))
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e["pid"]] = e.get("args", {}).get("name", "")
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e["pid"], e["tid"])] = e.get("args", {}).get("name", "")
    device = {pid for pid, name in procs.items() if re.search(r"/device:(GPU|TPU)", name)}
    per_line: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("pid") in device and "dur" in e:
            per_line[(e["pid"], e.get("tid"))].append(e)
    lines = {
        f"{procs[p]} / {threads.get((p, t), t)}": sum(e["dur"] for e in es) / 1e3 for (p, t), es in per_line.items()
    }
    ops = [k for k in per_line if threads.get(k, "") == "XLA Ops"]
    chosen = ops or [k for k in per_line if "stream" in str(threads.get(k, "")).lower()] or list(per_line)
    picked = [e for k in chosen for e in per_line[k]]
    if not picked:
        return {"error": "no device events in the trace", "processes": sorted(procs.values())}
    busy = sum(e["dur"] for e in picked) / 1e3
    span = (max(e["ts"] + e["dur"] for e in picked) - min(e["ts"] for e in picked)) / 1e3
    by_name: dict[str, list[float]] = defaultdict(list)
    texts: dict[str, str] = {}
    for e in picked:
        by_name[e["name"]].append(e["dur"] / 1e3)
        args = e.get("args") or {}
        texts.setdefault(e["name"], str(args.get("long_name") or args.get("hlo_op") or args.get("tf_op") or ""))
    by_cat: dict[str, float] = defaultdict(float)
    for name, ds in by_name.items():
        by_cat[category(name, texts[name])] += sum(ds)
    rows = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "busy_ms": busy,
        "span_ms": span,
        "busy_share": busy / span if span else None,
        "line": sorted({threads.get(k, str(k[1])) for k in chosen}),
        "by_category": {k: v for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
        "top": [
            {
                "name": n,
                "category": category(n, texts[n]),
                "ms": sum(ds),
                "share": sum(ds) / busy,
                "count": len(ds),
                "hlo": texts[n][:160],
            }
            for n, ds in rows
        ],  # fmt: skip
        "lines": dict(sorted(lines.items(), key=lambda kv: -kv[1])[:12]),
    }


def render(summary: dict[str, Any]) -> str:
    if "error" in summary:
        return f"profile: {summary['error']}"
    out = [f"device busy {summary['busy_ms']:.1f} ms of a {summary['span_ms']:.1f} ms span "
           f"({summary['busy_share']:.0%}), line {summary['line']}"]  # fmt: skip
    out += [
        f"  {label:30s} {ms:9.1f} ms  {ms / summary['busy_ms']:6.1%}" for label, ms in summary["by_category"].items()
    ]
    out += ["  top ops:"]
    out += [
        f"    {r['ms']:8.1f} ms {r['share']:6.1%} x{r['count']:<5d} [{r['category']}] {r['name'][:90]}"
        for r in summary["top"]
    ]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(render(summarize(args.trace, args.top)))


if __name__ == "__main__":
    main()
