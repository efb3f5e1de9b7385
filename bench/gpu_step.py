"""The paper's PPO update (or another objective's: --algorithm grpo builds no critic) and sampler decode at 3B
shape on an accelerator, against the plan's projection.

    python bench/gpu_step.py                          # GPU/TPU: Qwen2.5-3B shape, bf16, all devices (fsdp)
    python bench/gpu_step.py --shape tiny             # any machine (CPU: this is the default, so it cannot rot)
    python bench/gpu_step.py --batch 64 --seq 2048 --micro 8 --decode_batch 64 --decode_tokens 256
    python bench/gpu_step.py --algorithm grpo --group 4   # the critic-free update, groups of 4
    python bench/gpu_step.py --shape qwen0.5b --lora_rank 16 --out docs/results/qwen-gpu.jsonl   # :qwen's update

A lent GPU's few minutes (issue 45): `--shape qwen0.5b --lora_rank 16` then `--shape 3b --lora_rank 16`, each with
`--out docs/results/qwen-gpu.jsonl` (weights cannot travel to it: random weights at the real shapes; the
`:qwen` configs train LoRA rank 16 adapters over a frozen base).

Measures one PPO update (reference and critic forwards, policy and critic forward + backward, AdamW; the
learner exactly as a run builds it) in tokens/s and MFU against the devices' dense bf16 peak, and the JAX
sampler's decode in tokens/s. The peer measured in the same run is the plan (`mle_jax.plan`): the update's
FLOPs counted from the same traced program, and its projected step time at the MFU given here; the ratio
measured / projected says how far the plan's assumption is from this device.
"""

from __future__ import annotations

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
from mle_jax.infra.sharding import MeshSettings, make_mesh, put_batch  # noqa: E402
from mle_jax.models.lora import LoraSettings  # noqa: E402
from mle_jax.models.qwen2 import Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from mle_jax.models.value import Qwen2ValueModel  # noqa: E402
from mle_jax.planner.counting import matmul_flops  # noqa: E402
from mle_jax.planner.targets import GPU_TARGETS, TPU_CHIPS  # noqa: E402
from mle_jax.reporting import provenance  # noqa: E402
from mle_jax.rl import objectives  # noqa: E402
from mle_jax.rl.batch import RolloutBatch  # noqa: E402
from mle_jax.rl.learner import Learner  # noqa: E402
from mle_jax.rl.settings import (
    LearnerSettings,  # noqa: E402
    PPOSettings,  # noqa: E402
)
from mle_jax.rl.update import BATCH_KEYS
from mle_jax.sampling.jax_sampler import JaxSampler  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_enum("shape", "auto", ["auto", "3b", "qwen0.5b", "tiny"], "auto: 3b on an accelerator, tiny on CPU")
flags.DEFINE_integer("batch", 0, "samples per update (0: 8 x devices at 3b, 8 tiny)")
flags.DEFINE_integer("seq", 0, "tokens per sample, prompt + response (0: 2048 at 3b, 256 tiny)")
flags.DEFINE_integer("micro", 0, "micro-batch (0: the number of devices at 3b, 4 tiny)")
flags.DEFINE_integer("decode_batch", 0, "rows decoded together (0: 64 at 3b, 8 tiny)")
flags.DEFINE_integer("decode_tokens", 0, "new tokens per row (0: 256 at 3b, 32 tiny)")
flags.DEFINE_float("mfu", 0.4, "the MFU the plan assumes (configs' default in mle_jax.plan)")
flags.DEFINE_float("peak_tflops", 0.0, "dense bf16 peak per device (0: from the device kind; CPU has none)")
flags.DEFINE_integer("reps", 3, "timed updates after the compile")
flags.DEFINE_enum("algorithm", "ppo", list(objectives.OBJECTIVES), "config.learner.algorithm of the update")
flags.DEFINE_integer("group", 1, "samples per group (group ids of the batch; the group objectives compare in them)")
flags.DEFINE_integer("lora_rank", 0, "model.lora.rank of the update (0: every weight trained; :qwen trains rank 16)")
flags.DEFINE_string("out", "", "append the measurement as one JSON line (with the command, date and device) here")


def device_peak_tflops(kind: str) -> float:
    """Dense bf16 peak of a device kind ('NVIDIA A100-SXM4-40GB', 'TPU v5p', ...); 0 when unknown."""
    for target in GPU_TARGETS.values():
        if target.name.split()[1].split("-")[0] in kind:
            return target.peak_bf16_tflops
    for chip in TPU_CHIPS.values():
        if chip.device_kind == kind:  # "TPU v5 lite" is v5e, "TPU v5" v5p
            return chip.peak_bf16_tflops
    return 0.0


def model_config(shape: str) -> tuple[Qwen2Config, jnp.dtype]:
    if shape == "3b":
        return Qwen2Config.from_model_config(base.qwen25_3b_model()), jnp.bfloat16
    if shape == "qwen0.5b":  # Qwen2.5(-Coder)-0.5B's shape, bf16 on an accelerator
        return Qwen2Config.from_model_config(base.qwen_coder_05b_model()), jnp.bfloat16
    return Qwen2Config.from_model_config(base.tiny_model()), jnp.float32


