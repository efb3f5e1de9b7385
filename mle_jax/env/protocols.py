"""How the field reports ML-engineering agents, over searches (mle_jax/env/search.py) repeated with several seeds.

- `search_summary`: one task's searches over seeds: the share of seeds whose submission is valid, the mean of the
  submitted scores, the any-medal rate (each with its standard error across seeds), the medal levels' shares, and
  the programs run and wall time.
- `ml_agent_table` (``--protocol ml_agent``): ML-Agent's (arXiv 2505.23723, Table 1) form: 8 runs per task, the
  average and the best of the runs' submitted scores in the task's own metric and direction, the tasks split into
  held-in (the run trained on them) and held-out; ML-Agent's figures beside ours where the task is shared, with
  their own split (its repository's README, MASWorks/ML-Agent: 9 training tasks, 10 testing tasks) and labelled as a
  different model (Qwen2.5-7B after their RL) and budget.
- `mlebench_table` (``--protocol mlebench``): MLE-bench's leaderboard form (openai/mle-bench, README "Benchmarking":
  at least 3 seeds, the Any Medal (%) as the mean ± one standard error of the mean): per task the share of seeds
  whose submission earns each level; per seed the share of the tasks with any medal, whose mean and standard error
  over the seeds are the aggregate, over the Lite (low-complexity) tasks we have and over all the tasks evaluated.
  Labelled with the budget and the model: a search of a few programs is not the leaderboard's 24-hour run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mle_jax.tasks.medals import LEVELS, MEDALS, any_medal_over_seeds

PROTOCOLS: tuple[str, ...] = ("ml_agent", "mlebench")
ML_AGENT_RUNS = 8  # ML-Agent reports each task over 8 runs
MLEBENCH_MIN_SEEDS = 3  # MLE-bench: "Repeat each evaluation with at least 3 seeds"

# ML-Agent (arXiv 2505.23723), Table 1, for the tasks we also have: ML-Agent-7B's average and best over 8 runs, in
# the task's metric (log loss: lower is better). Both tasks are among its held-out (testing) tasks.
ML_AGENT_TABLE1: dict[str, dict[str, float]] = {
    "leaf-classification": {"average": 0.0689, "best": 0.0373},
    "spooky-author-identification": {"average": 0.4415, "best": 0.4078},
}
ML_AGENT_MODEL = "ML-Agent (Qwen2.5-7B after its RL; MLAgentBench-style agent steps, its own budget)"
# MASWorks/ML-Agent README: its training (held-in) and testing (held-out) tasks among ours
ML_AGENT_HELD_IN: frozenset[str] = frozenset({"plant-pathology-2020-fgvc7", "nomad2018-predict-transparent-conductors"})
ML_AGENT_HELD_OUT: frozenset[str] = frozenset({
    "leaf-classification", "learning-agency-lab-automated-essay-scoring-2", "detecting-insults-in-social-commentary",
    "spooky-author-identification", "us-patent-phrase-to-phrase-matching", "tabular-playground-series-dec-2021",
})  # fmt: skip

# MLE-bench Lite: the low-complexity split (openai/mle-bench, experiments/splits/low.txt), 22 competitions
MLEBENCH_LITE: tuple[str, ...] = (
    "aerial-cactus-identification", "aptos2019-blindness-detection", "denoising-dirty-documents",
    "detecting-insults-in-social-commentary", "dog-breed-identification", "dogs-vs-cats-redux-kernels-edition",
    "histopathologic-cancer-detection", "jigsaw-toxic-comment-classification-challenge", "leaf-classification",
    "mlsp-2013-birds", "new-york-city-taxi-fare-prediction", "nomad2018-predict-transparent-conductors",
    "plant-pathology-2020-fgvc7", "random-acts-of-pizza", "ranzcr-clip-catheter-line-classification",
    "siim-isic-melanoma-classification", "spooky-author-identification", "tabular-playground-series-dec-2021",
    "tabular-playground-series-may-2022", "text-normalization-challenge-english-language",
    "text-normalization-challenge-russian-language", "the-icml-2013-whale-challenge-right-whale-redux",
)  # fmt: skip


def mean_se(xs: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, standard error of the mean) of `xs` (shape [n]); (None, None) when empty, SE None for one value."""
    x = np.asarray(xs, np.float64)
    if x.size == 0:
        return None, None
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else None


