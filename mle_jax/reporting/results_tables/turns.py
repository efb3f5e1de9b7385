"""Revising against resampling (issue 31): the learning experiment's `--turns` arms (`<arm>_t<K>`: K-turn episodes
with feedback against the one-turn arm's best of K independent programs, at the same programs per start prompt),
from summaries with `turns` and `turns_contrasts`. The experiment's report.md uses these rows too."""

from __future__ import annotations

from mle_jax.reporting.markdown import markdown_table, minutes, number, plus_minus, signed
from mle_jax.reporting.statistics import ALPHA, Contrast, share_contrast, welch_from_stats
from mle_jax.tasks.registry import get_spec

# the pizza run again, alone on the machine: its wall time is --quick's
TURNS_RUNS = ("learning-spooky-turns-quick", "learning-pizza-turns-quick", "learning-pizza-turns-quick-quiet")


def evaluated(arm: dict) -> tuple[str, ...]:
    """The evaluations an arm of a summary holds: ("before", "after"), or ("before",) from a --before_only run."""
    return tuple(w for w in ("before", "after") if arm.get(w) is not None)


def _task_label(s: dict, summaries: tuple[dict, ...]) -> str:
    """The run's task, with the run's finishing time where another run of the same task is beside it."""
    twins = sum(x["task"] == s["task"] for x in summaries)
    return s["task"] if twins == 1 or "date" not in s else f"{s['task']} (run of {s['date'][:16].replace('T', ' ')})"


def _series(xs: list | None, digits: int) -> str:
    return "—" if not xs else " / ".join("—" if x is None else f"{x:.{digits}f}" for x in xs)


def _pm(x: float | None, se: float | None, digits: int = 3) -> str:
    return "—" if x is None else plus_minus(x, se, digits, minus="-")


def revision_rows(summary: dict) -> list[list]:
    """Per arm split by --turns, before and after RL: turns x draws per start prompt, programs run, the share of
    start prompts handed in valid ± SE, the mean score of the valid hand-ins ± SE and the best, the mean score had the
    best turn or draw by the private score been handed in (analysis only: no agent can choose so), the share with a
    medal ± SE and above the median, the valid fraction and mean Δt by turn (K > 1: of the episodes that reached it)
    or by draw (the one-turn arm's independent samples), and RL steps per hour."""
    rows = []
    for name, arm in summary["arms"].items():
        for when in evaluated(arm):
            e = arm[when]
            ep = e.get("episodes") or {}
            by = ep.get("by_turn") or ep.get("by_draw") or {}
            kind = "turn" if ep.get("by_turn") else "draw" if ep.get("by_draw") else ""
            shares = (e.get("medals") or {}).get("shares") or {}
            rows.append([
                f"`{name}`", when, f"{ep.get('turns', 1)} × {ep.get('draws', 1)}", ep.get("programs_run"),
                _pm(e["valid_fraction"], ep.get("valid_share_se")),
                _pm(e["mean_score"], e.get("se_score"), 4), number(e["best_score"], 4),
                number((ep.get("best_private") or {}).get("mean_score"), 4),
                _pm(ep.get("any_medal"), ep.get("any_medal_se")), number(shares.get("above_median")),
                f"{kind}: {_series(by.get('valid_fraction'), 2)}" if kind else "—",
                f"{kind}: {_series(by.get('duration_s'), 1)}" if kind else "—",
                number(arm["stats"].get("steps_per_hour"), 1) if when == "after" else "",
            ])  # fmt: skip
    return rows


REVISION_HEADER = ["arm", "", "turns × draws per start prompt", "programs run", "valid hand-ins ± SE",
                   "mean score of valid ± SE", "best", "mean score had the best turn / draw by the private score been "
                   "handed in (analysis only)", "medal share ± SE", "above median",
                   "valid fraction by turn / draw", "mean Δt (s) by turn / draw", "RL steps per hour"]  # fmt: skip

REVISION_PARTS = (
    ("valid_share", "valid hand-ins", 3),
    ("task_score", "task score", 3),
    ("mean_score", "mean score of valid (task's direction)", 4),
    ("any_medal", "medal share", 3),
)


def revision_contrast(a: dict, b: dict, lower_is_better: bool) -> dict[str, Contrast | None]:
    """A K-turn arm's evaluation `a` minus its one-turn reference's `b` (each `eval_summary`, over the same n start
    prompts), each figure with the test that fits it (reporting/statistics.py; positive: revising better): the share
    of start prompts handed in valid and the share with a medal by Fisher's exact test, the task score (−10 for an
    invalid hand-in) over the start prompts and the mean score of the valid hand-ins (negated when lower is better)
    by Welch's test from their means and SEs. None: not measured (no valid hand-in, or fewer than 2)."""
    na, nb = a["samples"], b["samples"]
    out: dict[str, Contrast | None] = {}
    va, vb = round(a["valid_fraction"] * na), round(b["valid_fraction"] * nb)
    out["valid_share"] = share_contrast(va, na, vb, nb)
    ma, mb = (a.get("medals") or {}).get("any_medal"), (b.get("medals") or {}).get("any_medal")
    out["any_medal"] = None if ma is None or mb is None else share_contrast(round(ma * na), na, round(mb * nb), nb)
    ta, tb = a.get("task_score_mean"), b.get("task_score_mean")
    out["task_score"] = (
        None if ta is None or tb is None or a.get("task_score_se") is None or b.get("task_score_se") is None
        else welch_from_stats(ta, a["task_score_se"], na, tb, b["task_score_se"], nb)
    )  # fmt: skip
    sign = -1.0 if lower_is_better else 1.0
    sa, sb = a.get("mean_score"), b.get("mean_score")
    out["mean_score"] = (
        None if sa is None or sb is None or va < 2 or vb < 2 or a.get("se_score") is None or b.get("se_score") is None
        else welch_from_stats(sign * sa, a["se_score"], va, sign * sb, b["se_score"], vb)
    )  # fmt: skip
    return out


