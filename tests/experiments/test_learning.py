"""The learning experiment's bookkeeping: kinds per step from the loop's own logs, the summary's report and
plots, and starting from another experiment's warm start. (The experiment itself is the real loop; its runs
are in docs/results.md, with the command.)"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from absl import app
from ml_collections import ConfigDict
from scipy import stats

from configs import spooky
from mle_jax.experiments.learning.arms import (
    DEFAULT_ARMS,
    Arm,
    Scale,
    arm_config,
    make_arms,
    parse_arm,
    select_arms,
)
from mle_jax.experiments.learning.outcomes import (
    arm_task_scores,
    corpus_kinds,
    corpus_medians,
    eval_summary,
    instrument_shares,
    kind_outcomes,
    kind_shares,
    lag_of_kinds,
    paired_by_prompt,
    share_contrast,
    slow_and_better,
    stale_means,
    step_series,
)
from mle_jax.experiments.learning.plots import task_score_plot
from mle_jax.experiments.learning.progress import experiment_progress, partial_summary
from mle_jax.experiments.learning.report import ablation_lines, ablation_table, write_report
from mle_jax.experiments.learning.running import arm_peak_rss, record_wall, run_dir, share_warm_start, work_left
from mle_jax.infra.checkpoint import TMP_MARK, Checkpointer
from mle_jax.infra.metrics import MetricsWriter
from mle_jax.reporting.markdown import signed
from mle_jax.reporting.results_tables.ablations import (
    arm_contrasts,
    never_valid_figure,
    render_ablation_contrasts,
    render_ablation_table,
)
from mle_jax.reporting.results_tables.learning import (
    learning_progress_figure,
    paired_text,
    render_learning_progress,
    render_rl_arm_contrasts,
    render_rl_before_after,
    rl_contrast_figure,
)
from mle_jax.warmstart.programs import full_grid
from mle_jax.warmstart.programs.pizza import PIZZA
from tests.launch_forks import forked_runs

TASK = "random-acts-of-pizza"


def _program(family: str) -> str:
    return next(it.code for it in full_grid(PIZZA) if it.meta["model"] == family)


def test_kinds_are_the_model_families_of_the_programs_and_no_code_counts():
    codes = [_program("logreg"), _program("logreg"), _program("random_forest"), None]
    assert kind_shares(codes, TASK) == {"logreg": 0.5, "no code": 0.25, "random_forest": 0.25}
    assert kind_shares([], TASK) == {}


def _arm(tmp_path, name, rewards):
    writer = MetricsWriter(tmp_path / name, tensorboard=False)
    for step, r in enumerate(rewards, start=1):
        writer.write(step, {"reward/mean": r, "score/mean": 0.6, "valid_fraction": 0.5, "duration_s/mean": 5.0 + step})
        writer.write_samples(step, [{"code": _program("logreg")}, {"code": None}])
    writer.close()
    return step_series(tmp_path / name, TASK)


def test_step_series_and_report_from_the_loops_logs(tmp_path):
    steps = _arm(tmp_path, "duration_weighted", [-5.0, -4.0, -3.0])
    assert [r["step"] for r in steps] == [1, 2, 3] and [r["reward_mean"] for r in steps] == [-5.0, -4.0, -3.0]
    assert steps[0]["kinds"] == {"logreg": 0.5, "no code": 0.5} and steps[2]["duration_s_mean"] == 8.0
    ev = {"samples": 4, "mean_reward": -2.0, "se_reward": 0.5, "valid_fraction": 0.75, "mean_score": 0.6,
          "best_score": 0.7, "kinds": {"logreg": 1.0}, "valid_kinds": {"logreg": 1.0},
          "kind_outcomes": {"logreg": {"samples": 4, "valid_fraction": 0.75, "score_mean": 0.6, "reward_mean": -2.0,
                                       "duration_s_mean": 3.5}}}  # fmt: skip
    stats = {"executor_utilization": 0.9, "learner_idle_fraction": 0.2, "instrument_lm_share": 0.1, "rl_wall_s": 9,
             "steps_per_hour": 1200.0, "peak_rss_gib": 1.25, "stale": {"stale/lag_slow": 2.5}}  # fmt: skip
    arms = {
        name: {"before": ev, "after": {**ev, "mean_reward": -1.0, "se_score": 0.05}, "stats": stats, "steps": steps}
        for name in ("duration_weighted", "unweighted")
    }
    summary = {"task": TASK, "scale": {"steps": 3, "eval_samples": 4}, "batch_size": 2, "arms": arms,
               "corpus_kinds": {"logreg": {"programs": 2, "duration_s_mean": 5.0, "score_mean": 0.65}},
               "warmstart": {"instrument_heldout_accept": 0.25, "instrument_heldout": 4}}  # fmt: skip
    summary["slow_and_better"] = share_contrast(["logreg"], arms, 4)
    group = {"samples": 2, "version_lag_mean": 1.5, "duration_s_mean": 8.0}
    summary["lag_of_slow_and_better"] = {name: {"kinds": group, "others": group} for name in arms}
    report = write_report(summary, tmp_path).read_text()
    assert "Slower and better than the corpus's median program" in report
    assert (
        "| 0.6000 ± 0.0500 |" in report
        and "| 1.000 ± 0.000 |" in report
        and "What the policy writes of each kind before RL" in report
    )
    assert "| logreg | 4 | 0.75 | 0.6 | -2 | 3.5 |" in report
    assert "How late the learner saw them" in report and "| unweighted | 1.5 | 1.5 | 8 | 8 |" in report
    assert "-2.00 ± 0.50" in report and "-1.00 ± 0.50" in report and "25% of 4 held-out" in report
    assert "| unweighted | 0.9 | 0.2 | 0.1 | 9 | 1200 | 1.25 |" in report  # steps per hour, peak memory
    assert "| arm | stale/lag_slow |" in report and "| duration_weighted | 2.5 |" in report
    for name in ("score_reward", "kinds", "duration"):
        assert (tmp_path / "plots" / f"{name}.png").stat().st_size > 1000 and f"plots/{name}.png" in report


def test_a_warm_start_is_shared_only_when_finished_and_never_over_another(tmp_path):
    source, out = tmp_path / "full", tmp_path / "quick"
    with pytest.raises(app.UsageError, match="no finished warm start"):
        share_warm_start(source, out)
    (source / "base" / "warmstart" / "policy").mkdir(parents=True)
    (source / "base" / "warmstart" / "policy" / "DONE").write_text("{}")
    share_warm_start(source, out)
    assert (out / "base" / "warmstart" / "policy" / "DONE").is_file()
    share_warm_start(source, out)  # the same link again: resuming
    other = tmp_path / "other"
    (other / "base").mkdir(parents=True)
    with pytest.raises(app.UsageError, match="exists already"):
        share_warm_start(source, other)


def test_instrument_shares_count_only_programs_that_parse(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=False)
    good = _program("logreg")
    writer.write_samples(1, [{"code": good, "instrument": "lm"}, {"code": good, "instrument": "fallback"}])
    writer.write_samples(2, [{"code": "x = (", "instrument": "fallback"}, {"code": "x = (", "instrument": "unparsed"}])
    writer.write_samples(2, [{"code": None, "instrument": "off"}, {"code": good, "instrument": "lm"}])
    writer.close()
    assert instrument_shares(tmp_path) == {"parsed": 3, "lm": 0.667, "fallback": 0.333}


def _kind(duration, score, programs=2):
    return {"programs": programs, "duration_s_median": duration, "score_median": score}


def test_slow_and_better_kinds_have_median_time_above_and_median_score_better_than_the_corpus_median():
    corpus = {  # spooky-like, log loss (lower is better); corpus median program: Δt 4.0 s, score 0.55
        "nb word": _kind(2.0, 0.60),
        "nb word+char": _kind(4.0, 0.45),  # not slower than the median program
        "logreg word+char": _kind(16.0, 0.70),  # slower, worse
        "sgd char": _kind(5.0, 2.05),  # slower, far worse: one such kind must not move the threshold
        "svm word+char": _kind(7.0, 0.50),  # slower and better
    }
    medians = {"duration_s": 4.0, "score": 0.55}
    assert slow_and_better(corpus, medians, lower_is_better=True) == ["svm word+char"]
    assert slow_and_better(corpus, medians, lower_is_better=False) == ["logreg word+char", "sgd char"]
    assert slow_and_better(corpus, {}, lower_is_better=True) == []


def test_corpus_kinds_and_medians_read_the_verified_programs(tmp_path):
    recs = [
        {"sha256": "a", "valid": True, "duration_s": 1.0, "score": 0.5},
        {"sha256": "b", "valid": True, "duration_s": 3.0, "score": 0.7},
        {"sha256": "c", "valid": True, "duration_s": 10.0, "score": 0.9},
        {"sha256": "d", "valid": False, "duration_s": 0.1, "score": None},
    ]
    path = tmp_path / "verified.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    kinds = corpus_kinds(path, TASK, lambda r: "fast" if r["sha256"] in "ab" else "slow")
    assert kinds["fast"] == {"programs": 2, "duration_s_mean": 2.0, "duration_s_median": 2.0, "score_mean": 0.6,
                             "score_median": 0.6} and kinds["slow"]["programs"] == 1  # fmt: skip
    assert corpus_medians(path) == {"duration_s": 3.0, "score": 0.7}
    assert slow_and_better(kinds, corpus_medians(path), lower_is_better=False) == ["slow"]


def test_share_contrast_gives_each_arms_share_with_its_standard_error_and_the_difference_in_ses():
    def ev(shares):
        return {"kinds": shares}

    arms = {
        "duration_weighted": {"before": ev({"a": 0.25}), "after": ev({"a": 0.5, "b": 0.25, "c": 0.25})},
        "unweighted": {"before": ev({"a": 0.25}), "after": ev({"a": 0.25, "c": 0.75})},
    }
    c = share_contrast(["a", "b"], arms, samples=64)
    assert c["arms"]["duration_weighted"]["after"] == pytest.approx([0.75, (0.75 * 0.25 / 64) ** 0.5])
    assert c["arms"]["unweighted"]["before"] == pytest.approx([0.25, (0.25 * 0.75 / 64) ** 0.5])
    assert c["difference"] == pytest.approx(0.5)
    assert c["z"] == pytest.approx(0.5 / (2 * 0.5 * 0.5 / 64) ** 0.5)  # pooled p = 0.5
    assert share_contrast([], arms, 64)["difference"] == 0.0 and share_contrast([], arms, 64)["z"] is None


def test_kind_outcomes_are_what_the_policy_writes_of_each_kind():
    lr, rf = _program("logreg"), _program("random_forest")
    records = [
        {"code": lr, "valid": True, "score": 0.6, "reward": 0.6, "duration_s": 2.0},
        {"code": lr, "valid": False, "score": None, "reward": -9.8, "duration_s": 0.5},
        {"code": rf, "valid": True, "score": 0.7, "reward": 0.7, "duration_s": 9.0},
        {"code": None, "valid": False, "score": None, "reward": -10.0, "duration_s": 0.0},
    ]
    out = kind_outcomes(records, TASK)
    assert out["logreg"] == pytest.approx(
        {"samples": 2, "valid_fraction": 0.5, "score_mean": 0.6, "reward_mean": -4.6, "duration_s_mean": 1.25}
    )
    assert out["random_forest"]["reward_mean"] == 0.7 and out["no code"]["score_mean"] is None


def test_lag_of_kinds_compares_how_late_the_learner_saw_the_kinds(tmp_path):
    lr, rf = _program("logreg"), _program("random_forest")
    writer = MetricsWriter(tmp_path, tensorboard=False)
    writer.write_samples(1, [{"code": lr, "version": 0, "duration_s": 1.0}])  # lag 0
    writer.write_samples(
        3, [{"code": rf, "version": 0, "duration_s": 9.0}, {"code": lr, "version": 2, "duration_s": 2.0}]
    )
    writer.write_samples(
        4, [{"code": rf, "version": 2, "duration_s": 7.0}, {"code": None, "version": 3, "duration_s": 0}]
    )
    writer.close()
    out = lag_of_kinds(tmp_path, TASK, ["random_forest"])
    assert out["kinds"] == {"samples": 2, "version_lag_mean": 1.5, "duration_s_mean": 8.0}
    assert out["others"] == {"samples": 3, "version_lag_mean": 0.0, "duration_s_mean": 1.0}
    assert lag_of_kinds(tmp_path, TASK, [])["kinds"] == {
        "samples": 0,
        "version_lag_mean": None,
        "duration_s_mean": None,
    }


def test_eval_summary_gives_the_standard_error_of_the_valid_scores():
    lr = _program("logreg")
    records = [
        {"code": lr, "valid": True, "score": 0.5, "reward": 0.5, "duration_s": 1.0},
        {"code": lr, "valid": True, "score": 0.7, "reward": 0.7, "duration_s": 1.0},
        {"code": None, "valid": False, "score": None, "reward": -10.0, "duration_s": 0.0},
    ]
    result = {"scratch": {"samples": 3, "mean_reward": -2.93, "se_reward": 3.5, "valid_fraction": 2 / 3, "mean": 0.6,
                          "max": 0.7, "records": records}}  # fmt: skip
    e = eval_summary(result, TASK)
    assert e["se_score"] == pytest.approx(0.1) and e["kinds"] == {"logreg": 2 / 3, "no code": 1 / 3}
    assert e["task_score_mean"] == pytest.approx((0.5 + 0.7 - 10.0) / 3)  # the invalid sample: -10, no credit
    assert e["task_score_se"] == pytest.approx(float(np.std([0.5, 0.7, -10.0], ddof=1) / np.sqrt(3)))
    assert eval_summary(result, "spooky-author-identification")["task_score_mean"] == pytest.approx(-11.2 / 3)
    assert eval_summary({"scratch": {**result["scratch"], "records": records[:1]}}, TASK)["se_score"] is None


def test_after_against_before_is_paired_by_start_prompt_and_reported_per_seed(tmp_path):
    """The same prompts in the same order before and after: the per-prompt differences, a prompt without a reward
    in either left out; the p-value is scipy's sign-flip test of those differences; no pairing for an evaluation
    from before by_prompt, or of another size."""
    rewards_b = [-10.0, -9.8, -10.0, -9.9, -10.0, 0.6, -9.7, -10.0]
    rewards_a = [-9.5, 0.7, -9.0, -9.9, -9.6, 0.65, -9.2, -9.9]

    def summary(rewards):
        records = [{"code": None, "valid": r is not None and r > 0, "score": r if r and r > 0 else None, "reward": r,
                    "duration_s": 1.0} for r in rewards]  # fmt: skip
        scratch = {"samples": len(records), "mean_reward": -5.0, "se_reward": 1.0, "valid_fraction": 0.2, "mean": 0.6,
                   "max": 0.6, "records": records}  # fmt: skip
        return eval_summary({"scratch": scratch}, TASK)

    before, after = summary(rewards_b), summary(rewards_a)
    assert paired_by_prompt(before, after)["n"] == 8
    # a prompt whose run returned no reward (before: prompt 2; after: prompt 7) is left out of the pairs
    before["by_prompt"]["reward"][2] = after["by_prompt"]["reward"][7] = None
    paired = paired_by_prompt(before, after)
    both = [0, 1, 3, 4, 5, 6]
    d = np.array([rewards_a[i] - rewards_b[i] for i in both])
    ref = stats.permutation_test((d,), np.mean, permutation_type="samples", n_resamples=np.inf).pvalue
    assert paired["n"] == 6 and paired["reward"]["diff"] == pytest.approx(d.mean())
    assert paired["reward"]["p"] == pytest.approx(ref) and paired["reward"]["test"] == "paired permutation"
    assert paired["valid"]["diff"] == pytest.approx(1 / 6)  # prompt 1 became valid; prompt 5 stayed valid
    assert paired_by_prompt({k: v for k, v in before.items() if k != "by_prompt"}, after) is None
    assert paired_by_prompt(before, summary(rewards_a[:4])) is None
    steps = _arm(tmp_path, "duration_weighted", [-5.0, -4.0])
    repeats = [{"seed": 0, "paired_before_after": paired}, {"seed": 1, "paired_before_after": None}]
    arm_stats = {"executor_utilization": 0.9, "learner_idle_fraction": 0.2, "instrument_lm_share": 0.1, "rl_wall_s": 9}
    arms = {"ppo": {"before": before, "after": after, "steps": steps, "repeats": repeats, "stats": arm_stats}}
    report = write_report({"task": TASK, "scale": {"steps": 2, "eval_samples": 8}, "batch_size": 2, "arms": arms,
                           "corpus_kinds": {}, "warmstart": {}}, tmp_path).read_text()  # fmt: skip
    assert f"| ppo | 0 | n = 6 prompts; reward {signed(d.mean(), 3)} (paired permutation p = {ref:.2g}" in report
    assert "| ppo | 1 | — |" in report
    steps = [{"step": 1, "improve_fraction": 0.5, "valid_fraction_scratch": 0.0},
             {"step": 2, "improve_fraction": 0.25, "valid_fraction_scratch": 0.5}]  # fmt: skip
    table = render_rl_before_after({"arms": {"ppo": {"before": before, "repeats": [
        {"seed": 3, "after": after, "steps": steps, "paired_before_after": paired}]}}})  # fmt: skip
    row = f"| `ppo` | 3 | 2 | 0.20 → 0.20 | −5.000 ± 1.000 → −5.000 ± 1.000 | {paired_text(paired)} | 0.38 | 1 of 2 |"
    assert row in table and "paired permutation p = " in row


def test_progress_says_how_far_each_run_got_from_its_checkpoint_and_metrics(tmp_path):
    """A run past a session: the repeat that ran 3 steps (checkpointed at 2, the loop's clocks in the checkpoint's loop
    item), one not started; the before-RL evaluation cached, no after-RL one; the table renders each run."""
    arms = [Arm("ppo_batch_mean", "ppo", "batch_mean")]
    started = run_dir(tmp_path, "ppo_batch_mean", 0)
    writer = MetricsWriter(started, tensorboard=False)
    for step, (valid, share) in enumerate([(0.25, 0.5), (0.5, 0.5), (0.0, 0.25)], start=1):
        writer.write(step, {"valid_fraction": valid, "prompt/improve_share_trained": share})
    writer.close()
    counters = {"step": 2, "wall_s": 600.0, "update_s": 400.0, "sample_s": 150.0}
    ckpt = Checkpointer(started / "checkpoints")
    for step in (1, 2):
        ckpt.save(step, {"learner": {"w": np.ones(3)}, "loop": {"counters": {**counters, "step": step}}})
    ckpt.close()
    (tmp_path / "before.json").write_text("{}")
    in_flight = started / "checkpoints" / f"3{TMP_MARK}-1"  # the running experiment's save of step 3, half written
    in_flight.mkdir()
    p = experiment_progress(tmp_path, arms, seeds=2, steps=10)
    assert in_flight.is_dir()  # reading how far it got never cleans up what the run is writing
    first, second = p["runs"]["ppo_batch_mean"], p["runs"]["ppo_batch_mean.seed1"]
    assert (first["steps_logged"], first["last_checkpoint"], first["rl_wall_s"]) == (3, 2, 600.0)
    assert first["valid_fraction_by_step"] == [0.25, 0.5, 0.0] and first["improve_share_trained"] == pytest.approx(
        5 / 12
    )
    assert (second["steps_logged"], second["last_checkpoint"], second["rl_wall_s"]) == (0, None, 0.0)
    assert not (run_dir(tmp_path, "ppo_batch_mean", 1) / "checkpoints").exists()  # reading creates nothing
    assert p["before_evaluated"] == {"before.json": True} and p["evaluations_after_done"] == 0
    assert (p["steps_done"], p["steps_planned"]) == (3, 20)
    table = render_learning_progress(p)
    assert "| `ppo_batch_mean` | 3 of 10 | 2 | 10.0 min | 6.7 min / 2.5 min | 0.25 0.50 0.00 | 0.42 | no |" in table
    figure = learning_progress_figure({**p, "date": "2026-11-28T23:00:00+00:00"})
    assert figure == "3 of 20 RL steps done (1 of 2 runs begun, 0 evaluated after RL; 2026-11-28)"


def _raw_eval(rewards: list[float]) -> dict:
    """evaluate's output (scratch samples only), one sample per start prompt with these rewards: valid where >= 0."""
    records = [{"code": None, "valid": r >= 0, "score": r if r >= 0 else None, "reward": r, "duration_s": 1.0}
               for r in rewards]  # fmt: skip
    scratch = {"samples": len(records), "mean_reward": float(np.mean(rewards)), "records": records,
               "se_reward": float(np.std(rewards, ddof=1) / np.sqrt(len(rewards))),
               "valid_fraction": float(np.mean([r >= 0 for r in rewards])), "mean": None, "max": None}  # fmt: skip
    return {"task": TASK, "scratch": scratch}


