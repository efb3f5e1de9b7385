"""The table of the embedded runs (docs/results.md, "Every task with data on CPU"), read from their workdirs.

    for t in pizza spooky insults leaf nomad2018 tweet_sentiment; do
        flock /work/cpu.lock .venv/bin/python -m mle_jax.launch --config=configs/$t.py:cpu
    done
    PYTHONPATH=. .venv/bin/python bench/cpu_runs_table.py [runs/*-cpu]

Without arguments (as `make bench` runs it) it reads every finished runs/*-cpu workdir there is.

Per run: the verified warm-start corpus (programs, score range), the valid fraction of the first RL step's samples
(the warm-started policy) and of the last, the best score seen during RL, the evaluation after RL (scratch samples:
valid fraction, best score), and the wall time of the whole run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mle_jax.infra.metrics import read_metrics
from mle_jax.tasks.registry import get_spec


def _summary(report: Path) -> dict[str, str]:
    """The quantity/value table at the top of report.md."""
    out = {}
    for line in report.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("quantity", "---"):
            out[cells[0]] = cells[1]
        if line.startswith("## "):
            break
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60)} s"


def _best_during_rl(summary: dict[str, str], steps: list[dict]) -> str:
    """The summary's best score during RL; "-" for a lower-is-better task whose run logged no "score/min" (runs
    before it was logged took the least of the step maxima)."""
    if get_spec(summary["task"]).lower_is_better and not any("score/min" in r for r in steps):
        return "-"
    return summary.get("score/best_during_rl", "-")


def row(workdir: Path) -> list[str]:
    summary = _summary(workdir / "report.md")
    corpus = [json.loads(line) for line in (workdir / "warmstart" / "verified.jsonl").read_text().splitlines()]
    scores = sorted(r["score"] for r in corpus if r["valid"])
    steps = read_metrics(workdir / "metrics.jsonl")
    ev = json.loads((workdir / "evaluation.json").read_text())
    scratch = ev["scratch"]
    best = "-" if scratch["max"] is None else f"{scratch['max']:.4g}"
    return [
        summary.get("task", workdir.name),
        f"{len(scores)} of {len(corpus)}",
        f"{scores[0]:.4g} – {scores[-1]:.4g}",
        _pct(steps[0]["valid_fraction"]),
        _pct(steps[-1]["valid_fraction"]),
        _best_during_rl(summary, steps),
        f"{_pct(scratch['valid_fraction'])} of {scratch['samples']} (best {best})",
        _minutes(float(summary["wall_s"])),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("workdirs", nargs="*", type=Path, help="default: every finished runs/*-cpu")
    args = ap.parse_args()
    workdirs = args.workdirs or sorted(w for w in Path("runs").glob("*-cpu") if (w / "report.md").is_file())
    if not workdirs:
        print("no finished runs/*-cpu workdir here: run `make run` (or another configs/<task>.py:cpu) first")
        return
    header = [
        "task",
        "corpus (valid of run)",
        "corpus score range",
        "valid, first RL step (after warm start)",
        "valid, last RL step",
        "best score during RL",
        "evaluation after RL (scratch)",
        "wall time",
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for w in workdirs:
        print("| " + " | ".join(row(w)) + " |")


if __name__ == "__main__":
    main()
