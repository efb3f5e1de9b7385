"""The paper's reward table: total failure, failure after each stage, invalid, valid (both directions)."""

from __future__ import annotations

import numpy as np
import pytest

from mle_jax.tasks.graders import GradeResult
from mle_jax.tasks.progress import PROGRESS_PRINTS
from mle_jax.tasks.reward import Reward, RewardSettings, compute_reward, task_scores

INVALID = GradeResult(False, None, "submission has 3 rows, expected 1162")


def test_total_failure():
    assert compute_reward(None, "", lower_is_better=False) == Reward(-10.0, False, None, (), 0)
    assert compute_reward(None, "SyntaxError: invalid syntax", lower_is_better=True).total == -10.0


@pytest.mark.parametrize("stage", range(1, len(PROGRESS_PRINTS) + 1))
def test_failure_after_each_stage(stage):
    reached = PROGRESS_PRINTS[:stage]
    lines = [f"{p} 0.5" if p.endswith(":") else p for p in reached]
    output = "\n".join(lines) + "\nTraceback (most recent call last)"
    r = compute_reward(None, output, lower_is_better=False)
    assert r.prints == reached and r.n_prints == stage and not r.valid and r.score is None
    assert r.total == pytest.approx(-10.0 + 0.1 * stage)


def test_repeats_count_once_and_only_at_line_start():
    output = "loaded data\n" * 50 + "epoch 1 training loss: 0.3\n" + "training loss: 0.2\r" * 3
    output += "note: trained model\n"
    r = compute_reward(None, output, lower_is_better=False)
    assert r.prints == ("loaded data", "training loss:")
    assert r.total == pytest.approx(-9.8)


def test_invalid_submission_gets_partial_credit_only():
    r = compute_reward(INVALID, "\n".join(PROGRESS_PRINTS), lower_is_better=False)
    assert r == Reward(pytest.approx(-9.3), False, None, PROGRESS_PRINTS, 7)


def test_valid_submission_higher_is_better():
    r = compute_reward(GradeResult(True, 0.663, ""), "imported packages\n", lower_is_better=False)
    assert (r.total, r.valid, r.score, r.n_prints) == (0.663, True, 0.663, 1)


def test_valid_submission_lower_is_better_flips_the_sign():
    r = compute_reward(GradeResult(True, 0.124, ""), "\n".join(PROGRESS_PRINTS), lower_is_better=True)
    assert (r.total, r.valid, r.score) == (-0.124, True, 0.124)


def test_values_are_configurable():
    settings = RewardSettings(failure=-1.0, per_print=0.25, valid_floor=2.0)
    r = compute_reward(INVALID, "imported packages\nloaded data\n", False, settings)
    assert r.total == pytest.approx(-0.5)


def test_a_valid_but_terrible_score_still_beats_any_invalid_submission():
    best_invalid = compute_reward(INVALID, "\n".join(PROGRESS_PRINTS), lower_is_better=True).total  # -9.3
    totals = []
    for log_loss in (0.3, 2.0, 7.9, 8.0, 9.0, 12.0, 34.5, 1e6):
        r = compute_reward(GradeResult(True, log_loss, ""), "", lower_is_better=True)
        assert r.valid and r.score == log_loss and r.total > best_invalid
        totals.append(r.total)
    assert totals[:4] == [-0.3, -2.0, -7.9, -8.0]  # every sensible score is the score itself
    assert all(a > b for a, b in zip(totals, totals[1:], strict=False))  # a better submission still earns more
    assert totals[-1] > -9.0
    # higher-is-better metrics that can go very negative (Pearson r cannot; QWK can reach -1) keep their value
    assert compute_reward(GradeResult(True, -0.4, ""), "", lower_is_better=False).total == -0.4


def test_a_floor_below_the_partial_credit_is_refused():
    with pytest.raises(ValueError, match="valid_floor"):
        RewardSettings(valid_floor=-9.0)


def test_task_score_is_minus_ten_or_the_signed_score_without_partial_credit():
    """Fig. 9's number from hand-made rewards: an invalid program with every progress print (reward -9.3) still
    scores -10; a valid log loss is negated (as the reward signs it) but not floored as the reward is."""
    prints = "\n".join(PROGRESS_PRINTS)
    rewards = [
        compute_reward(INVALID, prints, lower_is_better=True),  # partial credit: reward -9.3
        compute_reward(GradeResult(True, 0.45, ""), prints, lower_is_better=True),  # reward -0.45
        compute_reward(GradeResult(True, 12.0, ""), "", lower_is_better=True),  # reward floored to about -8.9
        compute_reward(None, "", lower_is_better=True),
    ]
    valid, scores = [r.valid for r in rewards], [r.score for r in rewards]
    assert rewards[0].total == pytest.approx(-9.3) and rewards[2].total > -9.0
    assert task_scores(valid, scores, True).tolist() == [-10.0, -0.45, -12.0, -10.0]
    # a mix: each sample in its own task's direction; the failure value is the reward's
    out = task_scores(np.array([True, True, False]), np.array([0.62, 0.45, np.nan]), np.array([False, True, False]), -5)
    assert out.shape == (3,) and out.tolist() == [0.62, -0.45, -5.0]