def _contrasts(s: dict, c: dict, when: str) -> dict[str, Contrast | None]:
    arms = s["arms"]
    return revision_contrast(arms[c["arm"]][when], arms[c["reference"]][when], get_spec(s["task"]).lower_is_better)


def _test_text(x: Contrast) -> str:
    if x.p is None:
        return "no test: both arms none or all alike" if x.test == "not tested" else "no test"
    return f"{'Fisher' if x.test == 'fisher' else 'Welch'} p = {x.p:.2g}"


def revision_text(s: dict, c: dict, when: str) -> str:
    """One line: a K-turn arm minus its one-turn (best of K) reference before or after RL, each figure with its test
    and whether it shows beyond noise (p < ALPHA; positive: revising better)."""
    parts = []
    contrasts = _contrasts(s, c, when)
    for key, label, digits in REVISION_PARTS:
        x = contrasts[key]
        if x is None:
            parts.append(f"{label}: not measured")
            continue
        word = "" if x.p is None else (", beyond noise" if x.beyond_noise else ", within noise")
        parts.append(f"{label} {x.diff:+.{digits}f} ({_test_text(x)}{word})")
    n = s["arms"][c["arm"]][when]["samples"]
    return f"{c['arm']} minus {c['reference']}, {when} RL, n = {n} start prompts: " + "; ".join(parts)


def render_turns_table(*summaries: dict) -> str:
    """Per task and arm, before and after RL, the hand-ins at the same programs per start prompt (`revision_rows`);
    then each run's command, date and wall time as its summary records them."""
    rows = []
    for s in summaries:
        for i, row in enumerate(revision_rows(s)):
            rows.append([_task_label(s, summaries) if i == 0 else "", *row])
    runs = [f"`{s['command']}`: finished {s['date'][:16].replace('T', ' ')} UTC; {minutes(s['wall_s'])} of wall time "
            f"in the {len(s.get('processes', []))} process(es) that finished (the ledger counts no process cut off "
            "before it finished)" for s in summaries if "command" in s]  # fmt: skip
    return markdown_table(["task", *REVISION_HEADER], rows) + "".join(f"\n\n{r}" for r in runs)


def _cell(x: Contrast | None, digits: int) -> str:
    if x is None:
        return "—"
    return f"{signed(x.diff, digits)} ({_test_text(x)})"


def render_turns_contrasts(*summaries: dict) -> str:
    """Per task, each K-turn arm minus its one-turn reference before and after RL (positive: revising better) over n
    start prompts, each figure with its test (`revision_contrast`); the last column names the figures beyond noise
    (two-sided p < ALPHA)."""
    rows = []
    for s in summaries:
        for c in s["turns_contrasts"].values():
            for when in evaluated(s["arms"][c["arm"]]):
                parts = _contrasts(s, c, when)
                beyond = [label for key, label, _ in REVISION_PARTS if parts[key] and parts[key].beyond_noise]
                n = s["arms"][c["arm"]][when]["samples"]
                rows.append([_task_label(s, summaries), f"`{c['arm']}` − `{c['reference']}`", when, n,
                             *(_cell(parts[key], digits) for key, _, digits in REVISION_PARTS),
                             ", ".join(beyond) or "none"])  # fmt: skip
    header = ["task", "contrast", "", "n (start prompts)", *(label for _, label, _ in REVISION_PARTS),
              f"beyond noise (p < {ALPHA})"]  # fmt: skip
    return markdown_table(header, rows)


WARMSTART_DEBUG = "docs/results/warmstart-debug-spooky.json"


def render_warmstart_debug(d: dict) -> str:
    """bench/warmstart_debug.py's file: per arm (the warm start with debug examples, and without), its SFT set and,
    on held-out corpus-kind programs with one injected fault each, the share whose turn 2 graded valid, per fault
    kind, and the shares that kept the original's kind of solution (a revision rather than another program)."""
    kinds = ("column", "import", "path", "api", "shape")
    rows = []
    for name, a in d["arms"].items():
        label = "with debug examples" if name == "debug" else "without (the same SFT, no debug examples)"
        n = a["debug_heldout"]
        rows.append([label, a["examples"], a.get("debug_examples") or 0, n,
                     f"{round(a['debug_heldout_fix_share'] * n)} ({a['debug_heldout_fix_share']:.0%})",
                     " / ".join(f"{a[f'debug_heldout_fix_{k}']:.2f}" for k in kinds),
                     f"{a['debug_heldout_same_solution_share']:.2f}",
                     f"{a['debug_heldout_fix_same_solution_share']:.2f}",
                     f"{a['debug_heldout_exact_share']:.2f}", f"{a['debug_heldout_similarity_mean']:.2f}"])  # fmt: skip
    o = d["overrides"]
    header = [f"warm start ({d['config']}, {o.get('agent.turns')} turns, context {o.get('agent.context')!r})",
              "SFT examples", "debug examples", "held-out faulty programs", "turn 2 valid",
              f"turn 2 valid by fault ({' / '.join(kinds)})", "kept the original's kind of solution",
              "valid and of that kind", "wrote the original back", "similarity to the original"]  # fmt: skip
    return markdown_table(header, rows) + f"\n\nFrom `{d['command']}` ({d['date'][:10]}, {d['machine']})."