def test_partial_summarises_the_finished_runs_as_the_finished_experiment_would(tmp_path):
    """Three arms of 2 seeds past a session: PPO's and GRPO's runs evaluated after RL, the third arm's first run still
    training, its second not begun. The partial summary holds the four finished runs, each paired against the
    before-RL evaluation by start prompt, their stats from the last checkpoint's counters, and PPO against GRPO by
    Welch over the seeds (scipy); its report renders them and every run's progress; nothing is trained."""
    cfg = spooky.get_config("cpu")
    cfg.sampler.group_size = 2  # the group objective's groups, for every arm
    arms = make_arms(["ppo", "grpo"], ["batch_mean"]) + [parse_arm("no_instrumentation:instrument.mode=off")]
    before = [-10.0, -9.9, -10.0, -9.8, -10.0, -9.9]
    afters = {"ppo_batch_mean": [-9.9, -9.9, -10.0, -9.7, -10.0, -9.8],
              "ppo_batch_mean.seed1": [-10.0, -9.9, -9.9, -9.8, -9.9, -9.9],
              "grpo_batch_mean": [-10.0, -10.0, -10.0, -9.9, -10.0, -10.0],
              "grpo_batch_mean.seed1": [-10.0, -9.9, -10.0, -9.9, -10.0, -10.0]}  # fmt: skip
    (tmp_path / "before.json").write_text(json.dumps(_raw_eval(before)))
    for name in [*afters, "no_instrumentation"]:
        d = tmp_path / "arms" / name
        writer = MetricsWriter(d, tensorboard=False)
        writer.write(1, {"valid_fraction": 0.25, "valid_fraction/scratch": 0.0, "improve_fraction": 0.5,
                         "prompt/improve_share_trained": 0.5})  # fmt: skip
        writer.close()
        ckpt = Checkpointer(d / "checkpoints")
        loop = {"counters": {"step": 1, "wall_s": 300.0, "update_s": 240.0, "sampled": 8}}
        ckpt.save(1, {"learner": {"w": np.ones(2)}, "loop": loop})
        ckpt.close()
        if name in afters:
            (d / "after.json").write_text(json.dumps(_raw_eval(afters[name])))
    summary = partial_summary(cfg, tmp_path, arms, seeds=2, scale=Scale(steps=2, eval_samples=6))
    assert list(summary["arms"]) == ["ppo_batch_mean", "grpo_batch_mean"] and summary["partial"]
    ppo = summary["arms"]["ppo_batch_mean"]
    assert [r["seed"] for r in ppo["repeats"]] == [cfg.seed, cfg.seed + 1]
    assert ppo["stats"]["algorithm"] == "ppo" and ppo["stats"]["rl_wall_s"] == 300.0
    assert ppo["stats"]["learner_idle_fraction"] == pytest.approx(0.2)  # from the checkpoint's counters
    d = np.subtract(afters["ppo_batch_mean"], before)
    assert ppo["repeats"][0]["paired_before_after"]["reward"]["diff"] == pytest.approx(d.mean())
    reward = summary["contrasts"]["grpo_batch_mean"]["reward"]  # the seed the unit: each run's mean reward
    per_seed = {name: float(np.mean(x)) for name, x in afters.items()}
    ppo_seeds, grpo_seeds = list(per_seed.values())[:2], list(per_seed.values())[2:]
    assert reward["diff"] == pytest.approx(np.mean(ppo_seeds) - np.mean(grpo_seeds)) and reward["n_b"] == 2
    assert reward["p"] == pytest.approx(stats.ttest_ind(ppo_seeds, grpo_seeds, equal_var=False).pvalue)
    assert summary["progress"]["runs"]["no_instrumentation"]["evaluated_after"] is False
    saved = json.loads((tmp_path / "partial" / "summary.json").read_text())
    assert saved["command"] and saved["date"] and saved["arms"].keys() == summary["arms"].keys()
    report = (tmp_path / "partial" / "report.md").read_text()
    assert "| `ppo_batch_mean` | 1 |" in report and "| `grpo_batch_mean` | 0 |" in report
    assert "| `ppo_batch_mean` − `grpo_batch_mean` |" in report
    assert "| 0.50 | 0 of 1 |" in report  # the step's improve share, and its scratch samples: none valid
    assert "| `no_instrumentation` | 1 of 2 |" in report  # the progress table names the run still training
    assert not (tmp_path / "summary.json").exists()  # the finished experiment's file is left to it


