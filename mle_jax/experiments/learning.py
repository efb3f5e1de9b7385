"""Does RL on the real loop make the agent better, and do the duration weights matter there?

    python -m mle_jax.experiments.learning --config=configs/pizza.py:cpu --out DIR [--quick] [--config.x=y ...]
        [--warm_start OTHER_DIR]   (start from OTHER_DIR's warm-started policy instead of making one)
        [--algorithms=ppo,grpo --duration_weights=batch_mean,off]   (one arm per pair)

The real loop, on real data, from one warm-started policy: the embedded run's sandbox, grader, frozen LM
instrumenter, sampler and learner, in arms with the same seed that differ only in the objective
(`learner.algorithm`, each of --algorithms) and `ppo.duration_weights` (each of --duration_weights). An arm is
named `{algorithm}_{weights}` (say `grpo_batch_mean`); the default, PPO with "batch_mean" (the paper's) and "off",
keeps the two arms' names from before algorithms were arms: `duration_weighted` and `unweighted`. The group
objectives need `--config.sampler.group_size` > 1, which then holds for every arm. The policy is evaluated
before RL (once: every arm starts from it, with the same seeds) and after RL in each arm, on `eval_samples`
scratch prompts with the same seeds. Written to DIR:

    summary.json   the command, the date and the wall time of the processes that measured it (`record_wall`);
                   per arm: before / after (mean_reward, se_reward, valid_fraction, mean_score, kinds), the
                   per-step series (reward, score, valid fraction, mean Δt, share of each solution kind),
                   executor utilisation, learner idle fraction, the instrumenter's LM / fallback shares, RL steps
                   per hour, the process's peak resident memory while the arm ran, and the mean of every
                   `stale/*` metric the learner reports; and the corpus's kinds of solution measured on this
                   machine (Δt and score per family)
    plots/*.png    score and reward over RL steps (the paper's Fig. 5), the share of each kind over steps
                   (Fig. 2/8), Δt over steps
    report.md      the figures above in a page

Everything is resumable: the warm start, each arm's RL (checkpoints) and each evaluation are cached in DIR,
so a killed experiment started again with the same command continues.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from absl import app, flags, logging
from flax import nnx
from matplotlib import colormaps
from matplotlib.figure import Figure
from ml_collections import ConfigDict

from mle_jax.env.evaluation import evaluate, standard_error
from mle_jax.env.rollout import Environment
from mle_jax.infra.checkpoint import Checkpointer
from mle_jax.infra.metrics import MetricsWriter, read_metrics
from mle_jax.instrument import pyast
from mle_jax.reporting import provenance
from mle_jax.reporting.markdown import markdown_table
from mle_jax.reporting.report import MEDAL_HEADER, medal_row, paper_line
from mle_jax.rl import objectives
from mle_jax.rl.loop import AsyncRLLoop
from mle_jax.rl.ppo import DURATION_MODES
from mle_jax.run import builders, environment
from mle_jax.run.cli import config_flag, parse_flags
from mle_jax.run.settings import RunSettings, from_config
from mle_jax.sampling.jax_sampler import JaxSampler
from mle_jax.warmstart.programs import full_grid, solution_kind

# the objectives behind config.learner.algorithm (issue 21); "ppo" is the paper's, with its critic
ALGORITHMS = tuple(objectives.OBJECTIVES)
GROUPED = tuple(name for name, o in objectives.OBJECTIVES.items() if o.needs_groups)  # compare within a group
LEGACY_NAMES = {"batch_mean": "duration_weighted", "off": "unweighted"}  # PPO's two arms, as results_tables reads


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    algorithm: str  # config.learner.algorithm
    duration_weights: str  # config.ppo.duration_weights


def make_arms(algorithms: Sequence[str], duration_weights: Sequence[str]) -> list[Arm]:
    """One arm per (algorithm, weight mode) pair, algorithms first, named `{algorithm}_{weights}`. PPO alone with
    modes among batch_mean and off keeps the arms' names from before algorithms were arms (`duration_weighted`,
    `unweighted`), which the results tables and the README's runs read. ValueError (one line) on an unknown,
    repeated or missing algorithm or mode."""
    for flag, given, known in (
        ("--algorithms", algorithms, ALGORITHMS),
        ("--duration_weights", duration_weights, DURATION_MODES),
    ):
        if not given:
            raise ValueError(f"{flag} is empty; known: {','.join(known)}")
        unknown = [x for x in given if x not in known]
        if unknown:
            raise ValueError(f"{flag}: unknown {unknown[0]!r}; known: {','.join(known)}")
        if len(set(given)) < len(given):
            raise ValueError(f"{flag} names {sorted(x for x in set(given) if list(given).count(x) > 1)[0]!r} twice")
    legacy = list(algorithms) == ["ppo"] and set(duration_weights) <= set(LEGACY_NAMES)
    return [Arm(LEGACY_NAMES[w] if legacy else f"{a}_{w}", a, w) for a in algorithms for w in duration_weights]


DEFAULT_ARMS = make_arms(["ppo"], ["batch_mean", "off"])


def arm_config(cfg: ConfigDict, arm: Arm) -> ConfigDict:
    """The run config of an arm: `cfg` with the arm's `learner.algorithm` and `ppo.duration_weights`. ValueError
    (one line) for a group objective without groups, or an algorithm this config cannot take."""
    c = cfg.copy_and_resolve_references()
    c.ppo.duration_weights = arm.duration_weights
    if arm.algorithm in GROUPED and c.sampler.get("group_size", 1) < 2:
        raise ValueError(
            f"arm {arm.name}: {arm.algorithm} needs --config.sampler.group_size >= 2 (a group of one sample has "
            f"advantage 0 and nothing to learn from)"
        )
    if "learner" in c and "algorithm" in c.learner:
        c.learner.algorithm = arm.algorithm
    elif arm.algorithm != "ppo":
        raise ValueError(f"arm {arm.name}: this config has no learner.algorithm, so only ppo arms can run")
    return c


@dataclasses.dataclass(frozen=True)
class Scale:
    """How long the experiment runs: RL steps per arm and evaluation samples."""

    steps: int
    eval_samples: int


FULL = Scale(steps=20, eval_samples=64)
QUICK = Scale(steps=4, eval_samples=16)


def _cached(path: Path, compute: Callable[[], dict]) -> dict:
    if path.is_file():
        return json.loads(path.read_text())
    result = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return result


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


def eval_summary(result: dict, task_id: str) -> dict:
    """What the experiment reports of an evaluation: mean reward ± SE, valid fraction, score, kinds."""
    e = result["scratch"]
    return {
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
    }


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
    """Per RL step of an arm: reward, score, valid fraction, mean Δt, and the share of each solution kind
    among the B samples it trained on."""
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
                "valid_fraction": row.get("valid_fraction"),
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


def _smooth(x: np.ndarray, window: int) -> np.ndarray:
    if len(x) < window:
        return x
    kernel = np.ones(window) / window
    return np.convolve(np.pad(x, (window - 1, 0), mode="edge"), kernel, mode="valid")


def write_plots(summary: dict, out_dir: Path) -> list[Path]:
    """score and reward per step (Fig. 5), share of each kind per step (Fig. 2/8), Δt per step."""
    out_dir.mkdir(parents=True, exist_ok=True)
    arms = summary["arms"]
    paths = []
    fig = Figure(figsize=(11, 3.8), dpi=110)
    axes = fig.subplots(1, 3)
    for i, (name, arm) in enumerate(arms.items()):
        steps = [r["step"] for r in arm["steps"]]
        for ax, key, label in zip(
            axes,
            ("reward_mean", "score_mean", "valid_fraction"),
            ("mean reward", "mean score (valid)", "valid"),
            strict=True,
        ):
            ys = np.array([np.nan if r[key] is None else r[key] for r in arm["steps"]], float)
            ax.plot(steps, ys, color=f"C{i}", alpha=0.25)
            ax.plot(steps, _smooth(np.nan_to_num(ys, nan=np.nanmean(ys)), 5), color=f"C{i}", label=name)
            ax.set(xlabel="RL step", title=label)
    for ax, key in zip(axes, ("mean_reward", "mean_score", "valid_fraction"), strict=True):
        for i, arm in enumerate(arms.values()):
            before, after = arm["before"][key], arm["after"][key]
            if before is not None and after is not None:
                ax.axhline(before, color="k", ls=":", lw=1)
                ax.axhline(after, color=f"C{i}", ls="--", lw=1)
    axes[0].legend(fontsize=8)
    fig.suptitle("RL on the real loop (dotted: evaluation before RL, dashed: after RL; lines: 5-step means)")
    fig.tight_layout()
    paths.append(out_dir / "score_reward.png")
    fig.savefig(paths[-1])

    kinds = sorted({k for arm in arms.values() for r in arm["steps"] for k in r["kinds"]})
    fig = Figure(figsize=(5.5 * len(arms), 3.8), dpi=110)
    axes = np.atleast_1d(fig.subplots(1, len(arms)))
    for ax, (name, arm) in zip(axes, arms.items(), strict=True):
        steps = [r["step"] for r in arm["steps"]]
        shares = np.array([[r["kinds"].get(k, 0.0) for k in kinds] for r in arm["steps"]], float)
        if len(steps):
            smooth = np.stack([_smooth(shares[:, j], 5) for j in range(len(kinds))], axis=1)
            ax.stackplot(steps, smooth.T, labels=kinds, colors=colormaps["tab20"](np.arange(len(kinds)) % 20))
        ax.set(xlabel="RL step", ylabel="share of the batch (5-step mean)", title=name, ylim=(0, 1))
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle("kinds of solution the learner trained on (model families)")
    fig.tight_layout()
    paths.append(out_dir / "kinds.png")
    fig.savefig(paths[-1])

    fig = Figure(figsize=(6, 3.5), dpi=110)
    ax = fig.subplots()
    for i, (name, arm) in enumerate(arms.items()):
        steps = [r["step"] for r in arm["steps"]]
        dt = np.array([r["duration_s_mean"] for r in arm["steps"]], float)
        ax.plot(steps, dt, color=f"C{i}", alpha=0.25)
        ax.plot(steps, _smooth(dt, 5), color=f"C{i}", label=name)
    ax.set(xlabel="RL step", ylabel="seconds", title="mean run time Δt of the trained-on programs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(out_dir / "duration.png")
    fig.savefig(paths[-1])
    return paths


def run_arm(s: RunSettings, arm: Arm, initial: nnx.Module, base_env: Environment, out: Path) -> dict:
    """RL in one arm from the initial policy (resumed if its checkpoints exist), then its evaluation. `s`: the
    arm's settings (`arm_config`); its environment is `base_env` (the experiment's task, fleet and frozen
    instrumenter) with the arm policy's own sampler."""
    arm_dir = out / "arms" / arm.name
    s = dataclasses.replace(s, workdir=str(arm_dir))
    reset_peak_rss()
    policy = nnx.clone(initial)
    learner = builders.make_learner(s, policy)
    tokenizer, task, fleet = base_env.tokenizer, base_env.task, base_env.fleet
    sampler = builders.make_sampler(s.sampler, policy, tokenizer, arm_dir)
    env = dataclasses.replace(base_env, settings=s.rollout, sampler=sampler)
    writer = MetricsWriter(arm_dir, tensorboard=False)
    loop = AsyncRLLoop(s.loop, env, learner, Checkpointer(arm_dir / "checkpoints", keep=s.checkpoint_keep), writer)
    loop.restore()
    resumed_at = loop.counters.step
    loop.run(s.loop.steps)
    loop.close()
    c = loop.counters
    evaluated_here = not (arm_dir / "after.json").is_file()
    after_env = dataclasses.replace(env, sampler=JaxSampler(learner.policy_model(), tokenizer))  # eval seeds: fresh
    after = _cached(arm_dir / "after.json", lambda: evaluate(s.eval, after_env))
    stats = {
        "algorithm": arm.algorithm,
        "duration_weights": arm.duration_weights,
        "rl_wall_s": round(c.wall_s, 1),  # the loop's own clock, checkpointed: kept across resumes
        "steps_per_hour": round(c.step * 3600 / c.wall_s, 1) if c.wall_s > 0 else None,
        # the process's, while this arm ran (its RL and evaluation; the most over the processes that ran them)
        "peak_rss_gib": arm_peak_rss(arm_dir / "peak_rss.json", c.step > resumed_at or evaluated_here),
        "samples_drawn": c.sampled,
        "resampled_stale": c.resampled_stale,
        "infra_failures": c.infra_failures,
        "executor_utilization": round(min(1.0, c.exec_busy_s / max(c.wall_s * fleet.n_slots, 1e-9)), 3),
        "learner_idle_fraction": round(1 - c.update_s / max(c.wall_s, 1e-9), 3),
        "instrument_lm_share": instrument_shares(arm_dir)["lm"],  # of the programs that parse
        "time": {"wait_s": round(c.wait_s, 1), "update_s": round(c.update_s, 1), "sample_s": round(c.sample_s, 1)},
        "stale": stale_means(arm_dir),
    }
    return {"stats": stats, "after": eval_summary(after, task.id), "steps": step_series(arm_dir, task.id)}


