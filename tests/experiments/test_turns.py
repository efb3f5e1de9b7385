"""The learning experiment's --turns (issue 31, §4: does revising beat resampling?): arms split by turns, the
evaluation's draws, the summary of episodes, the contrasts in SEs, the report section and the README's blocks."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from configs import spooky
from mle_jax.env.evaluation import summarize
from mle_jax.experiments.learning.arms import (
    REFUSED,
    Arm,
    arm_config,
    eval_draws,
    make_arms,
    parse_turns,
    split_by_turns,
)
from mle_jax.experiments.learning.outcomes import eval_summary, revision_contrasts
from mle_jax.experiments.learning.report import revision_lines, write_report
from mle_jax.experiments.learning.running import before_path, work_left
from mle_jax.reporting.markdown import signed
from mle_jax.reporting.results_tables.turns import render_turns_contrasts, render_turns_table
from mle_jax.run.settings import from_config
from mle_jax.warmstart.programs import full_grid
from mle_jax.warmstart.programs.pizza import PIZZA

pytestmark = pytest.mark.unit
LOGREG = next(it.code for it in full_grid(PIZZA) if it.meta["model"] == "logreg")


def test_turns_split_every_arm_into_one_per_k_with_the_override_and_bad_lists_fail_in_one_line():
    assert parse_turns([]) == () and parse_turns(["1", " 3"]) == (1, 3) and parse_turns(["4", "2", "1"]) == (4, 2, 1)
    for bad, says in (
        (["1", "x"], "--turns: 'x' is not an integer"),
        (["0"], "--turns: 0 is not >= 1"),
        (["3", "3"], "--turns names 3 twice"),
        (["1", "2", "3"], "--turns: 2 does not divide 3"),
    ):
        with pytest.raises(ValueError) as e:
            parse_turns(bad)
        assert str(e.value).startswith(says) and "\n" not in str(e.value)
    arms = make_arms(["ppo"], ["batch_mean"]) + [Arm("paper", overrides=(("prompt.improve_fraction", "0"),))]
    assert split_by_turns(arms, ()) == arms  # no --turns: today's arms, untouched
    split = split_by_turns(arms, (1, 3))
    assert [a.name for a in split] == ["ppo_batch_mean_t1", "ppo_batch_mean_t3", "paper_t1", "paper_t3"]
    assert split[3].overrides == (("prompt.improve_fraction", "0"), ("agent.turns", "3"))
    assert split[1].algorithm == "ppo" and split[1].duration_weights == "batch_mean"
    assert not any("agent.turns".startswith(p.rstrip(".")) for p in REFUSED)  # an arm may set agent.*
    cfg = spooky.get_config("cpu")
    s = from_config(arm_config(cfg, split[1]))
    assert s.rollout.agent.turns == 3 and from_config(arm_config(cfg, split[0])).rollout.agent.turns == 1
    assert cfg.agent.turns == 1  # the base config is not changed by an arm
    with pytest.raises(ValueError, match="^arm x sets agent.turns itself; --turns sets it for every arm$"):
        split_by_turns([Arm("x", overrides=(("agent.turns", "2"),))], (1, 3))
    with pytest.raises(ValueError, match="^two arms are named 'ppo_off_t1'$"):  # the shorthand's pair name, taken
        split_by_turns([*make_arms(["ppo"], ["off"]), Arm("ppo_off")], (1,))
    # every evaluation runs K_max programs per start prompt: K_max / K episodes of K turns
    assert [eval_draws(k, (1, 3)) for k in (1, 3)] == [3, 1] and eval_draws(1, ()) == 1
    assert eval_draws(2, (4, 2, 1)) == 2


def test_the_before_rl_evaluation_is_cached_once_per_turns_value(tmp_path):
    assert before_path(tmp_path, None).name == "before.json" and before_path(tmp_path, 3).name == "before_t3.json"
    names = ["a_t1", "a_t3"]
    for name in names:
        (tmp_path / "arms" / name).mkdir(parents=True)
        (tmp_path / "arms" / name / "after.json").write_text("{}")
    (tmp_path / "before_t1.json").write_text("{}")
    assert work_left(tmp_path, names, (1, 3))  # before_t3.json missing: this process measures
    (tmp_path / "before_t3.json").write_text("{}")
    assert not work_left(tmp_path, names, (1, 3)) and work_left(tmp_path, names)  # without --turns: before.json


def _records(valid: list[bool], scores: list[float | None], durations: list[float]) -> list[dict]:
    return [{"code": LOGREG, "valid": v, "score": s, "reward": s if v else -10.0, "duration_s": d}
            for v, s, d in zip(valid, scores, durations, strict=True)]  # fmt: skip


def _evaluation(scores: list[float | None], turns: int, draws: int, by: list[float], programs: int) -> dict:
    """evaluate()'s output for n start prompts handing in programs of these scores (None: invalid), pizza (AUC)."""
    valid = [s is not None for s in scores]
    scratch = summarize(scores, [s if s is not None else -10.0 for s in scores], False, PIZZA)
    scratch["records"] = _records(valid, scores, [2.0] * len(scores))
    out = {"task": PIZZA, "scratch": scratch, "turns": turns, "draws": draws}
    all_records = _records([True] * programs, [0.5] * programs, [1.0] * programs)
    all_records[-1]["code"] = None  # a response without code: no program ran
    durations = [1.0 + k for k in range(len(by))]
    if draws > 1:
        out["draw_samples"] = {"valid_fraction_by_draw": by, "duration_s_by_draw": durations, "records": all_records,
                               "best_draw_private": {"valid_fraction": 0.75, "mean": 0.7}}  # fmt: skip
    if turns > 1:
        out["episodes"] = {"valid_fraction_by_turn": by, "duration_s_by_turn": durations, "records": all_records,
                           "episodes_reaching_turn": [len(scores)] * len(by), "first_turn": {"valid_fraction": 0.25},
                           "best_turn_private": {"valid_fraction": 1.0, "mean": 0.8}}  # fmt: skip
    return out