def _eval_result(medals: dict) -> dict:
    """evaluate's output (scratch samples only) of two logistic-regression samples, with these medals (what
    evaluation.summarize gives; tests/env/test_evaluation.py) and pizza's figures in the paper."""
    records = [{"code": _program("logreg"), "valid": True, "score": 0.6, "reward": 0.6, "duration_s": 1.0}] * 2
    scratch = {"samples": 2, "mean_reward": 0.6, "se_reward": 0.0, "valid_fraction": 1.0, "mean": 0.6, "max": 0.6,
               "records": records, "medals": medals}  # fmt: skip
    return {"task": TASK, "scratch": scratch, "paper": {"qwen2.5-3b": 0.589, "qwen2.5-3b-rl": 0.663}}


def _medals(best: str | None, **shares: float) -> dict:
    levels = {lv: shares.get(lv, 0.0) for lv in ("gold", "silver", "bronze", "above_median", "none", "invalid")}
    return {"best": best, "shares": levels, "any_medal": levels["gold"] + levels["silver"] + levels["bronze"]}


def test_eval_summary_and_report_give_the_medals_before_and_after_rl(tmp_path):
    before = eval_summary(_eval_result(_medals("above_median", above_median=0.25, none=0.5, invalid=0.25)), TASK)
    after_medals = _medals("silver", silver=0.25, bronze=0.25, above_median=0.25, invalid=0.25)
    after = eval_summary(_eval_result(after_medals), TASK)
    assert before["medals"]["best"] == "above_median" and after["medals"] == after_medals
    old = {k: v for k, v in _eval_result({})["scratch"].items() if k != "medals"}  # evaluated before medals
    assert eval_summary({"scratch": old}, TASK)["medals"] is None
    stats = {"executor_utilization": 0.9, "learner_idle_fraction": 0.2, "instrument_lm_share": 0.1, "rl_wall_s": 9}
    steps = _arm(tmp_path, "duration_weighted", [-5.0, -4.0])
    arms = {name: {"before": before, "after": after, "stats": stats, "steps": steps} for name in ("a", "b")}
    summary = {"task": TASK, "scale": {"steps": 2, "eval_samples": 4}, "batch_size": 2, "arms": arms,
               "corpus_kinds": {}, "warmstart": {}}  # fmt: skip
    report = write_report(summary, tmp_path).read_text()
    header = "| task | policy | best's medal | gold | silver | bronze | above median | none | invalid | any medal |"
    assert header in report
    assert f"| {TASK} | before RL | above_median | 0 | 0 | 0 | 0.25 | 0.5 | 0.25 | 0 |" in report
    assert f"| {TASK} | b after RL | silver | 0 | 0.25 | 0.25 | 0.25 | 0 | 0.25 | 0.5 |" in report
    assert report.count("before RL | above_median") == 1  # every arm starts from the same policy: one row
    assert "Qwen2.5-3B prompted 0.589 (none), after RL 0.663 (above_median)." in report


