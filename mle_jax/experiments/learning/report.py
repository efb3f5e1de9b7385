"""The experiment's report.md: the summary's figures as tables, the medals, the plots."""

from __future__ import annotations

from pathlib import Path

from mle_jax.experiments.learning.plots import write_plots
from mle_jax.reporting.markdown import markdown_table, number, plus_minus
from mle_jax.reporting.report import MEDAL_HEADER, medal_row, paper_line
from mle_jax.reporting.results_tables.ablations import arm_contrasts, tested_text
from mle_jax.reporting.results_tables.learning import paired_text
from mle_jax.reporting.results_tables.turns import REVISION_HEADER, evaluated, revision_rows, revision_text


def mean_reward_text(e: dict) -> str:
    """An evaluation's mean reward ± SE ("-2.00 ± 0.50"); a dash without an SE."""
    return plus_minus(e["mean_reward"], e["se_reward"], 2, minus="-") if e["se_reward"] is not None else "—"


def paired_lines(summary: dict) -> list[str]:
    """Each run's evaluation after RL against the one before, paired by start prompt (every repeat of every arm);
    nothing for summaries from before the pairing was kept."""
    runs = [(name, r) for name, arm in summary["arms"].items() for r in arm.get("repeats", [])]
    if not any(r.get("paired_before_after") for _, r in runs):
        return []
    rows = [[name, r["seed"], paired_text(r.get("paired_before_after"))] for name, r in runs]
    header = ["arm", "seed", "after − before, paired by start prompt (one run: the prompts the unit)"]
    return ["", markdown_table(header, rows)]


def medal_lines(summary: dict) -> list[str]:
    """The report's MLE-bench medals of the evaluation samples: before RL (every arm's start; with --turns each arm's
    own, of its turns) and after RL in each arm, the best sample's level and the share at each level; then the paper's
    Table 1 figures with theirs."""
    task, arms = summary["task"], summary["arms"]
    if "turns" in summary:  # --turns: each K's evaluation before RL is its own (K-turn episodes or best of draws)
        evals = [(f"{name} {when} RL", arm[when]) for name, arm in arms.items() for when in ("before", "after")]
    else:
        evals = [("before RL", next(iter(arms.values()))["before"])] if arms else []
        evals += [(f"{name} after RL", arm["after"]) for name, arm in arms.items()]
    rows = [medal_row([task, label], e["medals"]) for label, e in evals if e.get("medals")]
    if not rows:  # evaluations from before medals
        return []
    lines = ["", "MLE-bench medals of the evaluation samples (data/mlebench/medal_thresholds.csv):", ""]
    lines.append(markdown_table(["task", "policy", *MEDAL_HEADER], rows))
    paper = evals[0][1].get("paper")
    if paper:
        lines += ["", paper_line(task, paper)]
    return lines


def _pm(x: float | None, se: float | None, digits: int = 3) -> str:
    return "—" if x is None else plus_minus(x, se, digits, minus="-")


def ablation_table(summary: dict) -> str:
    """The final evaluation per arm in the form of the paper's Table 4: the task score (-10 for an invalid sample,
    the signed score otherwise) after RL, mean ± SE across seeds and within (the evaluations' sampling), with
    what the arm trains on (instrumentation, share of improve prompts) and its runs that never trained on a valid
    program."""
    rows = []
    for name, arm in summary["arms"].items():
        ts, st = arm["task_score"], arm["stats"]
        final = ts["final"]
        rows.append([
            name, st.get("instrument_mode"),
            f"{number(st.get('improve_fraction'))} / {number(ts.get('improve_trained'))}", ts["runs"],
            _pm(final["mean"], final["se"]), _pm(final["mean"], final.get("se_within")),
            ", ".join(f"{v:.3f}" for v in final["values"]),
            _pm(ts["curve"]["mean"], ts["curve"]["se"]) if ts["curve"] else "—",
            f"{ts['never_valid']} of {ts['runs']}",
        ])  # fmt: skip
    header = ["arm", "instrumentation", "improve prompts in RL, set / trained on", "seeds",
              "final task score ± SE across seeds", "± SE within", "per seed", "mean over RL steps ± SE",
              "runs never valid in RL"]  # fmt: skip
    return markdown_table(header, rows)


def contrast_text(name: str, c: dict) -> str:
    """One line: the reference arm minus `name` in the final task score, over RL steps and (where the summary has
    them) in the after-RL evaluation's mean reward, each with its test over the seeds and whether it shows beyond
    noise."""
    reward = f"; after-RL mean reward {tested_text(c['reward'])}" if c.get("reward") is not None else ""
    return (
        f"{c['reference']} minus {name}: final task score "
        + tested_text(c["final"])
        + "; mean over RL steps "
        + (tested_text(c["curve"], 2))
        + reward
    )


