"""PPO update throughput vs a plain supervised (cross-entropy) step of the same model, batch and device.

The PPO update does a reference forward, a critic forward, then policy and critic forward+backward
(plus GAE and the losses); the supervised step is one policy forward+backward and an AdamW step.
Both see B x T tokens per call. Prints tokens/s of each and their ratio (the PPO overhead).

    python bench/ppo_step.py                 # tiny_model() from configs/base.py on CPU
    python bench/ppo_step.py --batch 16 --prompt_len 128 --response_len 128 --reps 5
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mle_jax.infra.sharding import MeshSettings, make_mesh  # noqa: E402
from mle_jax.models.qwen2 import Qwen2ForCausalLM  # noqa: E402
from mle_jax.models.settings import ModelSettings  # noqa: E402
from mle_jax.models.value import Qwen2ValueModel  # noqa: E402
from mle_jax.rl.batch import RolloutBatch  # noqa: E402
from mle_jax.rl.learner import Learner  # noqa: E402
from mle_jax.rl.settings import (
    LearnerSettings,  # noqa: E402
    PPOSettings,  # noqa: E402
)

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 16, "B: samples per update")
flags.DEFINE_integer("prompt_len", 128, "prompt tokens per sample")
flags.DEFINE_integer("response_len", 128, "response tokens per sample")
flags.DEFINE_integer("micro_batch", 8, "micro-batch size (both steps)")
flags.DEFINE_integer("reps", 5, "timed calls of each (alternating) after one warm-up (compile) call")


def supervised_step_fn(model: nnx.Module, tx: optax.GradientTransformation, micro: int):
    """Jitted (params, opt_state, tokens, mask) -> (params, opt_state, loss): next-token CE, accumulated
    over micro-batches like the learner does."""
    graph, params = nnx.split(model, nnx.Param)

    def loss_fn(p, tokens, mask):
        logits = nnx.merge(graph, p)(tokens, attention_mask=mask)
        logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
        nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        m = mask[:, 1:].astype(jnp.float32)
        return jnp.sum(nll * m) / jnp.sum(m)

    @jax.jit
    def step(p, opt_state, tokens, mask):
        n = tokens.shape[0] // micro
        toks, masks = tokens.reshape(n, micro, -1), mask.reshape(n, micro, -1)

        def acc(g, xs):
            loss, grads = jax.value_and_grad(loss_fn)(p, *xs)
            return jax.tree.map(jnp.add, g, grads), loss

        grads, losses = jax.lax.scan(acc, jax.tree.map(jnp.zeros_like, p), (toks, masks))
        grads = jax.tree.map(lambda g: g / n, grads)
        updates, opt_state = tx.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state, jnp.mean(losses)

    return params, step


def interleaved_medians(fns: list, reps: int) -> list[float]:
    """Median seconds per call of each fn, calls alternating so load changes on a shared machine hit both."""
    for fn in fns:
        fn()  # compile
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, t in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            t.append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def main(argv) -> None:
    del argv
    settings = LearnerSettings(
        ppo=PPOSettings(mini_batch_size=FLAGS.batch, micro_batch_size=FLAGS.micro_batch, seq_bucket=0, temperature=0.7)
    )
    mc = ModelSettings().architecture()  # configs/base.py tiny_model()
    batch = RolloutBatch.random(FLAGS.batch, FLAGS.prompt_len, FLAGS.response_len, mc.vocab_size)
    tokens = batch.batch_size * batch.seq_len

    policy = Qwen2ForCausalLM(mc, rngs=nnx.Rngs(0))
    learner = Learner(settings, policy, Qwen2ValueModel(mc, rngs=nnx.Rngs(1)), make_mesh(MeshSettings(1, 1, 1)))

    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(1e-5))
    sft_model = Qwen2ForCausalLM(mc, rngs=nnx.Rngs(0))
    params, step = supervised_step_fn(sft_model, tx, FLAGS.micro_batch)
    state = {"p": params, "o": tx.init(params)}
    tok, mask = jnp.asarray(batch.tokens), jnp.asarray(batch.attention_mask)

    def sft():
        state["p"], state["o"], loss = step(state["p"], state["o"], tok, mask)
        jax.block_until_ready(loss)

    ppo_s, sft_s = interleaved_medians([lambda: learner.update(batch), sft], FLAGS.reps)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}; model: tiny Qwen2 "
          f"({n_params / 1e6:.2f} M params, {mc.num_hidden_layers} layers, vocab {mc.vocab_size}); "
          f"batch {batch.batch_size} x {batch.seq_len} tokens, micro-batch {FLAGS.micro_batch}")  # fmt: skip
    print(f"PPO update (ref fwd + critic fwd + policy/critic fwd+bwd): {ppo_s * 1e3:8.1f} ms  "
          f"{tokens / ppo_s:10.0f} tokens/s")  # fmt: skip
    print(f"supervised CE step (policy fwd+bwd):                      {sft_s * 1e3:8.1f} ms  "
          f"{tokens / sft_s:10.0f} tokens/s")  # fmt: skip
    print(f"ratio PPO / supervised throughput: {sft_s / ppo_s:.3f} (PPO costs {ppo_s / sft_s:.2f}x per token)")


if __name__ == "__main__":
    app.run(main)