def test_wall_time_is_recorded_when_measured_and_kept_when_the_summary_is_regenerated(tmp_path):
    arms = ["duration_weighted", "unweighted"]
    assert work_left(tmp_path, arms)  # nothing cached: this process measures
    first = record_wall(tmp_path, 700.4)
    assert first["wall_s"] == 700.4 and first["command"].startswith("python") and first["date"][:2] == "20"
    for name in ("before.json", "arms/duration_weighted/after.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    assert work_left(tmp_path, arms)  # one arm's evaluation still to do
    (tmp_path / "arms/unweighted").mkdir()
    (tmp_path / "arms/unweighted/after.json").write_text("{}")
    assert not work_left(tmp_path, arms)
    regenerated = record_wall(tmp_path, None)  # a 2-second regeneration does not replace the 700 s
    assert regenerated == first
    resumed = record_wall(tmp_path, 50.0)  # a second measuring process (more steps) adds to it
    assert resumed["wall_s"] == 750.4 and len(resumed["processes"]) == 2


def test_a_summary_written_before_the_ledger_keeps_its_wall_time(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"task": "t", "wall_s_this_process": 247.7}))
    assert record_wall(tmp_path, None) == {"wall_s_this_process": 247.7}
    # nothing measured by a finished process, no summary before: the command that writes the summary, no wall time
    fresh = record_wall(tmp_path / "new", None)
    assert set(fresh) == {"command", "date"} and fresh["command"].startswith("python")


