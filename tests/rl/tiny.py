"""The tests' tiny Qwen2 config (`tiny_qwen2`), and the tiny policy/critic, learner configs and random rollout
batches shared by the learner tests."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from mle_jax.infra.optim import OptimSettings
from mle_jax.infra.sharding import MeshSettings, make_mesh
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from mle_jax.models.value import Qwen2ValueModel
from mle_jax.rl.batch import RolloutBatch
from mle_jax.rl.settings import LearnerSettings, PPOSettings

TINY = Qwen2Config(
    vocab_size=32,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=128,
)


def tiny_qwen2(vocab_size: int, **sizes: Any) -> Qwen2Config:
    """The tests' one tiny Qwen2: TINY with the vocabulary of the test's tokenizer, and `sizes` (Qwen2Config
    fields) where a test needs more layers, a longer context or the head shape its numbers were taken with."""
    return dataclasses.replace(TINY, vocab_size=vocab_size, **sizes)


def learner_config(**ppo: Any) -> LearnerSettings:
    """Learner settings with small PPO batches; keyword arguments override PPOSettings fields."""
    small = dict(mini_batch_size=8, micro_batch_size=4, kl_coef=0.05, entropy_coef=0.01, seq_bucket=0, temperature=1.0)
    return LearnerSettings(
        ppo=PPOSettings(**{**small, **ppo}), optim=OptimSettings(actor_lr=1e-3, critic_lr=1e-3), seed=0
    )


def linear_adam(settings: LearnerSettings, lr: float = 0.5) -> LearnerSettings:
    """Adam with eps = 1: its step becomes ~lr * g (not ~lr * sign(g)), so comparing params after an update
    compares gradients, without the sign noise of near-zero gradients."""
    optim = dataclasses.replace(settings.optim, adam_eps=1.0, actor_lr=lr, critic_lr=lr)
    return dataclasses.replace(settings, optim=optim)


def mesh(shape: tuple[int, int, int] = (1, 1, 1), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh of `shape` (default: one device)."""
    return make_mesh(MeshSettings(*shape), devices)


def make_models(seed: int = 0, config: Qwen2Config = TINY) -> tuple[Qwen2ForCausalLM, Qwen2ValueModel]:
    policy = Qwen2ForCausalLM(config, rngs=nnx.Rngs(seed))
    value = Qwen2ValueModel(config, rngs=nnx.Rngs(seed + 1000))
    return policy, value


def random_batch(seed: int, b: int = 8, t: int = 12, vocab: int = 32, equal_durations: bool = False) -> RolloutBatch:
    """Prompts of 2-5 tokens, responses of 1-6 tokens with plausible logprobs, noisy rewards and durations."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(1, vocab, size=rng.integers(2, 6)).tolist() for _ in range(b)]
    responses = [rng.integers(1, vocab, size=rng.integers(1, 7)).tolist() for _ in range(b)]
    logprobs = [(-rng.uniform(2.0, 4.5, size=len(r))).tolist() for r in responses]
    durations = np.full(b, 3.0) if equal_durations else rng.uniform(0.5, 20.0, size=b)
    return RolloutBatch.from_sequences(
        prompts, responses, logprobs, rng.normal(size=b).tolist(), durations.tolist(), [0] * b, pad_to=t
    )


def params_digest(tree: Any) -> str:
    """sha256 over every leaf's bytes (bitwise identity of a pytree)."""
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        h.update(np.ascontiguousarray(np.asarray(jax.device_get(leaf))).tobytes())
    return h.hexdigest()