def reset_peak_rss() -> None:
    """Restarts the kernel's count of this process's peak resident memory (VmHWM), where Linux allows it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # the peak is then the process's since it started


def peak_rss_gib() -> float | None:
    """This process's peak resident memory (VmHWM) since it started or since `reset_peak_rss`, in GiB."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), None)
    return None if kib is None else round(kib / 2**20, 2)


def arm_peak_rss(path: Path, worked: bool) -> float | None:
    """The arm's peak resident memory, kept in `path` across processes: when this process ran part of the arm
    (`worked`), the larger of its peak since `reset_peak_rss` and the recorded one; else the recorded one."""
    recorded = json.loads(path.read_text())["peak_rss_gib"] if path.is_file() else None
    if not worked:
        return recorded
    now = peak_rss_gib()
    peak = max((x for x in (recorded, now) if x is not None), default=None)
    path.write_text(json.dumps({"peak_rss_gib": peak}))
    return peak


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


def _scaled(s: RunSettings, workdir: Path, scale: Scale) -> RunSettings:
    return dataclasses.replace(
        s,
        workdir=str(workdir),
        loop=dataclasses.replace(s.loop, steps=scale.steps),
        eval=dataclasses.replace(s.eval, samples=scale.eval_samples, improve=False),
    )


def experiment(cfg: Any, out: Path, scale: Scale, arms: Sequence[Arm] = tuple(DEFAULT_ARMS)) -> dict:
    """Runs (or resumes) the whole experiment; returns the summary it writes to out/summary.json. A bad arm
    (`arm_config`) or config (ConfigError) fails before any work."""
    t_start = time.monotonic()
    measures = work_left(out, [arm.name for arm in arms])
    s = _scaled(from_config(cfg), out / "base", scale)
    arm_settings = {arm.name: _scaled(from_config(arm_config(cfg, arm)), out / "base", scale) for arm in arms}
    task, packages = environment.prepare(s)
    initial, tokenizer, ws_metrics = builders.build_policy(s, task, packages, out / "base")
    # the frozen instrumenter is the initial policy's; before RL, the initial policy is sampled afresh (eval seeds)
    with environment.open_environment(
        s, task, packages, initial, tokenizer, out / "base", sampler=JaxSampler(initial, tokenizer)
    ) as before_env:
        before = eval_summary(_cached(out / "before.json", lambda: evaluate(s.eval, before_env)), task.id)
        results = {}
        for arm in arms:
            results[arm.name] = {"before": before, **run_arm(arm_settings[arm.name], arm, initial, before_env, out)}
    verified = out / "base" / "warmstart" / "verified.jsonl"
    corpus, medians = {}, {}
    if verified.is_file():
        medians = corpus_medians(verified)
        # the kinds the evaluation counts (solution_kind), of each verified program's code
        kinds = {hashlib.sha256(it.code.encode()).hexdigest(): solution_kind(task.id, it.code)
                 for it in full_grid(task.id, packages)}  # fmt: skip
        corpus = corpus_kinds(verified, task.id, lambda rec: kinds.get(rec["sha256"], "other"))
    slow = slow_and_better(corpus, medians, task.lower_is_better)
    summary = {
        **record_wall(out, round(time.monotonic() - t_start, 1) if measures else None),
        "task": task.id,
        "scale": dataclasses.asdict(scale),
        "batch_size": s.loop.batch_size,
        "group_size": s.loop.group_size,
        "algorithms": sorted({arm.algorithm for arm in arms}, key=ALGORITHMS.index),
        "warmstart": ws_metrics,
        "corpus_kinds": corpus,
        "corpus_medians": medians,
        "slow_and_better": share_contrast(slow, results, scale.eval_samples),
        "lag_of_slow_and_better": {name: lag_of_kinds(out / "arms" / name, task.id, slow) for name in results},
        "arms": results,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    write_report(summary, out)
    return summary


def work_left(out: Path, arm_names: list[str]) -> bool:
    """Whether a process started on `out` measures anything: False when the before-RL evaluation and every
    arm's after-RL evaluation are cached (each is written after the stages before it), so that the process only
    regenerates summary.json and the report."""
    cached = [out / "before.json", *(out / "arms" / name / "after.json" for name in arm_names)]
    return not all(p.is_file() for p in cached)


def record_wall(out: Path, wall_s: float | None) -> dict[str, Any]:
    """The summary's provenance, from the ledger out/wall.jsonl: one line per process that measured something
    and finished (`wall_s` given; None for a process that only regenerated the summary, which adds nothing).

    Returns {"command", "date": of the last measuring process, "wall_s": the sum of their wall times,
    "processes": the ledger}. Wall times are recorded when measured and never recomputed: regenerating a
    summary keeps them. A process killed before it finished is not in the ledger. A folder whose summary
    predates the ledger keeps that summary's `wall_s_this_process` as it was.
    """
    ledger = out / "wall.jsonl"
    if wall_s is not None:
        provenance.append_jsonl(ledger, {"wall_s": wall_s})
    runs = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()] if ledger.is_file() else []
    if runs:
        return {"command": runs[-1]["command"], "date": runs[-1]["date"],
                "wall_s": round(sum(r["wall_s"] for r in runs), 1), "processes": runs}  # fmt: skip
    previous = out / "summary.json"
    if previous.is_file():
        old = json.loads(previous.read_text())
        return {k: old[k] for k in ("command", "date", "wall_s", "wall_s_this_process") if k in old}
    return {}


