"""Search at test time against independent samples (README "Search at test time"), from the protocol files
`python -m mle_jax.evaluate --protocol mlebench|ml_agent` wrote (mle_jax/env/protocols.py), copied to
docs/results/search-evidence/ as <task>-<policy>-<search>.json (policy: initial = the warm start, latest = after RL)
and <task>-<policy>-<search>-ml_agent.json."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mle_jax.env.search import POLICIES
from mle_jax.reporting.markdown import markdown_table, number, plus_minus, signed
from mle_jax.reporting.results_tables.sources import RESULTS
from mle_jax.reporting.statistics import Contrast, share_contrast, welch_from_stats
from mle_jax.tasks.medals import any_medal_over_seeds
from mle_jax.tasks.registry import get_spec

SEARCH_DIR = f"{RESULTS}/search-evidence"
SEARCH_TASKS = {"spooky": "spooky-author-identification", "pizza": "random-acts-of-pizza"}
CHECKPOINTS = {"initial": "warm start", "latest": "after RL"}
SEARCHES = tuple(POLICIES)  # every registered search policy (env/search.py)
EVIDENCE = tuple(f"{SEARCH_DIR}/{t}-{c}-{s}.json" for t in SEARCH_TASKS for c in CHECKPOINTS for s in SEARCHES)
# the prompted Qwen (issue 46), each task and search
QWEN_SEARCH = tuple(f"{RESULTS}/qwen-search/{t}-prompted-{s}.json" for t in SEARCH_TASKS for s in SEARCHES)
ML_AGENT = tuple(f"{SEARCH_DIR}/{t}-latest-aide-ml_agent.json" for t in SEARCH_TASKS)


def _task(table: Mapping[str, Any]) -> str:
    (task,) = table["summaries"]
    return task


def _label(table: Mapping[str, Any]) -> tuple[str, str, str]:
    cfg = table["search"]
    checkpoint = CHECKPOINTS[cfg["policy_checkpoint"]]
    if cfg["policy_checkpoint"] == "initial" and "prompted" in cfg.get("model", ""):
        checkpoint = "prompted"  # a run without a warm start (evaluate.model_label)
    return _task(table), checkpoint, cfg["name"]


def render_search_evidence(*tables: dict) -> str:
    """One row per task, policy and search: the submissions over the seeds (valid rate, mean score in the task's
    metric, any-medal rate, each ± SE across seeds), the nodes' valid share and the share that printed a metric, the
    programs run and the wall time per search."""
    rows = []
    for t in tables:
        task, checkpoint, name = _label(t)
        s = t["summaries"][task]
        rows.append([
            task, checkpoint, f"`{name}`", s["seeds"], plus_minus(s["valid_rate"], s["valid_rate_se"], 2),
            plus_minus(s["mean_score"], s["mean_score_se"], 3), plus_minus(s["any_medal"], s["any_medal_se"], 2),
            number(s["node_valid_fraction"], 2), number(s["metric_printed_fraction"], 2),
            number(s["oracle_mean_score"], 3), s["programs_run"], number(s["mean_wall_s"], 0),
        ])  # fmt: skip
    header = ["task", "policy", "search", "seeds", "submission valid", "mean submitted score", "any medal",
              "nodes valid", "nodes with a printed metric", "best node's score (oracle, analysis)", "programs run",
              "wall s per search"]  # fmt: skip
    return markdown_table(header, rows)


def render_search_operators(*tables: dict) -> str:
    """What each operator's nodes came to (protocols.operator_outcomes), per task, policy and tree search: the share
    of draft, debug and improve nodes whose run did not fail, the share of improvements that printed (and, for
    analysis, scored) better than their parent, and the share of children that copied their parent's program."""
    rows = []
    for t in tables:
        task, checkpoint, name = _label(t)
        if name == "independent":
            continue
        s = t["summaries"][task]
        ops = s["operators"]
        rows.append([
            task, checkpoint, f"`{name}`", f"{ops['draft']} / {ops['debug']} / {ops['improve']}",
            *(number(s[k], 2) for k in ("draft_good", "debug_good", "improve_good", "improve_better_metric",
                                        "improve_better_score", "copies_parent")),
        ])  # fmt: skip
    header = ["task", "policy", "search", "nodes: draft / debug / improve", "drafts that ran", "debugs that ran",
              "improvements that ran", "improvements printing a better metric",
              "improvements scoring better (analysis)", "children copying their parent"]  # fmt: skip
    return markdown_table(header, rows)


def share_over_seeds(rate_a: float | None, seeds_a: int, rate_b: float | None, seeds_b: int) -> Contrast | None:
    """A rate over seeds (each seed's submission valid, or with a medal) a − b by Fisher's exact test."""
    if rate_a is None or rate_b is None or not seeds_a or not seeds_b:
        return None
    return share_contrast(round(rate_a * seeds_a), seeds_a, round(rate_b * seeds_b), seeds_b)


