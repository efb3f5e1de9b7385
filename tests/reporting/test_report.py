import json

from mle_jax.executor.result import OUTCOMES
from mle_jax.infra import metrics
from mle_jax.infra.tensorboard_events import scalar_points
from mle_jax.reporting import report, sample_plots


def test_metrics_writer_appends_and_truncates_on_resume(tmp_path):
    w = metrics.MetricsWriter(tmp_path, tensorboard=True)
    for step in range(1, 5):
        w.write(step, {"reward/mean": -10.0 + step, "valid_fraction": step / 4, "score/max": None})
    w.truncate_after(2)  # a run resumed from step 2 rewrites steps 3..
    w.write(3, {"reward/mean": 0.5, "valid_fraction": 1.0, "score/max": 0.6})
    w.close()
    rows = metrics.read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["reward/mean"] == 0.5
    assert list((tmp_path / "tb").iterdir()), "TensorBoard events were not written"


def test_read_metrics_ignores_a_torn_last_line(tmp_path):
    p = tmp_path / "metrics.jsonl"
    p.write_text(json.dumps({"step": 1, "x": 1}) + "\n" + '{"step": 2, "x"')
    assert metrics.read_metrics(p) == [{"step": 1, "x": 1}]


def test_report_shows_each_tasks_medals_beside_the_papers_figures_and_theirs(tmp_path):
    shares = {"gold": 0.0, "silver": 0.0, "bronze": 0.25, "above_median": 0.25, "none": 0.25, "invalid": 0.25}
    scratch = {"samples": 4, "valid_fraction": 0.75, "mean": 0.62, "max": 0.7,
               "medals": {"best": "bronze", "shares": shares, "any_medal": 0.25}}  # fmt: skip
    paper = {"qwen2.5-3b": 0.589, "qwen2.5-3b-rl": 0.663}
    evaluation = {"task": "random-acts-of-pizza", "scratch": scratch, "paper": paper}
    text = report.write_report(tmp_path, {"task": "random-acts-of-pizza"}, evaluation).read_text()
    assert "| task |  | best's medal | gold | silver | bronze | above median | none | invalid | any medal |" in text
    assert "| random-acts-of-pizza | scratch | bronze | 0 | 0 | 0.25 | 0.25 | 0.25 | 0.25 | 0.25 |" in text
    # pizza's MLE-bench median is 0.5996 and its bronze 0.6921: the paper's prompted figure earns nothing
    assert "Qwen2.5-3B prompted 0.589 (none), after RL 0.663 (above_median)." in text
    assert "data/mlebench/medal_thresholds.csv" in text


def test_report_of_a_mix_has_each_tasks_evaluation_medals_and_paper_line(tmp_path):
    shares = {"gold": 0.0, "silver": 0.0, "bronze": 0.0, "above_median": 0.5, "none": 0.5, "invalid": 0.0}
    pizza = {"task": "random-acts-of-pizza", "paper": {"qwen2.5-3b": 0.589, "qwen2.5-3b-rl": 0.663},
             "scratch": {"samples": 2, "valid_fraction": 1.0, "mean": 0.6, "max": 0.61,
                         "medals": {"best": "above_median", "shares": shares, "any_medal": 0.0}}}  # fmt: skip
    spooky = {"task": "spooky-author-identification", "paper": {"qwen2.5-3b": 0.596, "qwen2.5-3b-rl": 0.404},
              "scratch": {"samples": 2, "valid_fraction": 0.5, "mean": 0.9, "max": 0.9,
                          "medals": {"best": "none", "shares": shares, "any_medal": 0.0}}}  # fmt: skip
    evaluation = {"task": pizza["task"], "tasks": {pizza["task"]: pizza, spooky["task"]: spooky}}
    text = report.write_report(tmp_path, {"task": pizza["task"]}, evaluation).read_text()
    assert "| random-acts-of-pizza | scratch | 2 | 1 | 0.6 | 0.61 |" in text
    assert "| spooky-author-identification | scratch | 2 | 0.5 | 0.9 | 0.9 |" in text
    assert "| random-acts-of-pizza | scratch | above_median |" in text
    assert "| spooky-author-identification | scratch | none |" in text
    assert "Paper, Table 1 (random-acts-of-pizza" in text and "Paper, Table 1 (spooky-author-identification" in text