def share_warm_start(source: Path, out: Path) -> None:
    """Starts `out` from the warm start of the experiment in `source` (its base/ folder, linked): the same
    initial policy and instrumenter, none of its RL or evaluations."""
    base = source.resolve() / "base"
    if not (base / "warmstart" / "policy" / "DONE").is_file():
        raise app.UsageError(f"--warm_start={source}: no finished warm start in {base} (run that experiment first)")
    out.mkdir(parents=True, exist_ok=True)
    link = out / "base"
    if link.is_symlink() and link.resolve() == base:
        return
    if link.exists() or link.is_symlink():
        raise app.UsageError(f"--warm_start: {link} exists already; use a new --out")
    link.symlink_to(base)


def _pm(e: dict) -> str:
    return f"{e['mean_reward']:.2f} ± {e['se_reward']:.2f}" if e["se_reward"] is not None else "—"


def medal_lines(summary: dict) -> list[str]:
    """The report's MLE-bench medals of the evaluation samples: before RL (every arm's start) and after RL in each
    arm, the best sample's level and the share at each level; then the paper's Table 1 figures with theirs."""
    task, arms = summary["task"], summary["arms"]
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


def write_report(summary: dict, out: Path) -> Path:
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
            score = e["mean_score"] if e.get("se_score") is None else f"{e['mean_score']:.4f} ± {e['se_score']:.4f}"
            rows.append([name, when, _pm(e), e["valid_fraction"], score, e["best_score"]])
    header = ["arm", "", "mean reward ± SE", "valid fraction", "mean score of valid (± SE)", "best"]
    lines += ["", markdown_table(header, rows)]
    lines += medal_lines(summary)
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
                [name, *(f"{v[w][0]:.3f} ± {v[w][1]:.3f}" for w in ("before", "after"))]
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