def mean_over_seeds(a: Mapping[str, Any], b: Mapping[str, Any], sign: float = 1.0) -> Contrast | None:
    """sign * (a's mean submitted score − b's) over their valid seeds by Welch's test from each summary's mean and SE
    (protocols.search_summary); None with fewer than 2 valid seeds in an arm."""
    na, nb = round(a["valid_rate"] * a["seeds"]), round(b["valid_rate"] * b["seeds"])
    if a["mean_score"] is None or b["mean_score"] is None or na < 2 or nb < 2:
        return None
    x = welch_from_stats(a["mean_score"], a["mean_score_se"] or 0.0, na, b["mean_score"], b["mean_score_se"] or 0.0, nb)
    return dataclasses.replace(x, diff=sign * x.diff)


def verdict(x: Contrast | None) -> str:
    """A contrast's cell: the difference, its test and p, and whether it shows beyond noise (p < ALPHA)."""
    if x is None:
        return "— (fewer than 2 valid seeds)"
    if x.p is None:
        return f"{signed(x.diff, 3)} (no test: both arms alike in every seed)"
    test = "Fisher" if x.test == "fisher" else "Welch"
    return f"{signed(x.diff, 3)} ({test} p = {x.p:.2g}, {'beyond' if x.beyond_noise else 'within'} noise)"


def render_search_contrasts(*tables: dict) -> str:
    """Each search against `independent` at the same budget, per task and policy, the seeds the unit: the difference
    of the mean submitted score (signed so that + is better in the task's direction; Welch), of the valid rate and of
    the any-medal rate (Fisher), each with its p and whether it shows beyond noise (p < ALPHA)."""
    by = {_label(t): t for t in tables}
    rows = []
    for (task, checkpoint, name), t in by.items():
        base = by.get((task, checkpoint, "independent"))
        if name == "independent" or base is None:
            continue
        s, b = t["summaries"][task], base["summaries"][task]
        sign = -1.0 if get_spec(task).lower_is_better else 1.0
        rows.append([
            task, checkpoint, f"`{name}` − `independent`", f"{s['seeds']} / {b['seeds']}",
            verdict(mean_over_seeds(s, b, sign)),
            verdict(share_over_seeds(s["valid_rate"], s["seeds"], b["valid_rate"], b["seeds"])),
            verdict(share_over_seeds(s["any_medal"], s["seeds"], b["any_medal"], b["seeds"])),
        ])  # fmt: skip
    header = ["task", "policy", "contrast", "seeds", "mean submitted score (+ is better)", "submission valid",
              "any medal"]  # fmt: skip
    return markdown_table(header, rows)


def render_search_lite(*tables: dict) -> str:
    """MLE-bench's form per policy and search: each task's any-medal rate ± SE over the seeds and the aggregate over
    the Lite tasks we have (both are in Lite): per seed the share of the tasks with a medal, mean ± SE over seeds."""
    groups: dict[tuple[str, str], dict[str, dict]] = {}
    for t in tables:
        task, checkpoint, name = _label(t)
        groups.setdefault((checkpoint, name), {})[task] = t
    tasks = list(dict.fromkeys(_task(t) for t in tables))
    rows = []
    for (checkpoint, name), by_task in groups.items():
        cells = []
        for task in tasks:
            row = by_task[task]["tasks"][0] if task in by_task else None
            cells.append(plus_minus(row["any_medal"], row["any_medal_se"], 2) if row else "—")
        lite = any_medal_over_seeds({task: by_task[task]["tasks"][0]["levels_by_seed"] for task in by_task})
        rows.append([checkpoint, f"`{name}`", *cells, plus_minus(lite["any_medal"], lite["any_medal_se"], 2)])
    header = ["policy", "search", *(f"{t} any medal" for t in tasks), f"Lite aggregate ({len(tasks)} tasks)"]
    return markdown_table(header, rows)


def render_search_ml_agent(*tables: dict) -> str:
    """ML-Agent's form: per task the average and the best of 8 runs' submitted scores in the task's metric, beside
    ML-Agent's Table 1 figures where it has the task (another model, agent and budget)."""
    rows = []
    for t in tables:
        cfg = t["search"]
        ours = f"`{cfg['name']}`, {cfg['budget']} programs, {CHECKPOINTS[cfg['policy_checkpoint']]}"
        for r in t["rows"]:
            theirs = r.get("ml_agent")
            rows.append([
                r["task"], r["direction"], ours,
                r["split"], f"{r['valid_runs']} of {r['runs']}", number(r["average"], 4), number(r["best"], 4),
                f"{theirs['average']} / {theirs['best']} ({theirs['split']})" if theirs else "—",
            ])  # fmt: skip
    header = ["task", "metric", "ours: search, budget per run, policy", "split (ours)", "valid runs", "average",
              "best", "ML-Agent-7B average / best (its split)"]  # fmt: skip
    return markdown_table(header, rows)


def search_wall_figure(*tables: dict) -> str:
    """The evidence's total wall time (the evaluate processes' searches), in minutes, in one line."""
    return f"{sum(t['search']['wall_s'] for t in tables) / 60:.0f} min"