def test_arms_are_one_per_algorithm_and_weight_mode_and_ppo_alone_keeps_its_names():
    assert DEFAULT_ARMS == make_arms(["ppo"], ["batch_mean", "off"])
    assert DEFAULT_ARMS == [Arm("duration_weighted", "ppo", "batch_mean"), Arm("unweighted", "ppo", "off")]
    arms = make_arms(["ppo", "grpo"], ["batch_mean", "off"])
    assert [a.name for a in arms] == ["ppo_batch_mean", "ppo_off", "grpo_batch_mean", "grpo_off"]
    assert [(a.algorithm, a.duration_weights) for a in arms] == [
        ("ppo", "batch_mean"), ("ppo", "off"), ("grpo", "batch_mean"), ("grpo", "off")
    ]  # fmt: skip
    assert [a.name for a in make_arms(["ppo"], ["clipped"])] == ["ppo_clipped"]
    assert [a.name for a in make_arms(["rloo"], ["off"])] == ["rloo_off"]
    for algorithms, weights, says in [
        (["ppo", "sgd"], ["off"], "--algorithms: unknown 'sgd'; known: ppo,grpo,dr_grpo,rloo"),
        (["grpo"], ["batch_mean", "sqrt"], "--duration_weights: unknown 'sqrt'; known: off,batch_mean,clipped,log"),
        (["grpo", "grpo"], ["off"], "--algorithms names 'grpo' twice"),
        ([], ["off"], "--algorithms is empty"),
    ]:
        with pytest.raises(ValueError) as e:
            make_arms(algorithms, weights)
        assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_an_arms_config_sets_its_objective_and_weights_and_a_group_objective_needs_groups():
    cfg = spooky.get_config("cpu")
    c = arm_config(cfg, Arm("unweighted", "ppo", "off"))
    assert c.ppo.duration_weights == "off" and cfg.ppo.duration_weights == "batch_mean"  # a copy; cfg is untouched
    with pytest.raises(ValueError, match="arm grpo_off: grpo needs --config.sampler.group_size >= 2"):
        arm_config(cfg, Arm("grpo_off", "grpo", "off"))
    cfg.sampler.group_size = 4
    with_learner = ConfigDict({**cfg.to_dict(), "learner": {"algorithm": "ppo"}})
    c = arm_config(with_learner, Arm("grpo_off", "grpo", "off"))
    assert (c.learner.algorithm, c.ppo.duration_weights, with_learner.learner.algorithm) == ("grpo", "off", "ppo")
    without = ConfigDict({k: v for k, v in cfg.to_dict().items() if k != "learner"})
    assert arm_config(without, Arm("ppo_off", "ppo", "off")).ppo.duration_weights == "off"
    with pytest.raises(ValueError, match="this config has no learner.algorithm, so only ppo arms can run"):
        arm_config(without, Arm("grpo_off", "grpo", "off"))


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> tuple[Path, list[subprocess.CompletedProcess]]:
    """The command's refusals, each case forked from one interpreter that imported it once (tests/launch_forks.py):
    an unknown algorithm, an arm that changes the warm start. Returns (the cases' folder, their results)."""
    tmp = tmp_path_factory.mktemp("refused")
    cases = [
        ["--config=configs/spooky.py:cpu", f"--out={tmp / 'algorithm'}", "--algorithms=ppo,grop"],
        ["--config=configs/pizza.py:cpu", f"--out={tmp / 'arm'}", "--arm=paper:",
         "--arm=other:model.path=checkpoints/smollm2-135m-instruct"],
    ]  # fmt: skip
    return tmp, forked_runs(cases, "mle_jax.experiments.learning", timeout=300)


