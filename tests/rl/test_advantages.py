"""group_advantages against an independent reference: plain Python over each group's members, in float64."""

from __future__ import annotations

import statistics

import jax
import numpy as np
import pytest

from mle_jax.rl.advantages import ESTIMATORS, group_advantages


def reference(rewards: list[float], groups: list[int], estimator: str, eps: float = 1e-6) -> list[float]:
    """Each sample against the other members of its group, one sample at a time."""
    out = []
    for i, (r, g) in enumerate(zip(rewards, groups, strict=True)):
        members = [rewards[j] for j in range(len(rewards)) if groups[j] == g]
        others = [rewards[j] for j in range(len(rewards)) if groups[j] == g and j != i]
        if not others:
            out.append(0.0)
        elif estimator == "grpo":
            out.append((r - statistics.fmean(members)) / (statistics.stdev(members) + eps))
        elif estimator == "dr_grpo":
            out.append(r - statistics.fmean(members))
        else:
            out.append(r - statistics.fmean(others))
    return out


def random_groups(seed: int) -> tuple[list[float], list[int]]:
    """Uneven groups (sizes 1 to 6, singletons among them) under arbitrary ids, shuffled so that no group is
    contiguous; rewards mix the -10 failure reward with scores in [-1, 1] and small progress rewards, and some
    groups have no spread at all (every member failed, or the same score)."""
    rng = np.random.default_rng(seed)
    rewards, groups = [], []
    ids = rng.choice(np.arange(-1000, 1000), size=12, replace=False)
    for k, gid in enumerate(ids):
        size = int(rng.integers(1, 7))
        if k % 4 == 0:  # no spread
            members = [float(rng.choice([-10.0, 0.37]))] * size
        else:
            members = [float(rng.choice([-10.0, rng.uniform(-1, 1), 0.1 * rng.integers(0, 8)])) for _ in range(size)]
        rewards += members
        groups += [int(gid)] * size
    order = rng.permutation(len(rewards))
    return [rewards[i] for i in order], [groups[i] for i in order]


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("seed", range(4))
def test_group_advantages_equal_the_reference(estimator, seed):
    rewards, groups = random_groups(seed)
    assert 1 in {groups.count(g) for g in groups} and -10.0 in rewards  # the cases the reference must meet
    got = np.asarray(jax.jit(group_advantages, static_argnums=2)(np.asarray(rewards), np.asarray(groups), estimator))
    assert got.dtype == np.float32 and got.shape == (len(rewards),)
    np.testing.assert_allclose(got, reference(rewards, groups, estimator), rtol=1e-5, atol=1e-5)


def test_singletons_and_groups_without_spread_are_exactly_zero():
    rewards = np.array([-10.0, 0.3, 0.3, 0.3, -10.0, -10.0, 0.7], np.float32)
    groups = np.array([5, 9, 9, 9, 2, 2, 11])  # 5 and 11 alone; 9 and 2 with equal rewards
    for estimator in ESTIMATORS:
        assert np.all(np.asarray(group_advantages(rewards, groups, estimator)) == 0.0), estimator


def test_hand_computed_group_of_three():
    """Group [1, 2, 6] (mean 3, unbiased std sqrt(7)) beside a pair [0, -10] in another id order."""
    rewards = np.array([1.0, 0.0, 2.0, -10.0, 6.0], np.float32)
    groups = np.array([3, 8, 3, 8, 3])
    std = np.sqrt(7.0)
    pair = np.sqrt(50.0) + 1e-6  # [0, -10]: mean -5, unbiased std sqrt(50)
    grpo = [-2 / (std + 1e-6), 5 / pair, -1 / (std + 1e-6), -5 / pair, 3 / (std + 1e-6)]
    np.testing.assert_allclose(group_advantages(rewards, groups, "grpo"), grpo, rtol=1e-6)
    np.testing.assert_allclose(group_advantages(rewards, groups, "dr_grpo"), [-2, 5, -1, -5, 3], rtol=1e-6)
    np.testing.assert_allclose(group_advantages(rewards, groups, "rloo"), [-3, 10, -1.5, -10, 4.5], rtol=1e-6)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="one of"):
        group_advantages(np.zeros(2), np.zeros(2, int), "ppo")
    with pytest.raises(ValueError, match="both be"):
        group_advantages(np.zeros(3), np.zeros(2, int))