def submitted_level(search: Mapping[str, Any]) -> str | None:
    """The MLE-bench level of a search's submission (gold ... none), None for an invalid one."""
    sub = search["submitted"]
    return sub["medal"] if sub["valid"] else None


def search_summary(searches: Sequence[Mapping[str, Any]], lower_is_better: bool) -> dict:
    """One task's searches (search.Search.record(), one per seed): the submissions' valid rate, mean score (over the
    valid ones), best score and any-medal rate, each mean with its SE across seeds; the share of seeds at each level
    (and invalid); the nodes' valid fraction, the programs run and the wall time per search."""
    subs = [s["submitted"] for s in searches]
    valid = [1.0 if s["valid"] else 0.0 for s in subs]
    scores = [float(s["score"]) for s in subs if s["valid"]]
    levels = [submitted_level(s) for s in searches]
    medals = [1.0 if lv in MEDALS else 0.0 for lv in levels]
    nodes = [n for s in searches for n in s["nodes"]]
    oracle = [_best([n["score"] for n in s["nodes"] if n["valid"]], lower_is_better) for s in searches]
    n = max(len(searches), 1)
    vr, vr_se = mean_se(valid)
    ms, ms_se = mean_se(scores)
    am, am_se = mean_se(medals)
    return {
        "seeds": len(searches),
        "valid_rate": vr,
        "valid_rate_se": vr_se,
        "mean_score": ms,
        "mean_score_se": ms_se,
        "best_score": _best(scores, lower_is_better),
        "any_medal": am,
        "any_medal_se": am_se,
        "levels": {**{lv: levels.count(lv) / n for lv in LEVELS}, "invalid": levels.count(None) / n},
        "node_valid_fraction": sum(1 for x in nodes if x["valid"]) / max(len(nodes), 1),
        "node_buggy_fraction": sum(1 for x in nodes if x["buggy"]) / max(len(nodes), 1),
        "metric_printed_fraction": sum(1 for x in nodes if x["metric"] is not None) / max(len(nodes), 1),
        # analysis only: the best node by the grader's score (what an oracle would have submitted)
        "oracle_mean_score": mean_se([x for x in oracle if x is not None])[0],
        "operators": {op: sum(1 for x in nodes if x["operator"] == op) for op in ("draft", "debug", "improve")},
        **operator_outcomes(searches, lower_is_better),
        "programs_run": sum(s["programs_run"] for s in searches),
        "mean_wall_s": mean_se([s["wall_s"] for s in searches])[0],
    }


def operator_outcomes(searches: Sequence[Mapping[str, Any]], lower_is_better: bool) -> dict:
    """What each operator's nodes came to, over a task's searches: the share of the draft, debug and improve nodes
    whose run did not fail (`good`); of the improvements of a node with a printed metric, the share that printed a
    better one (`improve_better_metric`; public) and, for analysis, the share the grader scored better
    (`improve_better_score`); and the share of debug and improve nodes whose program is their parent's, unchanged
    (`copies_parent`: a policy that does not act on the prompt's output)."""
    sign = -1.0 if lower_is_better else 1.0
    out: dict[str, float | None] = {}
    children = []
    for op in ("draft", "debug", "improve"):
        nodes = [n for s in searches for n in s["nodes"] if n["operator"] == op]
        out[f"{op}_good"] = sum(1 for n in nodes if not n["buggy"]) / len(nodes) if nodes else None
    for s in searches:
        by_id = {n["id"]: n for n in s["nodes"]}
        children += [(n, by_id[n["parent"]]) for n in s["nodes"] if n["parent"] is not None]
    improve = [(c, p) for c, p in children if c["operator"] == "improve"]
    for key, field in (("improve_better_metric", "metric"), ("improve_better_score", "score")):
        pairs = [(c[field], p[field]) for c, p in improve if p[field] is not None]
        better = sum(1 for c, p in pairs if c is not None and sign * c > sign * p)
        out[key] = better / len(pairs) if pairs else None
    same = [c.get("code") is not None and c.get("code") == p.get("code") for c, p in children]
    out["copies_parent"] = sum(same) / len(same) if same else None
    return out


