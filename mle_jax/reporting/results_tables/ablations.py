"""The paper's other two ablations (§4.3) as arms of the learning experiment: environment instrumentation (Fig. 9)
and the self-improvement prompt (Table 4), from summaries with `task_score` and `contrasts` (--arm, --seeds)."""

from __future__ import annotations

import dataclasses
from typing import Any

from mle_jax.reporting.markdown import markdown_table, number, plus_minus, signed
from mle_jax.reporting.statistics import ALPHA, welch

ABLATION_RUNS = ("ablations-pizza-quick", "ablations-spooky-quick")
# what an arm of the learning experiment sets (its summary's "stats" also holds what it measured)
ARM_SETTINGS = ("algorithm", "duration_weights", "instrument_mode", "improve_fraction")
NO_IMPROVE = "the arms differ only in the improve share, and neither trained on an improve prompt"
SAME_FIGURE = "every seed of both arms gave the same figure"


def _final(a: dict) -> str:
    f = a["task_score"]["final"]
    within = f" (within {number(f['se_within'], 3)})" if f.get("se_within") is not None else ""
    return f"{plus_minus(f['mean'], f['se'], 3)}{within}"


def render_ablation_table(*summaries: dict) -> str:
    """Table 4's form, one row per task: each arm's final task score (the after-RL evaluation; −10 for an invalid
    sample, the score in the task's direction otherwise), mean ± SE across seeds (within: the evaluations' own
    sampling), and its runs that never trained on a valid program."""
    arms = list(summaries[0]["arms"])
    rows = []
    for s in summaries:
        before = next(iter(s["arms"].values()))["before"]
        row = [s["task"], plus_minus(before["task_score_mean"], before["task_score_se"], 3)]
        row += [_final(s["arms"][name]) for name in arms]
        row += [f"{s['arms'][n]['task_score']['never_valid']} of {s['arms'][n]['task_score']['runs']}" for n in arms]
        rows.append(row)
    first = summaries[0]
    header = ["task", "before RL (every arm's start)"]
    header += [f"`{n}` after RL ({first['seeds']} seeds)" for n in arms]
    header += [f"`{n}` runs never valid" for n in arms]
    return markdown_table(header, rows)


def _tested(a: dict | None, b: dict | None, could_differ: bool = True) -> dict[str, Any] | None:
    """a's per-seed values against b's (`spread`s) by Welch's test, the seed the unit (reporting/statistics.py), as
    {diff, test, p, n_a, n_b}; "not tested" when the arms could not differ; None with fewer than 2 seeds in an arm."""
    if a is None or b is None or len(a["values"]) < 2 or len(b["values"]) < 2:
        return None
    x = welch(a["values"], b["values"])
    if not could_differ:
        return {**dataclasses.asdict(dataclasses.replace(x, test="not tested", p=None)), "reason": NO_IMPROVE}
    if x.p is None:  # no spread and no difference: every seed of both arms gave the same figure
        return {**dataclasses.asdict(x), "reason": SAME_FIGURE}
    return dataclasses.asdict(x)


def could_differ(reference: dict, arm: dict) -> bool:
    """False when two arms ran the same thing: they differ only in prompt.improve_fraction, and neither trained on an
    improve prompt (no earlier solution to show: the paper's scratch_only ablation where the buffer stayed empty)."""
    ref_stats, arm_stats = reference.get("stats") or {}, arm.get("stats") or {}
    differ = {k for k in ARM_SETTINGS if ref_stats.get(k) != arm_stats.get(k)}
    trained = [x["task_score"].get("improve_trained") for x in (reference, arm)]
    return not (differ == {"improve_fraction"} and all(t == 0.0 for t in trained))


def arm_contrasts(arms: dict[str, dict]) -> dict[str, dict]:
    """Each arm after the first against the first (the reference, e.g. the paper's setup), the seed the unit: the
    final task score (reference minus arm), the curve's mean over RL steps, and the after-RL evaluation's mean reward
    and valid fraction (None where a summary predates them), each by Welch's test over the seeds' values
    (`_tested`); "not tested" where the arms could not differ (`could_differ`).

    arms: summary["arms"], each with "task_score" from `arm_task_scores` (and "stats", the arm's settings)."""
    names = list(arms)
    out = {}
    for name in names[1:]:
        ref, other = arms[names[0]], arms[name]
        differ = could_differ(ref, other)
        out[name] = {
            "reference": names[0],
            "final": _tested(ref["task_score"]["final"], other["task_score"]["final"], differ),
            "curve": _tested(ref["task_score"]["curve"], other["task_score"]["curve"], differ),
            **{k: _tested(ref["task_score"].get(k), other["task_score"].get(k), differ) for k in ("reward", "valid")},
        }
    return out


def tested_text(d: dict | None, digits: int = 3) -> str:
    """A stored contrast ({diff, test, p, n_a, n_b}: a `statistics.Contrast` as a dict) in words: the difference, the
    test and p over n seeds per arm, and whether it shows beyond noise (p < ALPHA)."""
    if d is None:
        return "not measured (fewer than 2 seeds)"
    if "test" not in d:  # a summary from before the one rule (its SEs only): its difference, untested here
        return f"{signed(d['difference'], digits)} (no test in this summary)"
    if d["p"] is None:
        return f"{signed(d['diff'], digits)}, not tested: {d.get('reason', 'the arms could not differ')}"
    word = "beyond" if d["p"] < ALPHA else "within"
    return f"{signed(d['diff'], digits)} (Welch p = {d['p']:.2g}, {d['n_a']} and {d['n_b']} seeds: {word} noise)"


def render_ablation_contrasts(*summaries: dict) -> str:
    """Each ablation arm against the first arm (the paper's setup), per task: the difference of the final task score
    and of its mean over the RL steps (Fig. 9's curve), each by Welch's test over the seeds (the seed the unit;
    reporting/statistics.py) and whether it shows beyond noise; "not tested" where the arms could not differ."""
    rows = []
    for s in summaries:
        for name, c in arm_contrasts(s["arms"]).items():  # from the arms' per-seed values, whatever the summary kept
            rows.append([s["task"], f"`{c['reference']}` − `{name}`", tested_text(c["final"]),
                         tested_text(c["curve"], 2)])  # fmt: skip
    header = ["task", "contrast", "final task score", "mean over RL steps"]
    return markdown_table(header, rows)


def never_valid_figure(*summaries: dict) -> str:
    """The share of runs (arms x seeds x tasks) that never trained on a valid program, per arm, in one line."""
    arms = list(summaries[0]["arms"])
    parts = []
    for name in arms:
        never = sum(s["arms"][name]["task_score"]["never_valid"] for s in summaries)
        runs = sum(s["arms"][name]["task_score"]["runs"] for s in summaries)
        parts.append(f"`{name}` {never} of {runs}")
    return ", ".join(parts)


def improve_trained_figure(*summaries: dict) -> str:
    """The share of improve prompts among the samples the first arm (the paper's setup, improve_fraction 0.5)
    trained on, per task, in one line."""
    parts = []
    for s in summaries:
        share = next(iter(s["arms"].values()))["task_score"].get("improve_trained")
        parts.append(f"{number(share)} on {s['task']}")
    return ", ".join(parts)