def test_an_unknown_algorithm_fails_the_command_in_one_line_before_any_work(refused):
    tmp_path, (done, _) = refused
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: --algorithms: unknown 'grop'; known: ppo,grpo,dr_grpo,rloo"
    ), done.stderr[-2000:]
    assert not (tmp_path / "algorithm").exists()


def test_stale_metrics_the_learner_reports_are_averaged_per_arm(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=False)
    writer.write(1, {"reward/mean": 1.0, "learner/stale/lag_slow": 2.0, "learner/stale/clipfrac_fast": None})
    writer.write(2, {"reward/mean": 1.0, "learner/stale/lag_slow": 4.0, "learner/stale/clipfrac_fast": 0.25})
    writer.close()
    assert stale_means(tmp_path) == {"stale/clipfrac_fast": 0.25, "stale/lag_slow": 3.0}
    empty = tmp_path / "none"
    MetricsWriter(empty, tensorboard=False).close()
    assert stale_means(empty) == {}


def test_an_arms_peak_memory_is_this_processes_and_kept_across_processes(tmp_path):
    path = tmp_path / "peak_rss.json"
    assert arm_peak_rss(path, worked=False) is None  # nothing ran, nothing recorded
    peak = arm_peak_rss(path, worked=True)
    assert peak is not None and peak > 0.01 and json.loads(path.read_text()) == {"peak_rss_gib": peak}
    path.write_text(json.dumps({"peak_rss_gib": 1000.0}))  # an earlier process of the same arm held more
    assert arm_peak_rss(path, worked=True) == 1000.0 and arm_peak_rss(path, worked=False) == 1000.0