def _best(scores: Sequence[float | None], lower_is_better: bool) -> float | None:
    xs = [x for x in scores if x is not None]
    return (min if lower_is_better else max)(xs) if xs else None


def ml_agent_table(
    per_task: Mapping[str, Sequence[Mapping[str, Any]]], lower_is_better: Mapping[str, bool], trained_on: Sequence[str]
) -> dict:
    """ML-Agent's form: per task its runs' submitted scores, their average and best in the task's direction (over
    the valid runs; how many were valid beside), held-in (a task the run trained on) or held-out, and ML-Agent's
    Table 1 figures where the task is shared (with ML-Agent's own split)."""
    rows = []
    for task, searches in per_task.items():
        scores = [s["submitted"]["score"] if s["submitted"]["valid"] else None for s in searches]
        valid = [x for x in scores if x is not None]
        row = {
            "task": task,
            "split": "held-in" if task in trained_on else "held-out",
            "direction": "lower is better" if lower_is_better[task] else "higher is better",
            "runs": len(searches),
            "valid_runs": len(valid),
            "scores": scores,
            "average": float(np.mean(valid)) if valid else None,
            "best": _best(valid, lower_is_better[task]),
        }
        if task in ML_AGENT_TABLE1:
            split = "held-out" if task in ML_AGENT_HELD_OUT else "held-in" if task in ML_AGENT_HELD_IN else "?"
            row["ml_agent"] = {**ML_AGENT_TABLE1[task], "split": split, "model": ML_AGENT_MODEL}
        rows.append(row)
    return {"protocol": "ml_agent", "runs_per_task": ML_AGENT_RUNS, "rows": rows}


def mlebench_table(per_task: Mapping[str, Sequence[Mapping[str, Any]]], seeds: Sequence[int]) -> dict:
    """MLE-bench's form: per task the share of seeds at each level and the any-medal rate ± SE across seeds; the
    aggregates (Lite: the evaluated tasks in MLE-bench Lite; all: every evaluated task) as the mean ± SE over seeds
    of the share of the tasks whose submission earned any medal."""
    tasks = []
    for task, searches in per_task.items():
        levels = [submitted_level(s) for s in searches]
        n = max(len(levels), 1)
        am, am_se = mean_se([1.0 if lv in MEDALS else 0.0 for lv in levels])
        tasks.append({
            "task": task,
            "lite": task in MLEBENCH_LITE,
            "seeds": len(searches),
            "levels_by_seed": levels,
            "shares": {**{lv: levels.count(lv) / n for lv in LEVELS}, "invalid": levels.count(None) / n},
            "any_medal": am,
            "any_medal_se": am_se,
            "valid_rate": sum(1 for lv in levels if lv is not None) / n,
        })  # fmt: skip

    def aggregate(names: Sequence[str]) -> dict:
        return any_medal_over_seeds({t: [submitted_level(s) for s in per_task[t]] for t in names})

    return {
        "protocol": "mlebench",
        "seeds": list(seeds),
        "tasks": tasks,
        "lite": aggregate([t for t in per_task if t in MLEBENCH_LITE]),
        "all": aggregate(list(per_task)),
    }