def ablation_lines(summary: dict) -> list[str]:
    """The report's Table-4 table and each arm's contrast with the first (absent from summaries before them)."""
    arms = summary["arms"]
    if not arms or "task_score" not in next(iter(arms.values())):
        return []
    lines = ["", f"Task score (the paper's Fig. 9 / Table 4 number) over {summary.get('seeds', 1)} seed(s):", ""]
    lines.append(ablation_table(summary))
    contrasts = arm_contrasts(arms) if len(arms) > 1 else {}  # from the arms' per-seed values
    if contrasts:
        lines.append("")
        lines += [f"- {contrast_text(name, c)}" for name, c in contrasts.items()]
    return lines


def revision_lines(summary: dict) -> list[str]:
    """The report's revising-against-resampling section (summaries of --turns runs only)."""
    if "turns" not in summary:
        return []
    kmax = max(summary["turns"])
    lines = [
        "",
        f"Revising against resampling (--turns={','.join(map(str, summary['turns']))}): every evaluation "
        f"runs {kmax} programs per start prompt ({summary['scale']['eval_samples']} start prompts); a K-turn "
        f"arm's {kmax}/K episodes hand in the best by the agent's printed held-out metric, never the private "
        "score. By turn: of the episodes that reached it; by draw: the one-turn arm's independent samples.",
        "",
    ]
    lines.append(markdown_table(REVISION_HEADER, revision_rows(summary)))
    contrasts = summary.get("turns_contrasts") or {}
    if contrasts:
        lines.append("")
        lines += [f"- {revision_text(summary, c, when)}" for c in contrasts.values()
                  for when in evaluated(summary["arms"][c["arm"]])]  # fmt: skip
    return lines