def test_arm_specs_set_any_field_and_bad_ones_fail_in_one_line():
    cfg = spooky.get_config("cpu")
    paper, off = parse_arm("paper:"), parse_arm("no_instrumentation:instrument.mode=off")
    assert paper == Arm("paper") and off.overrides == (("instrument.mode", "off"),)
    c = arm_config(cfg, parse_arm("x:prompt.improve_fraction=0, ppo.kl_coef=1e-2,ppo.whiten_advantages=False"))
    assert (c.prompt.improve_fraction, c.ppo.kl_coef, c.ppo.whiten_advantages) == (0.0, 0.01, False)
    assert arm_config(cfg, off).instrument.mode == "off" and cfg.instrument.mode == "lm"  # a copy
    assert arm_config(cfg, paper).to_dict() == cfg.to_dict()
    assert [a.name for a in select_arms(["paper:", "b:ppo.kl_coef=0"], ["ppo"], ["off"], shorthand=False)] == [
        "paper", "b"
    ]  # fmt: skip
    assert [a.name for a in select_arms(["b:"], ["ppo"], ["off"], shorthand=True)] == ["unweighted", "b"]
    assert [a.name for a in select_arms([], ["ppo"], ["off"], shorthand=False)] == ["unweighted"]
    for specs, says in [
        (["paper"], "--arm=paper: expected NAME:FIELD=VALUE[,FIELD=VALUE...]"),
        (["a.b:"], "--arm=a.b:: the arm's name must be letters, digits, _ or -"),
        (["x:instrument.mode"], "--arm=x:instrument.mode: 'instrument.mode' is not FIELD=VALUE"),
        (["x:ppo.kl_coef=0,ppo.kl_coef=1"], "--arm=x:ppo.kl_coef=0,ppo.kl_coef=1: ppo.kl_coef is set twice"),
        (["a:", "a:ppo.kl_coef=0"], "two arms are named 'a'"),
    ]:
        with pytest.raises(ValueError) as e:
            select_arms(specs, ["ppo"], ["off"], shorthand=False)
        assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)
    for override, says in [
        ("instrument.mdoe=off", "arm x: instrument.mdoe is no config field (did you mean instrument.mode?)"),
        ("ppo=1", "arm x: ppo is no config field"),
        ("model.path=checkpoints/other", "arm x: model.path would change the warm start every arm shares"),
        ("task.id=leaf-classification", "arm x: task.id would change the warm start"),
        ("tasks=leaf-classification", "arm x: tasks would change the warm start"),
        ("warmstart.steps=10", "arm x: warmstart.steps would change the warm start"),
        ("seed=3", "arm x: seed is the experiment's"),
        ("eval.samples=4", "arm x: eval.samples is the evaluation every arm shares"),
        ("executor.slots=1", "arm x: executor.slots is the executor fleet every arm shares"),
        ("loop.steps=9", "arm x: loop.steps is the experiment's scale"),
        ("ppo.epochs=1.5", "arm x: ppo.epochs=1.5: invalid literal for int()"),
        ("ppo.whiten_advantages=maybe", "arm x: ppo.whiten_advantages=maybe: expected true or false"),
        ("learner.algorithm=grpo", "arm x: grpo needs --config.sampler.group_size >= 2"),
    ]:
        with pytest.raises(ValueError) as e:
            arm_config(cfg, parse_arm(f"x:{override}"))
        assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)


def test_an_arm_that_changes_the_warm_start_fails_the_command_in_one_line_before_any_work(refused):
    tmp_path, (_, done) = refused
    assert done.returncode == 2 and done.stderr.strip() == (
        "error: arm other: model.path would change the warm start every arm shares (model, tokenizer, task); an arm "
        "cannot set it"
    ), done.stderr[-2000:]
    assert not (tmp_path / "arm").exists()


def _repeat(
    final: float, se: float | None, curve: list[float | None], valid: float = 0.5, reward: float | None = None
) -> dict:
    steps = [{"step": i + 1, "task_score_mean": y, "valid_fraction": valid} for i, y in enumerate(curve)]
    after = {"task_score_mean": final, "task_score_se": se}
    if reward is not None:  # an evaluation with its mean reward and valid fraction (older ones have neither)
        after |= {"mean_reward": reward, "valid_fraction": 0.0}
    return {"after": after, "steps": steps}


def test_arms_that_wrote_no_valid_program_are_still_compared_by_their_after_rl_reward_over_seeds():
    """Qwen's RL arms: every seed's final task score is the −10 floor (no valid program, nothing to test), while the
    after-RL mean reward (partial credit) differs per seed: that contrast is Welch's test over the seeds (scipy)."""
    ppo = arm_task_scores([_repeat(-10.0, 0.0, [-7.0, -8.0], 0.0, -9.95), _repeat(-10.0, 0.0, [-9.0], 0.0, -9.97)])
    grpo = arm_task_scores([_repeat(-10.0, 0.0, [-9.5], 0.0, -9.90), _repeat(-10.0, 0.0, [-9.9], 0.0, -9.85)])
    assert ppo["reward"]["values"] == [-9.95, -9.97] and ppo["valid"]["values"] == [0.0, 0.0]
    arms = {"ppo": {"task_score": ppo}, "grpo": {"task_score": grpo}}
    c = arm_contrasts(arms)["grpo"]
    assert c["reward"]["diff"] == pytest.approx(-0.085) and c["reward"]["test"] == "welch"
    assert c["reward"]["p"] == pytest.approx(stats.ttest_ind([-9.95, -9.97], [-9.9, -9.85], equal_var=False).pvalue)
    assert c["final"]["p"] is None and c["valid"]["p"] is None  # −10 and 0 in every seed of both arms
    table = render_rl_arm_contrasts({"arms": arms})
    row = next(line for line in table.splitlines() if line.startswith("| `ppo` − `grpo`"))
    assert f"(Welch p = {c['reward']['p']:.2g}, 2 and 2 seeds: " in row and "−9.950, −9.970 vs −9.900, −9.850" in row
    assert row.count("not tested: every seed of both arms gave the same figure") == 2, row
    figure = rl_contrast_figure({"arms": arms})  # README's line: the same two tests
    assert (
        figure.startswith("`ppo` − `grpo` (2 and 2 runs): after-RL mean reward −0.085 (Welch p = ")
        and "\n" not in figure
    )
    assert rl_contrast_figure({"arms": {"ppo": arms["ppo"]}}) == "no two arms evaluated after RL yet"
    # a summary from before the after-RL reward was kept: the contrast says so instead of failing
    old = {n: {"task_score": {k: v for k, v in a["task_score"].items() if k != "reward"}} for n, a in arms.items()}
    assert "not measured" in render_rl_arm_contrasts({"arms": old})