_FLAGS: dict[str, Any] = {}  # defined when run as a program, so that importing this module defines no flags


def _define_flags() -> dict[str, Any]:
    return {
        "config": config_flag(),
        "out": flags.DEFINE_string("out", None, "output folder (resumes what is there)"),
        "quick": flags.DEFINE_bool(
            "quick", False, f"{QUICK.steps} steps and {QUICK.eval_samples} eval samples per arm"
        ),
        "steps": flags.DEFINE_integer("steps", 0, "RL steps per arm (0: the scale's)"),
        "eval": flags.DEFINE_integer("eval_samples", 0, "evaluation samples (0: the scale's)"),
        "warm": flags.DEFINE_string(
            "warm_start", "", "start from this other experiment folder's warm start (its base/)"
        ),
        "algorithms": flags.DEFINE_list(
            "algorithms", ["ppo"], f"objectives (learner.algorithm), one arm each per weight mode: {ALGORITHMS}"
        ),
        "weights": flags.DEFINE_list(
            "duration_weights", ["batch_mean", "off"], f"ppo.duration_weights modes, one arm each: {DURATION_MODES}"
        ),
    }


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    if _FLAGS["config"].value is None or not _FLAGS["out"].value:
        raise app.UsageError("--config and --out are required")
    scale = QUICK if _FLAGS["quick"].value else FULL
    scale = Scale(_FLAGS["steps"].value or scale.steps, _FLAGS["eval"].value or scale.eval_samples)
    out = Path(_FLAGS["out"].value)
    try:
        arms = make_arms(_FLAGS["algorithms"].value, _FLAGS["weights"].value)
        for arm in arms:
            from_config(arm_config(_FLAGS["config"].value, arm))
    except ValueError as e:  # ConfigError too: one line, before any work
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    if _FLAGS["warm"].value:
        share_warm_start(Path(_FLAGS["warm"].value), out)
    summary = experiment(_FLAGS["config"].value, out, scale, arms)
    for name, arm in summary["arms"].items():
        print(f"{name}: reward {_pm(arm['before'])} -> {_pm(arm['after'])}, valid "
              f"{arm['before']['valid_fraction']:.2f} -> {arm['after']['valid_fraction']:.2f}")  # fmt: skip
    print(f"report: {out / 'report.md'}")


if __name__ == "__main__":
    _FLAGS.update(_define_flags())
    app.run(main, flags_parser=parse_flags)