def _summary() -> dict:
    resample = [0.6, None, None, 0.55]  # one turn, best of 3 draws: 2 of 4 start prompts handed in valid
    revise = [0.7, 0.65, 0.62, None]  # 3 turns: 3 of 4
    arms = {}
    for name, scores, turns, draws, by in (("ppo_t1", resample, 1, 3, [0.5, 0.25, 0.25]),
                                           ("ppo_t3", revise, 3, 1, [0.25, 0.5, 0.75])):  # fmt: skip
        e = eval_summary(_evaluation(scores, turns, draws, by, 12), PIZZA)
        arms[name] = {"before": e, "after": e, "stats": {"steps_per_hour": 40.0 if turns == 1 else 20.0}}
    return {"task": PIZZA, "turns": [1, 3], "scale": {"steps": 4, "eval_samples": 4}, "arms": arms,
            "turns_contrasts": revision_contrasts(arms, (1, 3), lower_is_better=False)}  # fmt: skip


def test_the_summary_of_an_episode_evaluation_and_the_contrast_by_its_test():
    s = _summary()
    t1, t3 = s["arms"]["ppo_t1"]["after"], s["arms"]["ppo_t3"]["after"]
    ep = t1["episodes"]
    assert (ep["turns"], ep["draws"], ep["programs_run"]) == (1, 3, 11)  # 12 responses, one without code
    assert ep["valid_share"] == 0.5 and ep["valid_share_se"] == pytest.approx(np.sqrt(0.25 / 4))
    assert ep["by_draw"] == {"valid_fraction": [0.5, 0.25, 0.25], "duration_s": [1.0, 2.0, 3.0]} and not ep["by_turn"]
    assert t3["episodes"]["by_turn"]["reached"] == [4, 4, 4] and t3["episodes"]["first_turn_valid"] == 0.25
    assert t3["episodes"]["best_private"] == {"valid_share": 1.0, "mean_score": 0.8}  # analysis only
    assert eval_summary({"scratch": t1_scratch_only()}, PIZZA).get("episodes") is None  # one turn, one draw: as before
    [(key, c)] = s["turns_contrasts"].items()
    assert key == "ppo_t3 vs ppo_t1" and c["reference"] == "ppo_t1" and c["turns"] == 3
    v = c["after"]["valid_share"]  # 3 of 4 start prompts handed in valid against 2 of 4: Fisher's exact test
    assert v["diff"] == pytest.approx(0.25) and v["test"] == "fisher" and (v["n_a"], v["n_b"]) == (4, 4)
    assert v["p"] == pytest.approx(stats.fisher_exact([[3, 1], [2, 2]]).pvalue)
    m = c["after"]["mean_score"]  # AUC: higher is better, so positive = revising better; Welch over the valid ones
    assert m["diff"] == pytest.approx(np.mean([0.7, 0.65, 0.62]) - 0.575) and m["test"] == "welch"
    ref = stats.ttest_ind_from_stats(t3["mean_score"], t3["se_score"] * np.sqrt(3), 3,
                                     t1["mean_score"], t1["se_score"] * np.sqrt(2), 2, equal_var=False)  # fmt: skip
    assert m["p"] == pytest.approx(ref.pvalue)
    ts = c["before"]["task_score"]
    assert ts["diff"] == pytest.approx(t3["task_score_mean"] - t1["task_score_mean"]) and ts["test"] == "welch"
    # lower is better (log loss): the mean score's difference is negated, so positive still means revising better
    flipped = revision_contrasts(s["arms"], (1, 3), lower_is_better=True)["ppo_t3 vs ppo_t1"]["after"]["mean_score"]
    assert flipped["diff"] == pytest.approx(-m["diff"]) and flipped["p"] == pytest.approx(m["p"])
    # arms without a reference of the smallest K get no contrast
    assert revision_contrasts({"a_t3": s["arms"]["ppo_t3"]}, (1, 3), False) == {}


