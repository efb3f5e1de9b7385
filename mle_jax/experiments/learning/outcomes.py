"""What an arm's evaluations and logs say: the kinds of solution and how each fares, the corpus's kinds, the
slower-and-better kinds and their share, per-step series, version lags, instrumenter shares, staleness."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mle_jax.env.evaluation import standard_error
from mle_jax.infra.metrics import read_metrics
from mle_jax.instrument import pyast
from mle_jax.reporting.results_tables.turns import evaluated, revision_contrast
from mle_jax.reporting.statistics import paired_permutation
from mle_jax.tasks.registry import get_spec
from mle_jax.tasks.reward import task_scores
from mle_jax.warmstart.programs import solution_kind


def kind_shares(codes: list[str | None], task_id: str) -> dict[str, float]:
    """Share of each solution kind (model family; "no code") among the programs."""
    counts = Counter(solution_kind(task_id, c) for c in codes)
    return {k: v / max(len(codes), 1) for k, v in sorted(counts.items())}


def kind_outcomes(records: list[dict], task_id: str) -> dict[str, dict]:
    """Per kind of solution among a policy's own samples (evaluation records): how many, the share that was
    valid, the mean score of the valid ones, the mean reward and the mean Δt. A kind that is slower and better
    in the corpus is protected by the duration weights only if the policy also writes it well: its expected
    reward here is what RL sees."""
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(solution_kind(task_id, r["code"]), []).append(r)
    out = {}
    for kind, recs in sorted(by.items()):
        scores = [r["score"] for r in recs if r["valid"]]
        out[kind] = {
            "samples": len(recs),
            "valid_fraction": float(np.mean([bool(r["valid"]) for r in recs])),
            "score_mean": float(np.mean(scores)) if scores else None,
            "reward_mean": float(np.mean([r["reward"] for r in recs])),
            "duration_s_mean": float(np.mean([r["duration_s"] for r in recs])),
        }
    return out


def eval_summary(result: dict, task_id: str, failure: float = -10.0) -> dict:
    """What the experiment reports of an evaluation: mean reward ± SE, valid fraction, score, the paper's task
    score ± SE (`task_scores`: `failure` for an invalid sample, no partial credit), kinds."""
    e = result["scratch"]
    records = e["records"]
    ts = task_scores([bool(r["valid"]) for r in records], [r["score"] for r in records],
                     get_spec(task_id).lower_is_better, failure)  # fmt: skip
    return {
        "task_score_mean": float(ts.mean()) if ts.size else None,
        "task_score_se": standard_error(ts),
        "samples": e["samples"],
        "mean_reward": e["mean_reward"],
        "se_reward": e["se_reward"],
        "valid_fraction": e["valid_fraction"],
        "mean_score": e["mean"],
        "se_score": standard_error([r["score"] for r in e["records"] if r["valid"]]),
        "best_score": e["max"],
        "kinds": kind_shares([r["code"] for r in e["records"]], task_id),
        "valid_kinds": kind_shares([r["code"] for r in e["records"] if r["valid"]], task_id),
        "kind_outcomes": kind_outcomes(e["records"], task_id),
        # the evaluation's MLE-bench medals (absent from an evaluation made before them), and the paper's figures
        "medals": e.get("medals"),
        "paper": result.get("paper"),
        **({"episodes": episode_outcomes(result)} if "turns" in result else {}),
        # the submission handed in for each start prompt, in the evaluation's prompt order (the same prompts before
        # and after RL: `paired_by_prompt`); None where no reward came back
        "by_prompt": {"reward": [r["reward"] for r in records], "valid": [r["valid"] for r in records]},
    }


def paired_by_prompt(before: dict, after: dict) -> dict[str, Any] | None:
    """After against before RL in one run, paired by start prompt (both evaluations answer the same prompts in the
    same order): the sign-flip permutation test (`statistics.paired_permutation`) of the mean per-prompt difference
    of the reward and of validity (0/1), over the prompts both answered. None when either evaluation predates
    "by_prompt" or their prompt counts differ.

    before, after: `eval_summary` results (by_prompt: reward [n], valid [n]). Returns {"n", "reward", "valid"}, each
    test as {diff, test, p, n_a, n_b} (positive: after is higher)."""
    b, a = before.get("by_prompt"), after.get("by_prompt")
    if b is None or a is None or len(b["reward"]) != len(a["reward"]):
        return None
    both = [i for i, (x, y) in enumerate(zip(b["reward"], a["reward"], strict=True)) if x is not None and y is not None]
    if not both:
        return None
    out: dict[str, Any] = {"n": len(both)}
    for key in ("reward", "valid"):
        test = paired_permutation([float(a[key][i]) for i in both], [float(b[key][i]) for i in both])
        out[key] = dataclasses.asdict(test)
    return out


def proportion_se(p: float | None, n: int) -> float | None:
    """The standard error sqrt(p (1 - p) / n) of a share p of n; None without a share or with n = 0."""
    return None if p is None or n < 1 else float(np.sqrt(p * (1 - p) / n))


def episode_outcomes(result: dict) -> dict[str, Any]:
    """An evaluation of episodes (`evaluate` with agent.turns K > 1 or D > 1 draws per start prompt), as the
    revising-against-resampling experiment reports it: K and D, the programs run (responses with code, all turns and
    draws), the share of the n start prompts whose handed-in program is valid ± SE, the share with a medal ± SE, and
    by turn (K > 1: of the episodes that reached it) or by draw (D > 1: the d-th of each prompt's D) the valid fraction
    and mean Δt (s). For analysis only (never the agent's choice): the share valid and mean score had the best turn
    or draw by the private score been handed in."""
    e, ep, dr = result["scratch"], result.get("episodes"), result.get("draw_samples")
    n = e["samples"]
    all_records = (ep or {}).get("records") or (dr or {}).get("records") or e["records"]
    p, medal = e["valid_fraction"], (e.get("medals") or {}).get("any_medal")
    best = (ep or {}).get("best_turn_private") or (dr or {}).get("best_draw_private")
    return {
        "turns": result["turns"],
        "draws": result["draws"],
        "programs_run": sum(1 for r in all_records if r.get("code") is not None),
        "valid_share": p,
        "valid_share_se": proportion_se(p, n),
        "any_medal": medal,
        "any_medal_se": proportion_se(medal, n),
        "by_turn": None if ep is None else {
            "valid_fraction": ep["valid_fraction_by_turn"], "duration_s": ep.get("duration_s_by_turn"),
            "reached": ep["episodes_reaching_turn"],
        },
        "by_draw": None if dr is None else {
            "valid_fraction": dr["valid_fraction_by_draw"], "duration_s": dr["duration_s_by_draw"],
        },
        "first_turn_valid": None if ep is None else ep["first_turn"]["valid_fraction"],
        "best_private": None if best is None else {"valid_share": best["valid_fraction"], "mean_score": best["mean"]},
    }  # fmt: skip


def _valid_records(verified_jsonl: Path) -> list[dict]:
    return [r for r in map(json.loads, verified_jsonl.read_text().splitlines()) if r.get("valid")]


def corpus_kinds(verified_jsonl: Path, task_id: str, grid_kind: Callable[[dict], str]) -> dict[str, dict]:
    """Per kind of solution (`grid_kind` of a verified.jsonl record) of the verified warm-start corpus: programs,
    mean and median Δt, and mean and median score on this machine."""
    by: dict[str, list[dict]] = {}
    for rec in _valid_records(verified_jsonl):
        by.setdefault(grid_kind(rec), []).append(rec)
    return {
        kind: {
            "programs": len(recs),
            "duration_s_mean": float(np.mean([r["duration_s"] for r in recs])),
            "duration_s_median": float(np.median([r["duration_s"] for r in recs])),
            "score_mean": float(np.mean([r["score"] for r in recs])),
            "score_median": float(np.median([r["score"] for r in recs])),
        }
        for kind, recs in sorted(by.items())
    }


def corpus_medians(verified_jsonl: Path) -> dict[str, float]:
    """The median Δt and score of the corpus's valid programs (empty when none is valid)."""
    recs = _valid_records(verified_jsonl)
    if not recs:
        return {}
    return {
        "duration_s": float(np.median([r["duration_s"] for r in recs])),
        "score": float(np.median([r["score"] for r in recs])),
    }


def slow_and_better(corpus: dict[str, dict], medians: dict[str, float], lower_is_better: bool) -> list[str]:
    """The corpus's kinds of solution that are slower and better: their median Δt above the corpus's median
    program's, and their median score better (in the task's direction) than the corpus's median program's.
    Medians, because one kind's failures (a log loss of 2 where the rest score 0.5) would move a mean past
    most kinds. These are the kinds the duration weights exist to protect; empty when the task has none.

    corpus: `corpus_kinds`' output; medians: `corpus_medians`' output."""
    if not medians:
        return []
    sign = -1.0 if lower_is_better else 1.0
    return sorted(
        k
        for k, v in corpus.items()
        if v["duration_s_median"] > medians["duration_s"] and sign * (v["score_median"] - medians["score"]) > 0
    )


def share_contrast(kinds: list[str], arms: dict[str, dict], samples: int) -> dict[str, Any]:
    """The share of `kinds` among each arm's evaluation samples before and after RL, each with its standard
    error sqrt(p (1 - p) / n), and the after-RL difference between the first two arms in standard errors of
    the difference (the paper's direction: the Δt-weighted arm, listed first, keeps more of them).

    arms: summary["arms"] (each with "before"/"after" holding "kinds": {kind: share}); samples: n per evaluation.
    Returns {"kinds", "arms": {name: {"before": [p, se], "after": [p, se]}}, "difference", "z"}."""
    out: dict[str, Any] = {"kinds": kinds, "arms": {}}
    for name, arm in arms.items():
        out["arms"][name] = {}
        for when in ("before", "after"):
            p = float(sum(arm[when]["kinds"].get(k, 0.0) for k in kinds))
            out["arms"][name][when] = [p, float(np.sqrt(p * (1 - p) / max(samples, 1)))]
    names = list(arms)
    if len(names) >= 2:
        p1, p2 = out["arms"][names[0]]["after"][0], out["arms"][names[1]]["after"][0]
        out["difference"] = p1 - p2
        pooled = (p1 + p2) / 2
        se = float(np.sqrt(2 * pooled * (1 - pooled) / max(samples, 1)))
        out["z"] = (p1 - p2) / se if se > 0 else None
    return out


def step_series(arm_dir: Path, task_id: str) -> list[dict]:
    """Per RL step of an arm: reward, score, the paper's task score, valid fraction, share of improve prompts,
    mean Δt, and the share of each solution kind among the B samples it trained on."""
    codes: dict[int, list[str | None]] = {}
    for rec in read_metrics(arm_dir / "samples.jsonl"):
        codes.setdefault(rec["step"], []).append(rec["code"])
    out = []
    for row in read_metrics(arm_dir / "metrics.jsonl"):
        out.append(
            {
                "step": row["step"],
                "reward_mean": row.get("reward/mean"),
                "score_mean": row.get("score/mean"),
                "task_score_mean": row.get("task_score/mean"),  # absent from runs logged before the metric
                "improve_fraction": row.get("improve_fraction"),
                "valid_fraction": row.get("valid_fraction"),
                # of the scratch samples trained on (None: the step trained on none, or was logged before the split)
                "valid_fraction_scratch": row.get("valid_fraction/scratch"),
                "duration_s_mean": row.get("duration_s/mean"),
                "version_lag_mean": row.get("version_lag/mean"),
                "duration_weight_max": row.get("learner/duration/weight_max"),
                "kinds": kind_shares(codes.get(row["step"], []), task_id),
            }
        )
    return out


def lag_of_kinds(arm_dir: Path, task_id: str, kinds: list[str]) -> dict[str, dict]:
    """How far behind the policy the programs of `kinds` were when the learner trained on them, against the
    others: mean version lag (the update's policy version minus the sampling one) and mean Δt, over the arm's
    samples.jsonl. Asynchronous RL biases the gradient toward fast programs only where slow ones return
    later, i.e. with a larger lag; with a deep queue on few sandbox slots, completion order is mostly queue
    order and the lags come out alike."""
    groups: dict[str, list[dict]] = {"kinds": [], "others": []}
    for rec in read_metrics(arm_dir / "samples.jsonl"):
        groups["kinds" if solution_kind(task_id, rec["code"]) in kinds else "others"].append(rec)
    return {
        name: {
            "samples": len(recs),
            "version_lag_mean": float(np.mean([r["step"] - 1 - r["version"] for r in recs])) if recs else None,
            "duration_s_mean": float(np.mean([r["duration_s"] for r in recs])) if recs else None,
        }
        for name, recs in groups.items()
    }


def instrument_shares(arm_dir: Path) -> dict[str, float | int]:
    """Over the programs an arm trained on (samples.jsonl): how many parse, and of those the share the frozen
    LM instrumented (its output accepted) and the share the AST fallback did. A program that does not parse
    has no place for a print, whichever instrumenter it meets (path "unparsed"; runs before that path existed
    logged it as "fallback", so parsing decides here)."""
    paths = [
        rec["instrument"]
        for rec in read_metrics(arm_dir / "samples.jsonl")
        if rec.get("code") and rec["instrument"] in ("lm", "fallback") and _parses(rec["code"])
    ]
    n = len(paths)
    return {
        "parsed": n,
        "lm": round(paths.count("lm") / n, 3) if n else float("nan"),
        "fallback": round(paths.count("fallback") / n, 3) if n else float("nan"),
    }


def _parses(code: str) -> bool:
    try:
        pyast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def stale_means(arm_dir: Path) -> dict[str, float]:
    """The mean over an arm's steps of every staleness metric the learner reports (`stale/*`; the loop logs the
    learner's as `learner/stale/*`), keyed without the `learner/` prefix; {} when it reports none."""
    values: dict[str, list[float]] = {}
    for row in read_metrics(arm_dir / "metrics.jsonl"):
        for k, v in row.items():
            name = k.removeprefix("learner/")
            if name.startswith("stale/") and v is not None:
                values.setdefault(name, []).append(float(v))
    return {k: float(np.mean(v)) for k, v in sorted(values.items())}


def spread(values: Sequence[float]) -> dict[str, Any]:
    """The mean of per-seed values and its standard error across seeds (None for one seed).

    values: [N], one per seed. Returns {"values", "mean", "se"}."""
    x = [float(v) for v in values]
    return {"values": x, "mean": float(np.mean(x)) if x else None, "se": standard_error(x)}


def arm_task_scores(repeats: Sequence[dict]) -> dict[str, Any]:
    """An arm's task scores over its N repeats (each `run_arm`'s result: "after" from `eval_summary`, "steps"
    from `step_series`).

    final: the after-RL evaluation's task score, per seed, with the mean across seeds and its SE across seeds,
    and `se_within`, the SE of that mean from the evaluations' own sampling (sqrt(sum of each seed's SE²) / N).
    curve: per seed, the mean over RL steps of the trained-on batches' task score (the area under Fig. 9's
    curve, per step), with its mean and SE across seeds. never_valid: how many of the N runs trained on no valid
    program in any step (the paper's sparse-reward failure). improve_trained: the share of improve prompts among
    the samples trained on (what the arm's prompt.improve_fraction became: no earlier solution, no improve prompt).
    reward, valid: per seed, the after-RL evaluation's mean reward (the −10 floor with the instrumenter's partial
    credit: what RL optimised, and what moves while no program is valid) and valid fraction, each a `spread`; None
    when an evaluation predates them."""
    final = spread([r["after"]["task_score_mean"] for r in repeats])
    ses = [r["after"].get("task_score_se") for r in repeats]
    final["se_within"] = float(np.sqrt(sum(s**2 for s in ses)) / len(ses)) if ses and None not in ses else None
    curves = [[s["task_score_mean"] for s in r["steps"] if s.get("task_score_mean") is not None] for r in repeats]
    curve = spread([np.mean(c) for c in curves]) if all(curves) else None
    never = sum(1 for r in repeats if not any((s.get("valid_fraction") or 0) > 0 for s in r["steps"]))
    shares = [s["improve_fraction"] for r in repeats for s in r["steps"] if s.get("improve_fraction") is not None]
    after = [r["after"] for r in repeats]
    reward = spread([a["mean_reward"] for a in after]) if all("mean_reward" in a for a in after) else None
    valid = spread([a["valid_fraction"] for a in after]) if all("valid_fraction" in a for a in after) else None
    return {"runs": len(repeats), "final": final, "curve": curve, "never_valid": never,
            "improve_trained": float(np.mean(shares)) if shares else None,
            "reward": reward, "valid": valid}  # fmt: skip


def revision_contrasts(arms: dict[str, dict], turns: Sequence[int], lower_is_better: bool) -> dict[str, dict]:
    """Revising against resampling at the same number of programs: for every arm split by --turns (`<arm>_t<K>`),
    each K above the smallest against the smallest (with --turns=1,3: K = 3 turns with feedback against the best of 3
    independent one-turn samples), before RL and after, each figure with its test
    (reporting/results_tables/turns.revision_contrast: positive means revising is better) as {diff, test, p, n_a,
    n_b} (None: not measured).

    arms: summary["arms"] (each "before"/"after" from `eval_summary`). Returns {"<arm>_t<K> vs <arm>_t<k0>": {...}}."""
    k0 = min(turns)
    out = {}
    for name in arms:
        for k in turns:
            suffix = f"_t{k}"
            if k == k0 or not name.endswith(suffix) or f"{name.removesuffix(suffix)}_t{k0}" not in arms:
                continue
            ref_name = f"{name.removesuffix(suffix)}_t{k0}"
            c: dict[str, Any] = {"arm": name, "reference": ref_name, "turns": k, "reference_turns": k0}
            for when in evaluated(arms[name]):  # before only, from a --before_only run
                tested = revision_contrast(arms[name][when], arms[ref_name][when], lower_is_better)
                c[when] = {key: None if x is None else dataclasses.asdict(x) for key, x in tested.items()}
            out[f"{name} vs {ref_name}"] = c
    return out
