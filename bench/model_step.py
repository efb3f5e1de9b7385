"""Train-step throughput on CPU: our jitted Flax Qwen2 vs transformers' torch Qwen2, same config.

One step = forward + backward of the next-token cross entropy (gradients of every weight; no
optimizer). Steps alternate between the two so both see the same machine load. Prints tokens/s of
each and the ratio ours / torch (goal >= 1.0).

    .venv/bin/python bench/model_step.py [--batch 4 --seq 512 --steps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers
from flax import nnx
from rich.console import Console
from rich.progress import track

from mle_jax.models import hf

CONFIG = dict(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1376,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    console = Console()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tm = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**CONFIG)).float().train()
    with tempfile.TemporaryDirectory() as d:
        tm.save_pretrained(d)
        ours = hf.from_pretrained(d)  # same weights
    tokens = np.random.RandomState(0).randint(0, CONFIG["vocab_size"], (args.batch, args.seq))
    t_tokens = torch.from_numpy(tokens).long()
    j_tokens = jnp.asarray(tokens, jnp.int32)
    graphdef, params = nnx.split(ours)

    @jax.jit
    def jax_step(params, tokens):
        def loss_fn(params):
            logits = nnx.merge(graphdef, params)(tokens)
            return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:]).mean()

        return jax.value_and_grad(loss_fn)(params)

    def torch_step():
        tm.zero_grad(set_to_none=True)
        loss = tm(t_tokens, labels=t_tokens).loss
        loss.backward()
        return float(loss.detach())

    t0 = time.perf_counter()
    loss_j, _ = jax.block_until_ready(jax_step(params, j_tokens))
    compile_s = time.perf_counter() - t0
    loss_t = torch_step()
    console.print(f"loss ours {float(loss_j):.5f}  torch {loss_t:.5f}  (first jax call {compile_s:.1f}s)")
    times_j, times_t = [], []
    for _ in track(range(args.steps), description="alternating train steps", console=console):
        t0 = time.perf_counter()
        jax.block_until_ready(jax_step(params, j_tokens))
        times_j.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        torch_step()
        times_t.append(time.perf_counter() - t0)
    n = args.batch * args.seq
    tps_j, tps_t = n / statistics.median(times_j), n / statistics.median(times_t)
    console.print(
        f"train step  B={args.batch} T={args.seq} layers={CONFIG['num_hidden_layers']}"
        f" hidden={CONFIG['hidden_size']}  cores={os.cpu_count()}"
    )
    console.print(f"  ours (jax jit) : {tps_j:9.1f} tokens/s  (median of {args.steps})")
    console.print(f"  torch          : {tps_t:9.1f} tokens/s")
    console.print(f"  ratio ours/torch = {tps_j / tps_t:.2f}  (goal >= 1.0)")


if __name__ == "__main__":
    main()
