"""A few PPO steps on a tiny Qwen2, sampling from the policy itself, raise a toy reward."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mle_jax.rl.batch import RolloutBatch
from mle_jax.rl.learner import Learner
from mle_jax.sampling.jax_sampler import JaxSampler
from tests.rl.tiny import learner_config, make_models, mesh

pytestmark = pytest.mark.model

TARGET = 7
N_PROMPTS, N_SAMPLES, MAX_TOKENS = 4, 4, 8


def target_fraction(completions) -> np.ndarray:
    return np.array([np.mean(c.token_ids == TARGET) for c in completions], np.float32)


def test_ppo_raises_toy_reward():
    cfg = learner_config(mini_batch_size=16, micro_batch_size=8, kl_coef=0.001, entropy_coef=0.0, epochs=4)
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, actor_lr=2e-2, critic_lr=2e-2))
    policy, value = make_models(0)
    learner = Learner(cfg, policy, value, mesh())
    sampler = JaxSampler(learner.policy_model(), eos_ids=[], seed=0, min_prompt_bucket=8, min_new_bucket=8)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 32, size=4).tolist() for _ in range(N_PROMPTS)]
    rewards = []
    for step in range(8):
        comps = sampler.generate(prompts, n=N_SAMPLES, temperature=1.0, max_tokens=MAX_TOKENS)
        r = target_fraction(comps)
        rewards.append(float(r.mean()))
        batch = RolloutBatch.from_sequences(
            [c.prompt_ids for c in comps], [c.token_ids for c in comps], [c.logprobs for c in comps],
            r, np.ones(len(comps)), [c.version for c in comps],
        )  # fmt: skip
        metrics = learner.update(batch)
        assert np.isfinite(metrics["actor/pg_loss"]) and metrics["actor/ratio"] > 0.5
        sampler.sync(learner.policy_state(), version=step + 1)
    final = target_fraction(sampler.generate(prompts, n=16, temperature=1.0, max_tokens=MAX_TOKENS, seed=1))
    initial = rewards[0]
    print("toy reward per step", rewards, "final", final.mean())
    assert initial < 0.15, rewards  # ~1/32 for a random policy
    assert final.mean() > max(0.3, 4 * initial), (rewards, final.mean())
    assert np.mean(rewards[-2:]) > np.mean(rewards[:2]), rewards
