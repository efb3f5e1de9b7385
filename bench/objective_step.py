"""The update of each RL objective on one batch, same model and batch: PPO (policy + critic) against the critic-free
group objectives, in steps/s and peak device memory, with the ratio to PPO measured in the same run.

    PYTHONPATH=. python bench/objective_step.py                 # accelerator: Qwen2.5-3B shape, bf16; CPU: tiny
    PYTHONPATH=. python bench/objective_step.py --algorithms ppo,grpo --batch 8 --seq 2048 --group 4

Needs only JAX, flax, optax, orbax, chex and ml_collections (it runs on a bare GPU image): the learner exactly as a
run builds it (`Learner`, `config.learner.algorithm`), on a random batch whose every position is real.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs import base  # noqa: E402
from mle_jax.infra.optim import OptimSettings  # noqa: E402
from mle_jax.infra.sharding import MeshSettings, make_mesh  # noqa: E402
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from mle_jax.models.value import Qwen2ValueModel  # noqa: E402
from mle_jax.reporting import provenance  # noqa: E402
from mle_jax.rl import objectives  # noqa: E402
from mle_jax.rl.batch import RolloutBatch  # noqa: E402
from mle_jax.rl.learner import Learner  # noqa: E402
from mle_jax.rl.settings import (
    LearnerSettings,  # noqa: E402
    PPOSettings,  # noqa: E402
)

FLAGS = flags.FLAGS
flags.DEFINE_list("algorithms", ["ppo", "grpo"], "objectives to time (the first is the peer of the ratios)")
flags.DEFINE_enum("shape", "auto", ["auto", "3b", "tiny"], "auto: 3b on an accelerator, tiny on CPU")
flags.DEFINE_integer("batch", 8, "samples per update")
flags.DEFINE_integer("seq", 0, "tokens per sample, prompt + response (0: 2048 at 3b, 256 tiny)")
flags.DEFINE_integer("micro", 1, "micro-batch")
flags.DEFINE_integer("group", 4, "samples per group")
flags.DEFINE_integer("reps", 3, "timed updates after the compile")
flags.DEFINE_integer("layers", 0, "keep this many of the shape's layers (0: all; 3B PPO's state exceeds one GPU)")
flags.DEFINE_string("out", "", "also write the figures to this JSON file (with the command and date)")
flags.DEFINE_enum("remat", "", ["", "true", "false"], "model.remat (empty: the shape's; 3b: true)")
flags.DEFINE_enum("remat_policy", "", ["", "full", "dots"], "model.remat_policy (empty: the shape's)")
flags.DEFINE_enum("scan_layers", "", ["", "true", "false"], "model.scan_layers (empty: the shape's; 3b: true)")
flags.DEFINE_enum("fused", "true", ["true", "false"], "ppo.fused_logprobs: the logprobs' hand-written backward")
flags.DEFINE_integer("attn_block", -1, "model.attn_block, training attention's query block (-1: the shape's)")
flags.DEFINE_enum("attention", "", ["", "blocked", "dot_product"], "model.attention (empty: the shape's)")
flags.DEFINE_string("profile", "", "also trace one update into this folder and print its costliest device ops")
flags.DEFINE_integer("logits_chunk", 512, "ppo.logits_chunk: positions of logits at a time (0: all)")
flags.DEFINE_float("peak_tflops", 0.0, "the device's dense bf16 peak (TFLOP/s), for MFU (0: not reported)")
flags.DEFINE_string("only", "", "internal: time this one objective in this process and print its JSON")


def peak_gib() -> float | None:
    stats = jax.devices()[0].memory_stats() or {}
    return stats["peak_bytes_in_use"] / 2**30 if "peak_bytes_in_use" in stats else None


def time_update(algorithm: str, cfg: Qwen2Config, dtype: jnp.dtype, batch: RolloutBatch) -> dict[str, float | None]:
    """Builds the learner of `algorithm` (a critic only where the objective has one) and times its update."""
    policy = Qwen2ForCausalLM(cfg, nnx.Rngs(0), dtype=dtype, param_dtype=dtype)
    value = Qwen2ValueModel.from_policy(policy, rngs=nnx.Rngs(1)) if objectives.has_critic(algorithm) else None
    settings = LearnerSettings(
        algorithm=algorithm,
        ppo=PPOSettings(
            mini_batch_size=batch.batch_size,
            micro_batch_size=FLAGS.micro,
            seq_bucket=0,
            temperature=0.7,
            logits_chunk=FLAGS.logits_chunk,
            fused_logprobs=FLAGS.fused == "true",
        ),
        optim=OptimSettings(master_dtype="float32"),
    )
    params = sum(x.size for x in jax.tree.leaves(nnx.state(policy, nnx.Param)))
    # the critic's matmul weights: its embedding is a lookup, not a GEMM (the policy's is its tied head)
    critic = 0
    if value is not None:
        critic = sum(x.size for x in jax.tree.leaves(nnx.state(value, nnx.Param))) - cfg.vocab_size * cfg.hidden_size
    learner = Learner(settings, policy, value, make_mesh(MeshSettings(data=1, fsdp=-1, tensor=1)))
    del policy, value
    start = time.perf_counter()
    learner.update(batch)  # compile + first step
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(FLAGS.reps):
        start = time.perf_counter()
        learner.update(batch)
        times.append(time.perf_counter() - start)
    step_s = float(np.median(times))
    profile = trace_update(learner, batch, FLAGS.profile) if FLAGS.profile else None
    tokens = batch.batch_size * batch.seq_len
    # the policy's training FLOPs by 6·N·tokens (the critic's, the reference's and PPO's extra passes not counted)
    tflops = 6.0 * params * tokens / step_s / 1e12
    # every pass the update needs, by 2·N·tokens a forward and 4·N·tokens a backward (attention's score FLOPs and
    # remat's recomputation not counted): the reference's forward (the KL) and the policy's forward and backward;
    # with a critic, its forward (the values) and its forward and backward
    model_flops = (2 + 6) * params * tokens + (2 + 6) * critic * tokens
    out = {"compile_s": compile_s, "step_s": step_s, "peak_gib": peak_gib(), "params": int(params),
           "critic_matmul_params": int(critic), "policy_tflops_6n": tflops,
           "model_tflops": model_flops / step_s / 1e12}  # fmt: skip
    if FLAGS.peak_tflops:
        out["mfu_6n"] = tflops / FLAGS.peak_tflops
        out["mfu_model"] = out["model_tflops"] / FLAGS.peak_tflops
    if profile is not None:
        out["profile"] = profile
    return out


def trace_update(learner: Learner, batch: RolloutBatch, folder: str, top: int = 25) -> dict:
    """One more update under `jax.profiler.trace` (a Perfetto JSON beside the TensorBoard trace); returns the device
    ops' time by category and the `top` costliest ops by total time (`op_profile.summarize`)."""
    from mle_jax.infra.op_profile import summarize

    with jax.profiler.trace(folder, create_perfetto_trace=True):
        learner.update(batch)
        jax.effects_barrier()
    traces = sorted(Path(folder).rglob("*perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        return {"error": f"no perfetto trace under {folder}"}
    return summarize(traces[-1], top)


def main(argv) -> None:
    del argv
    accel = jax.default_backend() != "cpu"
    shape = FLAGS.shape if FLAGS.shape != "auto" else ("3b" if accel else "tiny")
    m = base.qwen25_3b_model() if shape == "3b" else base.tiny_model()
    if FLAGS.layers:
        m.num_hidden_layers = FLAGS.layers
    if FLAGS.remat:
        m.remat = FLAGS.remat == "true"
    if FLAGS.remat_policy:
        m.remat_policy = FLAGS.remat_policy
    if FLAGS.scan_layers:
        m.scan_layers = FLAGS.scan_layers == "true"
    if FLAGS.attn_block >= 0:
        m.attn_block = FLAGS.attn_block
    if FLAGS.attention:
        m.attention = FLAGS.attention
    cfg, dtype = Qwen2Config.from_model_config(m), jnp.bfloat16 if shape == "3b" else jnp.float32
    seq = FLAGS.seq or (2048 if shape == "3b" else 256)
    batch = RolloutBatch.random(FLAGS.batch, seq // 2, seq - seq // 2, cfg.vocab_size, group=FLAGS.group)
    if not FLAGS.only:
        print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}; model {shape} ({cfg.num_hidden_layers} "
              f"layers, {jnp.dtype(dtype).name}); batch {FLAGS.batch} x {seq} tokens, micro-batch {FLAGS.micro}, "
              f"groups of {FLAGS.group}", flush=True)  # fmt: skip
    if FLAGS.only:
        print(json.dumps(time_update(FLAGS.only, cfg, dtype, batch)))
        return
    results = {}
    for algorithm in FLAGS.algorithms:  # a process each: its peak device memory is its own
        args = [a for a in sys.argv[1:] if not a.startswith("--algorithms")]
        done = subprocess.run([sys.executable, __file__, *args, f"--only={algorithm}"], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{algorithm}: exit {done.returncode}\n{done.stderr[-3000:]}")
        r = results[algorithm] = json.loads(done.stdout.strip().splitlines()[-1])
        peak = "-" if r["peak_gib"] is None else f"{r['peak_gib']:.1f} GiB"
        mfu = f", MFU {r['mfu_6n']:.1%}; every pass: MFU {r['mfu_model']:.1%}" if "mfu_6n" in r else ""
        print(f"{algorithm}: compile+first {r['compile_s']:.1f} s, step {r['step_s']:.3f} s "
              f"({FLAGS.batch * seq / r['step_s']:.0f} tokens/s, {r['policy_tflops_6n']:.0f} TFLOP/s by "
              f"6·N·tokens{mfu}), "
              f"peak device memory {peak}", flush=True)  # fmt: skip
        if "profile" in r:
            from mle_jax.infra.op_profile import render

            print(render(r["profile"]), flush=True)
    peer = FLAGS.algorithms[0]
    ratios = {a: results[a]["step_s"] / results[peer]["step_s"] for a in FLAGS.algorithms[1:]}
    for algorithm, ratio in ratios.items():
        print(f"ratio {algorithm} / {peer} step time: {ratio:.2f}")
    if FLAGS.out:
        setup = {"device": jax.devices()[0].device_kind, "devices": jax.device_count(), "shape": shape,
                 "layers": cfg.num_hidden_layers, "dtype": jnp.dtype(dtype).name, "batch": FLAGS.batch, "seq": seq,
                 "micro_batch": FLAGS.micro, "group": FLAGS.group, "reps": FLAGS.reps, "remat": bool(m.remat),
                 "remat_policy": m.get("remat_policy", "full"),
                 "scan_layers": bool(m.get("scan_layers", False)), "fused_logprobs": FLAGS.fused == "true",
                 "attn_block": int(m.attn_block), "attention": m.get("attention", "blocked"),
                 "logits_chunk": FLAGS.logits_chunk,
                 "peak_tflops": FLAGS.peak_tflops or None}  # fmt: skip
        provenance.write_json(FLAGS.out, {**setup, "results": results, f"step_time_ratio_to_{peer}": ratios})


if __name__ == "__main__":
    app.run(main)