def test_report_has_table_and_plots(tmp_path):
    w = metrics.MetricsWriter(tmp_path, tensorboard=False)
    for step in range(1, 4):
        w.write(
            step,
            {
                "reward/mean": -9.0 + step,
                "reward/score_part": 0.1 * step,
                "reward/progress_part": -9.0,
                "valid_fraction": 0.25 * step,
                "score/mean": 0.5,
                "score/max": 0.55 + 0.01 * step,
                "duration_s/mean": 2.0,
            },
        )
    path = report.write_report(
        tmp_path,
        {"task": "random-acts-of-pizza", "wall_s": 12.5},
        {
            "scratch": {"samples": 4, "valid_fraction": 0.5, "mean": 0.6, "max": 0.62},
            "paper": {"qwen2.5-3b": 0.589, "qwen2.5-3b-rl": 0.663},
        },
    )
    text = path.read_text()
    assert "| wall_s | 12.5 |" in text and "| scratch | 4 | 0.5 | 0.6 | 0.62 |" in text
    assert "| paper |" not in text and "after RL 0.663" in text
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert pngs == ["duration.png", "reward_components.png", "score.png", "valid_fraction.png"]
    assert all((tmp_path / "plots" / p).stat().st_size > 1000 for p in pngs)


def test_staleness_metrics_reach_the_jsonl_tensorboard_and_plots(tmp_path):
    """The learner's stale/* metrics as the loop writes them (prefixed learner/): NaN (no slow sample in a step) is
    null in metrics.jsonl and no TensorBoard point; the finite ones are points and plots."""
    w = metrics.MetricsWriter(tmp_path, tensorboard=True)
    for step, slow in ((1, 2.0), (2, float("nan"))):
        w.write(step, {"learner/stale/version_lag_slow": slow, "learner/stale/version_lag_fast": 0.5,
                       "learner/stale/clipfrac_slow": 0.3, "learner/stale/clipfrac_fast": 0.1})  # fmt: skip
    w.close()
    rows = metrics.read_metrics(tmp_path / "metrics.jsonl")
    assert [r["learner/stale/version_lag_slow"] for r in rows] == [2.0, None]
    points = scalar_points(tmp_path / "tb")
    assert [p for p in points if p[0] == "learner/stale/version_lag_slow"] == [
        ("learner/stale/version_lag_slow", 1, 2.0)
    ]
    assert ("learner/stale/clipfrac_fast", 2, 0.1) in [(k, s, round(v, 6)) for k, s, v in points]
    assert sorted(p.name for p in report.write_plots(rows, tmp_path / "plots")) == [
        "stale_clipfrac.png",
        "stale_version_lag.png",
    ]  # no behaviour weights: not a decoupled run


def test_the_process_metrics_of_each_step_are_plotted(tmp_path):
    rows = [{"step": step, "reward/mean": -1.0, **metrics.process_metrics()} for step in (1, 2)]
    assert rows[0]["process/rss_gib"] > 0.1 and rows[0]["process/compiles"] >= 0  # this process holds jax
    names = {p.name for p in report.write_plots(rows, tmp_path)}
    assert "memory_gib.png" in names


def test_the_memory_breakdown_counts_a_shared_buffer_once_for_its_first_part(tmp_path):
    import jax.numpy as jnp

    w = jnp.ones((16, 1024, 1024), jnp.float32)  # 64 MiB
    other = jnp.zeros((32, 1024, 1024), jnp.float32)  # 128 MiB
    got = metrics.memory_breakdown({"reference": {"w": w}, "sampler": {"w": w, "b": other}, "instrumenter": None})
    assert (got["memory/reference_gib"], got["memory/sampler_gib"], got["memory/instrumenter_gib"]) == (
        0.062, 0.125, 0)  # fmt: skip
    assert got["memory/other_arrays_gib"] >= 0  # arrays of no part (this session's others)
    rows = [{"step": s, "reward/mean": -1.0, **got} for s in (1, 2)]
    assert "memory_parts_gib.png" in {p.name for p in report.write_plots(rows, tmp_path)}


def test_a_mix_gets_a_plot_per_metric_with_a_line_per_task(tmp_path):
    rows = [
        {"step": step, "reward/mean": -5.0, "reward/mean/a-task": -1.0 * step, "reward/mean/b-task": -9.0,
         "valid_fraction/a-task": 0.5, "valid_fraction/b-task": 0.1, "valid_fraction/scratch": 0.3}
        for step in (1, 2)
    ]  # fmt: skip
    keys = report.plot_keys(rows)
    assert keys["task_reward"] == ("reward/mean/a-task", "reward/mean/b-task")
    assert keys["task_valid_fraction"] == ("valid_fraction/a-task", "valid_fraction/b-task")  # not /scratch
    names = {p.name for p in report.write_plots(rows, tmp_path)}
    assert {"task_reward.png", "task_valid_fraction.png", "reward_components.png"} <= names
    assert "task_duration.png" not in names  # no such metric in these rows
    assert "task_reward" not in report.plot_keys([{"step": 1, "reward/mean": -1.0}])  # one task: no per-task plots