def test_task_scores_across_seeds_and_the_contrasts_with_the_first_arm():
    paper = arm_task_scores([_repeat(0.6, 0.03, [-5.0, -1.0]), _repeat(0.5, 0.04, [-3.0, 0.0])])
    assert paper["final"]["mean"] == pytest.approx(0.55) and paper["final"]["se"] == pytest.approx(0.05)
    assert paper["final"]["se_within"] == pytest.approx(0.025)  # sqrt(0.03² + 0.04²) / 2
    assert paper["curve"]["values"] == [-3.0, -1.5] and paper["never_valid"] == 0 and paper["runs"] == 2
    off = arm_task_scores([_repeat(-10.0, 0.0, [-10.0, -10.0], valid=0.0), _repeat(0.3, 0.05, [-8.0, -6.0])])
    assert off["never_valid"] == 1 and off["final"]["mean"] == pytest.approx(-4.85)
    one = arm_task_scores([_repeat(0.5, None, [None, None])])
    assert one["final"]["se"] is None and one["final"]["se_within"] is None and one["curve"] is None
    c = arm_contrasts({"paper": {"task_score": paper}, "off": {"task_score": off}, "one": {"task_score": one}})
    final = c["off"]["final"]  # the seed the unit: Welch's test over the two seeds' final task scores
    assert c["off"]["reference"] == "paper" and final["diff"] == pytest.approx(5.4) and final["test"] == "welch"
    assert final["p"] == pytest.approx(stats.ttest_ind([0.6, 0.5], [-10.0, 0.3], equal_var=False).pvalue)
    assert final["p"] > 0.05 and (final["n_a"], final["n_b"]) == (2, 2)  # 2 seeds apart: within noise
    assert c["off"]["curve"]["diff"] == pytest.approx(-2.25 + 8.5) and c["one"]["curve"] is None
    assert c["one"]["final"] is None  # one seed: no test, no verdict
    # arms that differ only in the improve share, neither of which trained on an improve prompt, could not differ
    same = {"task_score": {**off, "improve_trained": 0.0}, "stats": {"improve_fraction": 0.0, "rl_wall_s": 9.0}}
    ref = {"task_score": {**paper, "improve_trained": 0.0}, "stats": {"improve_fraction": 0.5, "rl_wall_s": 7.0}}
    untested = arm_contrasts({"paper": ref, "scratch_only": same})["scratch_only"]["final"]
    assert untested["test"] == "not tested" and untested["p"] is None


def test_the_reports_table_4_and_fig_9_from_a_hand_made_summary(tmp_path):
    def arm(mode, improve, repeats):
        first = repeats[0]
        stats = {"instrument_mode": mode, "improve_fraction": improve, "seed": 0}
        return {**first, "stats": stats, "repeats": repeats, "task_score": arm_task_scores(repeats)}

    arms = {
        "paper": arm("lm", 0.5, [_repeat(0.6, 0.03, [-5.0, -1.0]), _repeat(0.5, 0.04, [-3.0, 0.0])]),
        "no_instrumentation": arm("off", 0.5, [_repeat(-10.0, 0.0, [-10.0, -10.0], 0.0), _repeat(0.3, 0.05, [-8.0])]),
    }
    summary = {"task": TASK, "seeds": 2, "arms": arms, "contrasts": arm_contrasts(arms)}
    table = ablation_table(summary)
    assert (
        "| paper | lm | 0.50 / — | 2 | 0.550 ± 0.050 | 0.550 ± 0.025 | 0.600, 0.500 | -2.250 ± 0.750 | 0 of 2 |"
        in table
    )
    assert "| no_instrumentation | off | 0.50 / — | 2 | -4.850 ± 5.150 |" in table and "| 1 of 2 |" in table
    text = "\n".join(ablation_lines(summary))
    assert "- paper minus no_instrumentation: final task score +5.400 (Welch p = " in text
    assert "2 and 2 seeds: within noise)" in text
    path = task_score_plot({"pizza": summary, "spooky": summary}, tmp_path / "task_score.png")
    assert path.stat().st_size > 1000
    # docs/results.md's blocks (results_tables/ablations.py) from the same summary
    for a in arms.values():
        a["before"] = {"task_score_mean": -4.0, "task_score_se": 1.5}
    readme = render_ablation_table(summary)
    assert f"| {TASK} | −4.000 ± 1.500 | 0.550 ± 0.050 (within 0.025) | −4.850 ± 5.150 (within 0.025) |" in readme
    assert readme.endswith("| 0 of 2 | 1 of 2 |")
    contrasts = render_ablation_contrasts(summary)
    p = stats.ttest_ind([0.6, 0.5], [-10.0, 0.3], equal_var=False).pvalue
    assert f"| {TASK} | `paper` − `no_instrumentation` | +5.400 (Welch p = {p:.2g}, 2 and 2 seeds: within noise) |" in (
        contrasts
    )
    assert never_valid_figure(summary, summary) == "`paper` 0 of 4, `no_instrumentation` 2 of 4"
