"""The paper's other two ablations (§4.3) as arms of the learning experiment: environment instrumentation (Fig. 9)
and the self-improvement prompt (Table 4), from summaries with `task_score` and `contrasts` (--arm, --seeds)."""

from __future__ import annotations

from mle_jax.reporting.markdown import markdown_table, number, plus_minus, signed

ABLATION_RUNS = ("ablations-pizza-quick", "ablations-spooky-quick")


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


def _verdict(d: dict | None) -> str:
    if d is None:
        return "not measured"
    return {True: "beyond 2 SE", False: "within 2 SE", None: "no SE"}[d["beyond_2se"]]


def render_ablation_contrasts(*summaries: dict) -> str:
    """Each ablation arm against the first arm (the paper's setup), per task: the difference of the final task score
    and of its mean over the RL steps (Fig. 9's curve), in SEs of the difference, and whether it shows beyond 2 SE
    (under the larger of the SEs across seeds and within)."""
    rows = []
    for s in summaries:
        for name, c in s["contrasts"].items():
            f, cu = c["final"], c["curve"]
            rows.append([
                s["task"], f"`{c['reference']}` − `{name}`",
                signed(f["difference"], 3) if f else "—",
                f"{signed(f['z_se'], 1) if f and f['z_se'] is not None else '—'} / "
                f"{signed(f['z_se_within'], 1) if f and f['z_se_within'] is not None else '—'}",
                _verdict(f),
                signed(cu["difference"], 2) if cu else "—",
                signed(cu["z_se"], 1) if cu and cu["z_se"] is not None else "—",
                _verdict(cu),
            ])  # fmt: skip
    header = ["task", "contrast", "final task score difference", "in SEs (across seeds / within)", "final",
              "mean over RL steps, difference", "in SEs (across seeds)", "over RL steps"]  # fmt: skip
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