def test_the_score_plot_draws_the_best_in_the_tasks_direction_and_a_mix_per_task(tmp_path):
    # spooky's log loss: lower is better, so score/max is the step's worst sample and score/best its min
    w = metrics.MetricsWriter(tmp_path, tensorboard=False)
    for step in (1, 2):
        w.write(step, {"reward/mean": -1.0, "score/mean": 0.9, "score/max": 1.5, "score/min": 0.5 - 0.1 * step,
                       "score/best": 0.5 - 0.1 * step, "valid_fraction": 1.0})  # fmt: skip
    w.close()
    rows = metrics.read_metrics(tmp_path / "metrics.jsonl")
    assert report.plot_keys(rows)["score"] == ("score/mean", "score/best")
    text = report.write_report(tmp_path, {"task": "spooky-author-identification"}, None).read_text()
    assert "| step | reward/mean | score/mean | score/best |" in text and "| 2 | -1 | 0.9 | 0.3 |" in text
    # a mix: an AUC and a log loss never share a line; each task's mean and best get one
    mix = [{"step": 1, "reward/mean/a-task": -1.0, "reward/mean/b-task": -2.0, "score/mean": 0.7,
            "score/mean/a-task": 0.6, "score/best/a-task": 0.8}]  # fmt: skip
    keys = report.plot_keys(mix)
    assert "score" not in keys
    assert keys["task_score_mean"] == ("score/mean/a-task", "score/mean/b-task")
    assert keys["task_score_best"] == ("score/best/a-task", "score/best/b-task")


def _hand_made_run(workdir, task_of, rewards, scores):
    """metrics.jsonl and samples.jsonl of a 2-step run as the loop writes them: step -> per-sample values."""
    w = metrics.MetricsWriter(workdir, tensorboard=False)
    for step in (1, 2):
        valid = [s is not None for s in scores[step]]
        w.write(step, {"reward/mean": sum(rewards[step]) / len(valid), "valid_fraction": sum(valid) / len(valid),
                       "score/mean": 0.6})  # fmt: skip
        w.write_samples(step, [{"task": task_of(i), "reward": r, "valid": s is not None, "score": s, "duration_s": 1.0}
                               for i, (r, s) in enumerate(zip(rewards[step], scores[step], strict=True))])  # fmt: skip
    w.close()


def test_report_opens_with_a_summary_a_person_reads(tmp_path):
    """Task, steps, wall time, reward first -> last step with its SE, valid fraction, best score (the task's
    direction) with its medal, the evaluation's medal line and the plots, before the tables."""
    spooky = "spooky-author-identification"  # log loss: lower is better, so the best is the smallest score
    _hand_made_run(tmp_path, lambda i: spooky, {1: [-10.0, -10.0, -1.0, -3.0], 2: [-0.5, -0.7, -10.0, -0.6]},
                   {1: [None, None, 1.0, 3.0], 2: [0.5, 0.7, None, 0.6]})  # fmt: skip
    shares = {"gold": 0.0, "silver": 0.0, "bronze": 0.0, "above_median": 0.5, "none": 0.5, "invalid": 0.0}
    evaluation = {"task": spooky, "paper": {"qwen2.5-3b": 0.596, "qwen2.5-3b-rl": 0.404},
                  "scratch": {"samples": 2, "valid_fraction": 1.0, "mean": 0.45, "max": 0.41, "mean_reward": -0.45,
                              "medals": {"best": "above_median", "shares": shares, "any_medal": 0.0}}}  # fmt: skip
    summary = {"task": spooky, "rl/steps": 2, "rl/samples": 8, "rl/wall_s": 90.0, "wall_s": 600.0}
    text = report.write_report(tmp_path, summary, evaluation).read_text()
    head = text.split("\n## ")[0]
    assert head.startswith(f"# Run report: {spooky}\n\n- **Task**: {spooky} (lower is better)\n")
    assert "- **Steps**: 2 RL steps (8 samples) in 1.5 min; the whole run 10.0 min" in head
    # step 1: mean -6.0, sd 4.69 over 4 -> SE 2.35; step 2: mean -2.95, SE 2.35
    assert "- **Reward** (mean ± SE of the RL samples, step 1 → step 2): −6.00 ± 2.35 → −2.95 ± 2.35 (4 → 4" in head
    assert "- **Valid fraction** (step 1 → step 2): 0.50 → 0.75" in head
    # the best log loss is the smallest, 0.5 (not 3.0), and earns nothing: spooky's median is 0.419
    assert "- **Best score during RL**: 0.500 (none), with its MLE-bench medal" in head
    assert ("- **Evaluation** (evaluation.json): best of 2 scratch samples 0.410 (above_median), 0% of them with a "
            "medal; the paper after RL (best of 128) 0.404 (above_median)") in head  # fmt: skip
    assert "- **Plots**: [score](plots/score.png)" in head
    # then the tables, the evaluation's "best" in the task's direction
    assert text.index("## Run") < text.index("## Evaluation") < text.index("## Per step") < text.index("## Plots")
    assert (
        "|  | samples | valid fraction | mean score | best |\n|---|---|---|---|---|\n| scratch | 2 | 1 | 0.45 | 0.41 |"
        in text
    )
    assert "max score" not in text and "| wall_s | 600 |" in text