def t1_scratch_only() -> dict:
    scratch = summarize([0.6, None], [0.6, -10.0], False, PIZZA)
    scratch["records"] = _records([True, False], [0.6, None], [1.0, 1.0])
    return scratch


def test_the_report_section_and_the_readme_blocks_from_a_hand_made_summary():
    s = _summary()
    text = "\n".join(revision_lines(s))
    assert "Revising against resampling (--turns=1,3): every evaluation runs 3 programs per start prompt" in text
    assert "| ppo_t1 | before | 1 × 3 | 11 | 0.500 ± 0.250 |" in text.replace("`", "")
    assert "| draw: 0.50 / 0.25 / 0.25 | draw: 1.0 / 2.0 / 3.0 |" in text
    assert "| 0.6567 ± 0.0233 | 0.7000 | 0.8000 |" in text  # the 3-turn arm's best turn by the private score: 0.8
    assert "| turn: 0.25 / 0.50 / 0.75 | turn: 1.0 / 2.0 / 3.0 | 20.0 |" in text
    fisher = stats.fisher_exact([[3, 1], [2, 2]]).pvalue
    line = f"- ppo_t3 minus ppo_t1, after RL, n = 4 start prompts: valid hand-ins +0.250 (Fisher p = {fisher:.2g}, "
    assert line + "within noise); task score" in text
    assert revision_lines({k: v for k, v in s.items() if k != "turns"}) == []  # a run without --turns: no section
    table = render_turns_table(s, s)
    assert table.count(f"| {PIZZA} | `ppo_t1` | before | 1 × 3 | 11 |") == 2 and "|  | `ppo_t3` | after |" in table
    contrasts = render_turns_contrasts(s)
    c = s["turns_contrasts"]["ppo_t3 vs ppo_t1"]["after"]
    cells = [f"{signed(c[k]['diff'], d)} ({'Fisher' if c[k]['test'] == 'fisher' else 'Welch'} p = {c[k]['p']:.2g})"
             for k, d in (("valid_share", 3), ("task_score", 3), ("mean_score", 4), ("any_medal", 3))]  # fmt: skip
    assert f"| {PIZZA} | `ppo_t3` − `ppo_t1` | after | 4 | {' | '.join(cells)} |" in contrasts
    assert contrasts.endswith("| none |")  # 4 start prompts: nothing shows beyond noise


def test_a_before_only_summary_has_the_before_rl_contrast_report_and_tables(tmp_path):
    """--before_only: each arm holds its before-RL evaluation alone (no arm trained); the contrast, the report and
    the docs tables give before RL only, and the run measures until the before-RL evaluations are cached."""
    full = _summary()
    arms = {name: {"before": arm["before"], "overrides": {}} for name, arm in full["arms"].items()}
    s = {"task": PIZZA, "before_only": True, "turns": [1, 3], "scale": {"steps": 4, "eval_samples": 4}, "arms": arms,
         "turns_contrasts": revision_contrasts(arms, (1, 3), lower_is_better=False)}  # fmt: skip
    [c] = s["turns_contrasts"].values()
    assert (
        set(c) >= {"before"}
        and "after" not in c
        and c["before"] == full["turns_contrasts"]["ppo_t3 vs ppo_t1"]["before"]
    )
    report = write_report(s, tmp_path).read_text()
    assert report.startswith(f"# Before RL: {PIZZA}") and "after RL" not in report
    assert "- ppo_t3 minus ppo_t1, before RL, n = 4 start prompts: valid hand-ins +0.250" in report
    table = render_turns_table(s)
    assert "| before |" in table and "| after |" not in table
    assert "| before |" in render_turns_contrasts(s) and "| after |" not in render_turns_contrasts(s)
    assert work_left(tmp_path, [], (1, 3))  # no arm to train: only the before-RL evaluations are measured
    for k in (1, 3):
        (tmp_path / f"before_t{k}.json").write_text("{}")
    assert not work_left(tmp_path, [], (1, 3))