def main(argv) -> None:
    del argv
    n = jax.device_count()
    accel = jax.default_backend() != "cpu"
    shape = FLAGS.shape if FLAGS.shape != "auto" else ("3b" if accel else "tiny")
    big = shape != "tiny"
    batch = FLAGS.batch or (8 * n if big else 8)
    seq = FLAGS.seq or (2048 if big else 256)
    micro = FLAGS.micro or (n if big else 4)
    dec_batch = FLAGS.decode_batch or (64 if big else 8)
    dec_tokens = FLAGS.decode_tokens or (256 if big else 32)
    cfg, dtype = model_config(shape)
    kind = jax.devices()[0].device_kind
    peak = FLAGS.peak_tflops or device_peak_tflops(kind)

    policy = Qwen2ForCausalLM(cfg, nnx.Rngs(0), dtype=dtype, param_dtype=dtype)
    critic = objectives.has_critic(FLAGS.algorithm)
    value = Qwen2ValueModel.from_policy(policy, rngs=nnx.Rngs(1)) if critic else None
    settings = LearnerSettings(
        algorithm=FLAGS.algorithm,
        ppo=PPOSettings(mini_batch_size=batch, micro_batch_size=micro, seq_bucket=0, temperature=0.7),
        optim=OptimSettings(master_dtype="float32"),
        lora=LoraSettings(rank=FLAGS.lora_rank),
    )
    learner = Learner(settings, policy, value, make_mesh(MeshSettings(data=1, fsdp=-1, tensor=1)))
    rollout = RolloutBatch.random(batch, seq // 2, seq - seq // 2, cfg.vocab_size, group=FLAGS.group)
    arrays = put_batch({k: getattr(rollout, k) for k in BATCH_KEYS}, learner.mesh)
    program = learner.program
    flops = matmul_flops(program.fn.trace(learner.state, learner.reference, arrays).jaxpr.jaxpr)

    start = time.perf_counter()
    learner.update(rollout)  # compile + first step
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(FLAGS.reps):
        start = time.perf_counter()
        learner.update(rollout)
        times.append(time.perf_counter() - start)
    step_s = float(np.median(times))
    tokens = batch * seq

    # a run's sampler settings at their defaults (JaxSampler.for_run), as a config gives them
    sampler = JaxSampler.for_run(None, learner.policy_model(), eos_ids=[], min_new_bucket=dec_tokens)
    prompts = [list(range(1, 1 + seq // 2)) for _ in range(dec_batch)]
    sampler.generate(prompts, temperature=0.7, max_tokens=dec_tokens, seed=0)  # compile
    start = time.perf_counter()
    out = sampler.generate(prompts, temperature=0.7, max_tokens=dec_tokens, seed=1)
    decode_s = time.perf_counter() - start
    new_tokens = sum(len(c.token_ids) for c in out)

    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(policy, nnx.Param)))
    print(f"device: {kind} x{n}; model: {shape} ({n_params / 1e9:.3f} B params, {cfg.num_hidden_layers} layers, "
          f"{jnp.dtype(dtype).name}); batch {batch} x {seq} tokens, micro-batch {micro}")  # fmt: skip
    with_critic = "with" if critic else "no"
    print(f"{FLAGS.algorithm} update ({with_critic} critic): compile+first {compile_s:.1f} s, step {step_s:.3f} s, "
          f"{tokens / step_s:.0f} tokens/s, {flops:.3e} FLOPs/step")  # fmt: skip
    if peak:
        mfu = flops / step_s / (n * peak * 1e12)
        projected = flops / (n * peak * 1e12 * FLAGS.mfu)
        print(f"MFU {mfu:.3f} of {peak} TFLOP/s bf16 x{n}; plan's projection at MFU {FLAGS.mfu}: {projected:.3f} s;"
              f" ratio measured / projected step time: {step_s / projected:.2f}")  # fmt: skip
    else:
        print(f"no bf16 peak for {kind}: MFU not defined ({flops / step_s / 1e9:.1f} GFLOP/s achieved)")
    print(f"decode: {dec_batch} rows x {dec_tokens} new tokens after {seq // 2}-token prompts in {decode_s:.2f} s: "
          f"{new_tokens / decode_s:.0f} tokens/s")  # fmt: skip
    print(f"ratio update tokens/s / decode tokens/s: {(tokens / step_s) / (new_tokens / decode_s):.2f}")
    if FLAGS.out:
        record = {
            "device": kind, "devices": n, "shape": shape, "params_b": round(n_params / 1e9, 3),
            "dtype": jnp.dtype(dtype).name, "algorithm": FLAGS.algorithm, "lora_rank": FLAGS.lora_rank,
            "batch": batch, "seq": seq, "micro": micro, "compile_s": round(compile_s, 1), "step_s": round(step_s, 4),
            "update_tokens_per_s": round(tokens / step_s, 1), "flops_per_step": flops,
            "mfu": round(flops / step_s / (n * peak * 1e12), 4) if peak else None, "peak_tflops": peak or None,
            "decode_batch": dec_batch, "decode_tokens": dec_tokens,
            "decode_tokens_per_s": round(new_tokens / decode_s, 1),
        }  # fmt: skip
        provenance.append_jsonl(Path(FLAGS.out), record)


if __name__ == "__main__":
    app.run(main)