def test_the_report_of_a_mix_names_every_task_and_each_ones_best(tmp_path):
    pizza, spooky = "random-acts-of-pizza", "spooky-author-identification"
    _hand_made_run(tmp_path, lambda i: (pizza, spooky)[i % 2], {1: [-10.0, -1.0], 2: [0.6, -0.4]},
                   {1: [None, 1.0], 2: [0.66, 0.4]})  # fmt: skip
    summary = {"task": pizza, "tasks": f"{pizza},{spooky}", "rl/steps": 2}
    text = report.write_report(tmp_path, summary, None, plots=False).read_text()
    assert text.startswith(f"# Run report: {pizza}, {spooky}\n\n- **Tasks**: {pizza} (higher is better), {spooky} "
                           "(lower is better)")  # fmt: skip
    assert f"- **Best score during RL** ({pizza}): 0.660 (" in text
    assert f"- **Best score during RL** ({spooky}): 0.400 (" in text
    assert "- **Evaluation**: none" in text
    assert not (tmp_path / "plots").exists()  # report.plots = false: none drawn


def test_the_sample_plots_show_each_tasks_outcomes_and_medals_per_step(tmp_path):
    """Shares of each step's samples per medal level and per outcome (an older record without an outcome: from its
    status), a panel per task of a mix, beside samples.html; a run's report links the page."""
    pizza, spooky = "random-acts-of-pizza", "spooky-author-identification"
    samples = [
        {"step": 1, "task": pizza, "valid": True, "score": 0.70, "reward": 0.7, "duration_s": 3.0},  # bronze
        {"step": 1, "task": pizza, "valid": False, "status": "error", "outcome": "syntax_error", "reward": -10.0,
         "duration_s": 0.2},
        {"step": 1, "task": pizza, "valid": False, "status": None, "reward": -10.0, "duration_s": 0.0},  # no code
        {"step": 2, "task": pizza, "valid": True, "score": 0.61, "reward": 0.61, "duration_s": 30.0},  # above median
        {"step": 2, "task": spooky, "valid": False, "status": "ok", "reward": -9.9, "duration_s": 4.0},
    ]  # fmt: skip
    steps, medals = sample_plots.shares_by_step(samples[:4], sample_plots.sample_medal, sample_plots.MEDAL_CATEGORIES)
    assert steps == [1, 2]
    assert {k: v for k, v in medals.items() if any(v)} == {"bronze": [1 / 3, 0.0], "above_median": [0.0, 1.0],
                                                           "invalid": [2 / 3, 0.0]}  # fmt: skip
    _, outcomes = sample_plots.shares_by_step(samples, sample_plots.sample_outcome, OUTCOMES)
    assert {k: v for k, v in outcomes.items() if any(v)} == {"valid": [1 / 3, 0.5], "no_code": [1 / 3, 0.0],
                                                             "syntax_error": [1 / 3, 0.0],
                                                             "invalid_submission": [0.0, 0.5]}  # fmt: skip
    w = metrics.MetricsWriter(tmp_path, tensorboard=False)
    for step in (1, 2):
        w.write(step, {"reward/mean": -1.0})
        w.write_samples(step, [r for r in samples if r["step"] == step])
    text = report.write_report(tmp_path, {"task": pizza, "tasks": f"{pizza},{spooky}"}, None).read_text()
    for name in ("duration_score", "medal_shares", "outcomes"):
        assert f"![{name}](plots/{name}.png)" in text and (tmp_path / "plots" / f"{name}.png").stat().st_size > 1000
    assert "\n- **Samples**: [samples.html](samples.html), the 5 samples the RL steps trained on" in text.split("##")[0]
    page = (tmp_path / "samples.html").read_text()
    assert f"<title>Samples: {pizza}, {spooky}</title>" in page and "<script src" not in page and "http" not in page