def write_before_report(summary: dict, out: Path) -> Path:
    """out/report.md of a --before_only run: the initial policy's evaluations and, with --turns, revising against
    resampling before RL (no arm was trained)."""
    lines = [f"# Before RL: {summary['task']}", "",
             f"The initial policy evaluated on {summary['scale']['eval_samples']} scratch prompts (--before_only: no "
             "arm trained; the same command without it trains the arms and reuses these evaluations).", ""]  # fmt: skip
    rows = [[name, mean_reward_text(arm["before"]), arm["before"]["valid_fraction"], arm["before"]["mean_score"],
             arm["before"]["best_score"]] for name, arm in summary["arms"].items()]  # fmt: skip
    lines.append(markdown_table(["arm", "mean reward ± SE", "valid fraction", "mean score of valid", "best"], rows))
    lines += revision_lines(summary)
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_report(summary: dict, out: Path) -> Path:
    """out/report.md (and its plots, out/plots/) from the experiment's summary; returns the report's path."""
    if summary.get("before_only"):
        return write_before_report(summary, out)
    plots = write_plots(summary, out / "plots")
    arms = summary["arms"]
    lines = [f"# Learning on the real loop: {summary['task']}", ""]
    lines.append(
        f"{summary['scale']['steps']} RL steps of B={summary['batch_size']} per arm from one warm-started "
        f"policy; evaluation on {summary['scale']['eval_samples']} scratch prompts before and after, same seeds."
    )
    rows = []
    for name, arm in arms.items():
        for when in ("before", "after"):
            e = arm[when]
            se = e.get("se_score")
            score = e["mean_score"] if se is None else plus_minus(e["mean_score"], se, 4, minus="-")
            rows.append([name, when, mean_reward_text(e), e["valid_fraction"], score, e["best_score"]])
    header = ["arm", "", "mean reward ± SE", "valid fraction", "mean score of valid (± SE)", "best"]
    lines += ["", markdown_table(header, rows)]
    lines += paired_lines(summary)
    lines += medal_lines(summary)
    lines += revision_lines(summary)
    lines += ablation_lines(summary)
    kinds = sorted({k for arm in arms.values() for k in (*arm["before"]["kinds"], *arm["after"]["kinds"])})
    rows = [[k] + [arm[w]["kinds"].get(k, 0.0) for arm in arms.values() for w in ("before", "after")] for k in kinds]
    header = ["kind"] + [f"{name} {w}" for name in arms for w in ("before", "after")]
    lines += ["", "Share of each kind of solution in the evaluation samples:", "", markdown_table(header, rows)]
    if summary["corpus_kinds"]:
        rows = [
            [k, v["programs"], v["duration_s_mean"], v.get("duration_s_median"), v["score_mean"], v.get("score_median")]
            for k, v in summary["corpus_kinds"].items()
        ]
        lines += ["", "The corpus's kinds measured on this machine (verified warm-start programs):", ""]
        header = ["kind", "programs", "mean Δt (s)", "median Δt (s)", "mean score", "median score"]
        lines.append(markdown_table(header, rows))
        m = summary.get("corpus_medians")
        if m:
            lines.append(f"\nThe corpus's median program: Δt {m['duration_s']:.2f} s, score {m['score']:.4g}.")
    contrast = summary.get("slow_and_better")
    if contrast is not None:
        if contrast["kinds"]:
            lines += [
                "",
                f"Slower and better than the corpus's median program (the kinds the duration weights protect): "
                f"{', '.join(contrast['kinds'])}. Their share of the evaluation samples (± SE):",
                "",
            ]
            rows = [
                [name, *(plus_minus(*v[w], 3, minus="-") for w in ("before", "after"))]
                for name, v in contrast["arms"].items()
            ]
            lines.append(markdown_table(["arm", "before RL", "after RL"], rows))
            if contrast.get("z") is not None:
                first, second = list(contrast["arms"])[:2]
                lines.append(
                    f"\nAfter RL, {first} minus {second}: {contrast['difference']:+.3f} "
                    f"({contrast['z']:+.1f} standard errors of the difference)."
                )
        else:
            lines += ["", "No kind of the corpus is both slower and better than its median program on this machine."]
    lags = summary.get("lag_of_slow_and_better")
    if lags and contrast and contrast["kinds"]:
        rows = [
            [name, g["kinds"]["version_lag_mean"], g["others"]["version_lag_mean"], g["kinds"]["duration_s_mean"],
             g["others"]["duration_s_mean"]]
            for name, g in lags.items()
        ]  # fmt: skip
        lines += ["", "How late the learner saw them (version lag when trained on) against the other programs:", ""]
        header = ["arm", "lag, slow and better", "lag, others", "Δt (s), slow and better", "Δt (s), others"]
        lines.append(markdown_table(header, rows))
    outcomes = next(iter(arms.values()))["before"].get("kind_outcomes") if arms else None
    if outcomes:
        rows = [
            [k, v["samples"], v["valid_fraction"], v["score_mean"], v["reward_mean"], v["duration_s_mean"]]
            for k, v in outcomes.items()
        ]
        lines += ["", "What the policy writes of each kind before RL (its evaluation samples): what RL sees.", ""]
        lines.append(
            markdown_table(["kind", "samples", "valid", "mean score of valid", "mean reward", "mean Δt (s)"], rows)
        )
    keys = ("executor_utilization", "learner_idle_fraction", "instrument_lm_share", "rl_wall_s", "steps_per_hour",
            "peak_rss_gib")  # fmt: skip
    rows = [[name, *(arm["stats"].get(k) for k in keys)] for name, arm in arms.items()]
    header = ["arm", "executor utilisation", "learner idle", "LM share of parsing programs", "RL s", "steps per hour",
              "peak RSS (GiB)"]  # fmt: skip
    lines += ["", markdown_table(header, rows)]
    stale = sorted({k for arm in arms.values() for k in arm["stats"].get("stale", {})})
    if stale:
        lines += ["", "Staleness, as the learner reports it (mean over each arm's steps):", ""]
        rows = [[name, *(arm["stats"].get("stale", {}).get(k) for k in stale)] for name, arm in arms.items()]
        lines.append(markdown_table(["arm", *stale], rows))
    ws = summary["warmstart"]
    if "instrument_heldout_accept" in ws:
        lines.append(
            f"\nThe frozen instrumenter's output passed verification on {ws['instrument_heldout_accept']:.0%} of "
            f"{ws['instrument_heldout']} held-out grid programs it never saw in the warm start."
        )
    if "instrument_heldout_print_precision" in ws:
        lines.append(
            f"Of the accepted outputs' progress prints, {ws['instrument_heldout_print_precision']:.0%} sit where the "
            f"AST instrumenter puts them, and they hold {ws['instrument_heldout_print_recall']:.0%} of the AST's."
        )
    if "wall_s" in summary:
        lines.append(f"\n`{summary['command']}`: {summary['wall_s']:.0f} s of wall time, finished {summary['date']}.")
    lines += ["", *[f"![{p.stem}](plots/{p.name})" for p in plots]]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
