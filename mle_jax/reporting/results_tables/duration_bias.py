"""The simulated duration-bias update's table (mle_jax.experiments.duration_bias: docs/results/duration_bias.jsonl)."""

from __future__ import annotations

from typing import Any

from mle_jax.reporting.markdown import markdown_table, number

# Each row: its label, the settings that differ from the command's defaults (matched in the JSONL records;
# the last record of each setting counts), several seeds side by side.
ADAM = {"optimizer": "adam", "epochs": 1, "whiten_advantages": True}
BIAS_ROWS: tuple[tuple[str, dict[str, Any], tuple[int, ...]], ...] = (
    ("plain SGD, lr 1, 2 epochs, raw advantages", {}, (0, 1)),
    ("SGD, 1 epoch, raw advantages", {"epochs": 1}, (0,)),
    ("SGD, 2 epochs, whitened advantages", {"whiten_advantages": True}, (0,)),
    ("**the shipped update**: Adam lr 0.05, 1 epoch, whitened advantages", {**ADAM, "lr": 0.05}, (0,)),
    ("Adam, 1 epoch, whitened, lr 0.01", {**ADAM, "lr": 0.01}, (0,)),
    ("Adam, 1 epoch, whitened, lr 0.2", {**ADAM, "lr": 0.2}, (0,)),
)  # fmt: skip
BIAS_DEFAULTS = {"steps": 300, "optimizer": "sgd", "lr": 1.0, "epochs": 2, "whiten_advantages": False}


def bias_record(runs: list[dict], settings: dict[str, Any], seed: int) -> dict:
    """The last record of `runs` with these settings (over the defaults) and seed."""
    want = {**BIAS_DEFAULTS, **settings, "seed": seed}
    found = [r for r in runs if all(r["settings"][k] == v for k, v in want.items())]
    if not found:
        raise KeyError(f"no duration_bias record with {want}")
    return found[-1]


def _final(recs: list[dict], mode: str) -> str:
    finals = [r["final"][mode] for r in recs]
    kinds = {f["argmax"] for f in finals}
    probs = " / ".join(number(f["probs"][f["argmax"]], 3) for f in finals)
    return (
        f"P({kinds.pop()}) {probs}"
        if len(kinds) == 1
        else " / ".join(f"P({f['argmax']}) {number(f['probs'][f['argmax']], 3)}" for f in finals)
    )


def render_duration_bias(runs: list[dict]) -> str:
    rows = []
    for label, settings, seeds in BIAS_ROWS:
        recs = [bias_record(runs, settings, s) for s in seeds]
        seeds_note = f" (seeds {' / '.join(map(str, seeds))})" if len(seeds) > 1 else ""
        rows.append([label + seeds_note, _final(recs, "off"), _final(recs, "batch_mean")])
    header = [
        "simulated update (300 steps)",
        "final policy without Δt weights (its most likely kind)",
        "with Δt weights",
    ]
    return markdown_table(header, rows)
