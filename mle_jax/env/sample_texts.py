"""A few of a step's samples as markdown for TensorBoard's text tab (as OpenRLHF logs its samples): the best, the
worst and a failure of the samples the step trained on, each with its figures, plan, program and output."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

TEXT_CHARS = 3000  # of each of a sample's plan, program and output in TensorBoard (samples.html has them whole)


def pick_samples(records: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """{"best": the highest reward, "worst": the lowest, "failure": an invalid sample other than those two if there
    is one, else the worst if it is invalid}; a name is left out where no sample fits (no records: {})."""
    scored = [r for r in records if r.get("reward") is not None]
    if not scored:
        return {}
    best = max(scored, key=lambda r: r["reward"])
    worst = min(scored, key=lambda r: r["reward"])
    out = {"best": best}
    if worst is not best:
        out["worst"] = worst
    failures = [r for r in scored if not r.get("valid")]
    failure = next((r for r in failures if r is not best and r is not worst), failures[0] if failures else None)
    if failure is not None and failure is not best:
        out["failure"] = failure
    return out


def _cut(text: str | None, chars: int = TEXT_CHARS, tail: bool = False) -> str:
    text = text or ""
    if len(text) <= chars:
        return text
    return "…" + text[-chars:] if tail else text[:chars] + "…"


def _fence(text: str, lang: str = "") -> str:
    """A fenced markdown block that no backtick run inside `text` can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}"


def sample_markdown(rec: Mapping[str, Any]) -> str:
    """One sample's record (samples.jsonl) as markdown: a line of figures, the plan, the program, the output's end."""
    figures = [
        f"uid {rec.get('uid')}",
        f"task {rec.get('task') or '?'}",
        f"prompt {rec.get('prompt')}",
        f"reward {rec.get('reward')}",
        f"score {rec.get('score')}" + (f" ({rec['medal']})" if rec.get("medal") else ""),
        f"outcome {rec.get('outcome') or rec.get('status')}",
        f"Δt {rec.get('duration_s')} s",
        f"version lag {rec.get('lag')}",
    ]
    parts = [" · ".join(figures)]
    for key, label in (("error", "error"), ("grader_reason", "grader")):
        if rec.get(key):
            parts.append(f"**{label}**\n\n" + _fence(str(rec[key])))
    if rec.get("plan"):
        parts.append("**plan**\n\n" + _fence(_cut(rec["plan"])))
    program = rec.get("program") or rec.get("code")
    if program:
        parts.append("**program**\n\n" + _fence(_cut(program), "python"))
    output = "\n".join(x for x in (rec.get("stdout"), rec.get("stderr")) if x)
    if output:
        parts.append("**output** (its end)\n\n" + _fence(_cut(output, tail=True)))
    return "\n\n".join(parts)


def tensorboard_samples(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """{"samples/best": markdown, "samples/worst": ..., "samples/failure": ...} of one step's records."""
    return {f"samples/{name}": sample_markdown(rec) for name, rec in pick_samples(records).items()}
